package air

import (
	"bytes"
	"encoding/json"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// decodeMessage sets *m, a zero message, to what json.Unmarshal of s into it
// leaves, its error ignored. The usual shape of a response message is read
// by fastMessage, in one pass that validates the text as it goes; whatever
// it does not follow exactly goes to encoding/json.
func decodeMessage(s string, m *message) {
	if len(s) == 0 { // not JSON: nothing is set
		return
	}
	if !fastMessage(jsonscan.Bytes(s), m) {
		*m = unmarshalMessage(s)
	}
}

// unmarshalMessage is json.Unmarshal of s into a message, its error
// ignored. (A function of its own, so that the message it hands to
// encoding/json, which escapes, is not the caller's.)
func unmarshalMessage(s string) message {
	var m message
	_ = json.Unmarshal([]byte(s), &m)
	return m
}

// maxDepth is encoding/json's nesting limit: a text whose objects and arrays
// nest deeper is not valid JSON to it.
const maxDepth = 10000

// The members of a message and of a tool call that fastMessage reads, as
// encoding/json names the fields.
var (
	messageFields  = [...]string{"role", "content", "tool_call_id", "tool_calls"}
	toolCallFields = [...]string{"id", "function"}
	functionFields = [...]string{"name", "arguments"}
)

// fastMessage decodes b into *m (zero) as json.Unmarshal does and reports
// true, or reports false, leaving *m in any state, when b is not valid JSON
// or not of the shape it reads:
//   - an object whose keys are ASCII without escapes (a known name in any
//     case is its field, as encoding/json matches them), no field twice;
//   - role and tool_call_id strings or null, content anything (its raw
//     bytes), tool_calls null or an array of objects with id (a string or
//     null) and function (null or an object with name and arguments,
//     strings or null), the same rules for their keys;
//   - unknown members anything.
//
// Anything else (a value of another type, which encoding/json skips with an
// error, a field twice, which it merges into what the first set, a key it
// would fold or unescape, nesting deeper than it accepts, JSON it rejects)
// is encoding/json's to decode. b is only read, and no part of the result
// shares its memory.
func fastMessage(b []byte, m *message) bool {
	// The validation below recurses once per level of nesting: bound the
	// depth first (a valid text nested deeper than maxDepth is longer than
	// 2*maxDepth bytes).
	if len(b) > 2*maxDepth && !shallow(b) {
		return false
	}
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = messageAt(b, i, m)
	return i >= 0 && jsonscan.SkipWS(b, i) == len(b)
}

// messageAt decodes the object opening at b[i] into *m (zero), as
// fastMessage decodes a whole text, and returns the offset after it, or -1
// (then *m is in any state). The caller bounds the nesting (shallow).
func messageAt(b []byte, i int, m *message) int {
	return members(b, i, messageFields[:], func(f, v int) int {
		switch f {
		case 0:
			return str(b, v, &m.Role)
		case 1:
			end, ok := jsonscan.ValidValue(b, v)
			if !ok {
				return -1
			}
			m.Content = append(json.RawMessage(nil), b[v:end]...)
			return end
		case 2:
			return str(b, v, &m.ToolCallID)
		case 3:
			return toolCalls(b, v, &m.ToolCalls)
		}
		return skip(b, v)
	})
}

// toolCalls decodes the tool_calls value at b[i] into *tcs (nil) and returns
// the offset after it, or -1 (see fastMessage).
func toolCalls(b []byte, i int, tcs *[]toolCall) int {
	if end, done := nullOr(b, i, '['); done {
		return end
	}
	*tcs = []toolCall{} // [] decodes to an empty slice, not nil
	i, done := inside(b, i, ']')
	for !done {
		if i >= len(b) || b[i] != '{' {
			return -1
		}
		*tcs = append(*tcs, toolCall{})
		tc := &(*tcs)[len(*tcs)-1]
		i = members(b, i, toolCallFields[:], func(f, v int) int {
			switch f {
			case 0:
				return str(b, v, &tc.ID)
			case 1:
				if end, done := nullOr(b, v, '{'); done {
					return end
				}
				return members(b, v, functionFields[:], func(f, v int) int {
					switch f {
					case 0:
						return str(b, v, &tc.Function.Name)
					case 1:
						return str(b, v, &tc.Function.Arguments)
					}
					return skip(b, v)
				})
			}
			return skip(b, v)
		})
		if i < 0 {
			return -1
		}
		i, done = after(b, i, ']')
	}
	return i
}

// inside returns the offset of the first member or element of the object
// or array opening at b[i] (done false), or the offset after it when it is
// empty (done true).
func inside(b []byte, i int, closer byte) (next int, done bool) {
	i = jsonscan.SkipWS(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, true
	}
	return i, false
}

// after reads what follows a member or an element ending at b[i]: a comma,
// and then it returns the offset of the next one (done false), or closer,
// and then it returns the offset after it (done true); -1 for anything
// else.
func after(b []byte, i int, closer byte) (next int, done bool) {
	i = jsonscan.SkipWS(b, i)
	switch {
	case i >= len(b):
		return -1, true
	case b[i] == closer:
		return i + 1, true
	case b[i] == ',':
		return jsonscan.SkipWS(b, i+1), false
	}
	return -1, true
}

// members walks the object opening at b[i], validating its syntax, and
// calls value for each member with the index in fields of its key (-1 for
// an unknown key) and the offset of its value (not whitespace, maybe past
// the end of b); value returns the offset after the value, or -1 to give
// up. members returns the offset after the object, or -1 when the object is
// malformed, a key is not plain ASCII (see fastMessage), a field comes
// twice or value gave up.
func members(b []byte, i int, fields []string, value func(field, v int) int) int {
	var seen uint32 // fields already read (fields has at most 32 names)
	i, done := inside(b, i, '}')
	for !done {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		end, ok := jsonscan.ValidValue(b, i)
		if !ok {
			return -1
		}
		f, ok := field(b[i+1:end-1], fields)
		if !ok || f >= 0 && seen&(1<<f) != 0 {
			return -1
		}
		if f >= 0 {
			seen |= 1 << f
		}
		i = jsonscan.SkipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return -1
		}
		i = jsonscan.SkipWS(b, i+1)
		if i >= len(b) {
			return -1
		}
		if i = value(f, i); i < 0 {
			return -1
		}
		i, done = after(b, i, '}')
	}
	return i
}

// field returns the index in fields (lowercase names) of the raw key
// (between its quotes), matched as encoding/json matches a key to a field
// when no two fields' names differ only in case: the same name up to the
// case of ASCII letters; -1 for none. ok is false for a key with a
// backslash or a byte that is not ASCII: encoding/json unescapes it, and
// folds the case of Unicode letters too ("ſ" matches "s").
func field(key []byte, fields []string) (f int, ok bool) {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return -1, false
		}
	}
next:
	for f, name := range fields {
		if len(name) != len(key) {
			continue
		}
		for j, c := range key {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != name[j] {
				continue next
			}
		}
		return f, true
	}
	return -1, true
}

// str decodes the string at b[i] into *s and returns the offset after it;
// null leaves *s as it is (as encoding/json does); -1 for anything else or
// a malformed string.
func str(b []byte, i int, s *string) int {
	if end, done := nullOr(b, i, '"'); done {
		return end
	}
	end, ok := jsonscan.ValidValue(b, i)
	if !ok {
		return -1
	}
	*s = unquote(b[i+1 : end-1])
	return end
}

// nullOr is for a value that is null or starts with first: at null it
// returns the offset after it (done true), at first done false, and at
// anything else -1 (done true).
func nullOr(b []byte, i int, first byte) (end int, done bool) {
	switch b[i] {
	case first:
		return 0, false
	case 'n':
		if end, ok := jsonscan.ValidValue(b, i); ok {
			return end, true
		}
	}
	return -1, true
}

// skip validates the value at b[i] and returns the offset after it, or -1.
func skip(b []byte, i int) int {
	if end, ok := jsonscan.ValidValue(b, i); ok {
		return end
	}
	return -1
}

// unquote returns the text of a valid JSON string's raw contents as
// encoding/json decodes it: escapes decoded, a \u escape of a lone or
// mismatched surrogate and each byte of invalid UTF-8 as U+FFFD.
func unquote(raw []byte) string {
	if string(raw) == "assistant" { // the usual role, without an allocation
		return "assistant"
	}
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return string(raw)
	}
	out := make([]byte, 0, len(raw)+utf8.UTFMax)
	for r := 0; r < len(raw); {
		switch c := raw[r]; {
		case c == '\\': // complete: the string is valid
			e := raw[r+1]
			r += 2
			switch e {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				rr := hex4(raw[r:])
				r += 4
				if utf16.IsSurrogate(rr) {
					if len(raw)-r >= 6 && raw[r] == '\\' && raw[r+1] == 'u' {
						if dec := utf16.DecodeRune(rr, hex4(raw[r+2:])); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							r += 6
							break
						}
					}
					rr = utf8.RuneError
				}
				out = utf8.AppendRune(out, rr)
			default: // '"', '\\', '/'
				out = append(out, e)
			}
		case c < utf8.RuneSelf:
			out = append(out, c)
			r++
		default:
			rr, size := utf8.DecodeRune(raw[r:])
			out = utf8.AppendRune(out, rr)
			r += size
		}
	}
	return jsonscan.String(out) // out is not changed again
}

// hex4 returns the value of the four hex digits starting b, or -1 when they
// are not four hex digits.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// shallow reports whether b's objects and arrays, counted outside strings
// (as jsonscan.SkipString delimits them), nest at most maxDepth deep and
// never close more than they opened. When it holds, validating b recurses at
// most maxDepth deep, however malformed b is.
func shallow(b []byte) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			j := jsonscan.SkipString(b, i)
			if j < 0 {
				return true // unterminated: nothing nests after it
			}
			i = j - 1
		case '{', '[':
			if depth++; depth > maxDepth {
				return false
			}
		case '}', ']':
			if depth--; depth < 0 {
				return false
			}
		}
	}
	return true
}
