// Raw JSON walking for the Assembler: member and element walkers that do not
// unescape strings, value readers (token ids, numbers, strings) and the
// zero-copy string views they rely on.

package capture

import (
	"math"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// appendIDs appends the token ids of a JSON array. Elements that are not
// numbers are skipped; numbers are clamped to [0, 2^32-1].
func appendIDs(dst []uint32, arr gjson.Result) []uint32 {
	// Fast path: plain non-negative integers, the shape engines send.
	raw := arr.Raw
	start := len(dst)
	var v uint64
	digits := 0
	for i := 1; i < len(raw); i++ {
		ch := raw[i]
		switch {
		case ch >= '0' && ch <= '9':
			v = v*10 + uint64(ch-'0')
			digits++
			if digits > 10 {
				goto slow
			}
		case ch == ',' || ch == ']':
			if digits == 0 {
				if ch == ']' && len(dst) == start {
					continue // empty array
				}
				goto slow
			}
			if v > math.MaxUint32 {
				goto slow
			}
			dst = append(dst, uint32(v))
			v, digits = 0, 0
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r':
			if digits > 0 {
				goto slow // "1 2" cannot happen in valid JSON, but be careful
			}
		default:
			goto slow
		}
	}
	return dst
slow:
	dst = dst[:start]
	eachElem(arr.Raw, func(e gjson.Result) bool {
		if e.Type == gjson.Number {
			dst = append(dst, clampU32(e))
		}
		return true
	})
	return dst
}

// clampU32 converts a JSON number to uint32, clamping; 0 for anything else.
func clampU32(r gjson.Result) uint32 {
	n := numOf(r)
	if !(n > 0) {
		return 0
	}
	if n >= math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}

// sat32 clamps n to uint32.
func sat32(n uint64) uint32 { return uint32(min(n, math.MaxUint32)) }

// appendInterior appends the inside of a raw JSON string token (its escapes
// kept as they are).
func appendInterior(dst []byte, raw string) []byte {
	if len(raw) < 2 {
		return dst
	}
	return append(dst, raw[1:len(raw)-1]...)
}

// appendElem appends one raw JSON value to a comma-separated list.
func appendElem(dst []byte, raw string) []byte {
	if len(dst) > 0 {
		dst = append(dst, ',')
	}
	return append(dst, raw...)
}

// appendElems appends the elements of a raw JSON array to a comma-separated
// list.
func appendElems(dst []byte, rawArray string) []byte {
	in := strings.TrimSpace(rawArray)
	if len(in) < 2 {
		return dst
	}
	in = strings.TrimSpace(in[1 : len(in)-1])
	if in == "" {
		return dst
	}
	return appendElem(dst, in)
}

// b2s views b as a string without copying. The string must not outlive b's
// contents: every value parsed from it is copied before b changes.
func b2s(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// s2b views a string obtained from b2s as bytes, without copying. The bytes
// must not be modified.
func s2b(s string) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// The JSON walkers below run on input already checked with gjson.Valid (or
// containerEnds.validIndex, which accepts the same). They
// differ from gjson's ForEach in one way: string values are not unescaped
// (an allocation per escaped string, e.g. every token containing a newline);
// the raw token is what the assembler copies. They never read out of bounds,
// whatever the input.

// eachMember calls fn with each member of the JSON object obj: the key (its
// raw interior: keys with escapes do not match plain names) and the value
// (see rawValue). It stops when fn returns false.
func eachMember(obj string, fn func(key string, v gjson.Result) bool) {
	(*containerEnds)(nil).eachMember(obj, fn)
}

// eachMember is the package's eachMember, finding the ends of containers
// in x (see containerEnds).
func (x *containerEnds) eachMember(obj string, fn func(key string, v gjson.Result) bool) {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i++
	for {
		i = skipWS(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return // '}' or malformed
		}
		end := stringEnd(obj, i)
		if end < 0 {
			return
		}
		key := obj[i+1 : end-1]
		i = skipWS(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipWS(obj, i+1)
		vend := x.valueEnd(obj, i)
		if vend < 0 {
			return
		}
		if !fn(key, rawValue(obj[i:vend])) {
			return
		}
		i = skipWS(obj, vend)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i++
	}
}

// eachElem calls fn with each element of the JSON array arr (see rawValue).
// It stops when fn returns false.
func eachElem(arr string, fn func(v gjson.Result) bool) {
	(*containerEnds)(nil).eachElem(arr, fn)
}

// eachElem is the package's eachElem, finding the ends of containers in x
// (see containerEnds).
func (x *containerEnds) eachElem(arr string, fn func(v gjson.Result) bool) {
	i := skipWS(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return
	}
	i++
	for {
		i = skipWS(arr, i)
		if i >= len(arr) || arr[i] == ']' {
			return
		}
		vend := x.valueEnd(arr, i)
		if vend < 0 || vend == i {
			return
		}
		if !fn(rawValue(arr[i:vend])) {
			return
		}
		i = skipWS(arr, vend)
		if i >= len(arr) || arr[i] != ',' {
			return
		}
		i++
	}
}

// rawValue types a raw JSON value like gjson does, but leaves an escaped
// string's Str empty (use decodeStr) and Raw as the token.
func rawValue(raw string) gjson.Result {
	r := gjson.Result{Raw: raw}
	if raw == "" {
		return r
	}
	switch raw[0] {
	case '"':
		r.Type = gjson.String
		if in := raw[1 : len(raw)-1]; strings.IndexByte(in, '\\') < 0 {
			r.Str = in
		}
	case '{', '[':
		r.Type = gjson.JSON
	case 'n':
		r.Type = gjson.Null
	case 't':
		r.Type = gjson.True
	case 'f':
		r.Type = gjson.False
	default:
		r.Type = gjson.Number // Num is parsed on demand: see numOf
	}
	return r
}

// numOf returns the value of a number from rawValue or gjson.
func numOf(v gjson.Result) float64 {
	if v.Type != gjson.Number {
		return 0
	}
	if v.Num != 0 {
		return v.Num
	}
	f, _ := strconv.ParseFloat(v.Raw, 64)
	return f
}

// decodeStr returns the decoded value of a string from rawValue (allocating
// only when it has escapes); "" for anything else.
func decodeStr(v gjson.Result) string {
	if v.Type != gjson.String {
		return ""
	}
	if strings.IndexByte(v.Raw, '\\') < 0 {
		return v.Str
	}
	return gjson.Parse(v.Raw).Str
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(s string, i int) int {
	for i < len(s) && isWS(s[i]) {
		i++
	}
	return i
}

// stringEnd returns the offset after the string token starting at s[i] ('"'),
// or -1 when it is not terminated.
func stringEnd(s string, i int) int {
	j := i + 1
	for {
		q := strings.IndexByte(s[j:], '"')
		if q < 0 {
			return -1
		}
		j += q
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for k := j - 1; k > i && s[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}

// valueEnd returns the offset after the value starting at s[i], or -1.
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return -1
	}
	switch s[i] {
	case '"':
		return stringEnd(s, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(s); j++ {
			switch s[j] {
			case '"':
				e := stringEnd(s, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(s) && s[j] != ',' && s[j] != '}' && s[j] != ']' && !isWS(s[j]) {
		j++
	}
	return j
}

// containerEnds holds where each object and array of one JSON text ends, found
// in one scan of the text (validIndex, which also validates it), so that walking nested values does not
// rescan them: without it, each level of nesting (the chunk, "choices", each
// choice, its "logprobs", "content", each entry) skips its values again with
// valueEnd, and the bytes of a token's logprobs were read six times per
// chunk. The walkers take it as their receiver; a nil or empty containerEnds,
// or a value outside the indexed text, falls back to valueEnd.
type containerEnds struct {
	base uintptr // address of the indexed text's first byte; 0 when none
	n    int     // its length
	ends []int32 // ends[i]: offset just after the container opening at i (only at openings outside strings)
}

// validIndex reports whether s is valid JSON, accepting exactly what
// gjson.Valid accepts (its validator, mirrored), and records the ends of its
// containers on the way: one scan instead of gjson.Valid's and another.
// When it returns true, s is indexed and must stay unchanged until clear.
func (x *containerEnds) validIndex(s string) bool {
	x.clear()
	if len(s) > math.MaxInt32 {
		return gjson.Valid(s)
	}
	if cap(x.ends) < len(s) {
		x.ends = make([]int32, len(s))
	}
	x.ends = x.ends[:cap(x.ends)]
	i := skipWS(s, 0)
	if i >= len(s) {
		return false
	}
	i, ok := x.vAny(s, i)
	if !ok || skipWS(s, i) != len(s) {
		return false
	}
	x.base, x.n = uintptr(unsafe.Pointer(unsafe.StringData(s))), len(s)
	return true
}

// vAny validates the value starting at s[i] (not whitespace) and returns
// the index after it. The v* functions follow gjson's validany and the
// functions it calls, decision for decision.
func (x *containerEnds) vAny(s string, i int) (int, bool) {
	switch s[i] {
	case '{', '[':
		return x.vContainer(s, i)
	case '"':
		return vString(s, i+1)
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return vNumber(s, i)
	case 't':
		return vLit(s, i, "true")
	case 'f':
		return vLit(s, i, "false")
	case 'n':
		return vLit(s, i, "null")
	}
	return i, false
}

// vContainer validates the object or array opening at s[open] and records
// its end.
func (x *containerEnds) vContainer(s string, open int) (int, bool) {
	obj, closer := s[open] == '{', byte(']')
	if obj {
		closer = '}'
	}
	i := skipWS(s, open+1)
	if i < len(s) && s[i] == closer {
		x.ends[open] = int32(i + 1)
		return i + 1, true
	}
	for {
		var ok bool
		if obj { // "key" :
			if i >= len(s) || s[i] != '"' {
				return i, false
			}
			if i, ok = vString(s, i+1); !ok {
				return i, false
			}
			i = skipWS(s, i)
			if i >= len(s) || s[i] != ':' {
				return i, false
			}
			i = skipWS(s, i+1)
		}
		if i >= len(s) {
			return i, false
		}
		if i, ok = x.vAny(s, i); !ok {
			return i, false
		}
		i = skipWS(s, i)
		switch {
		case i >= len(s):
			return i, false
		case s[i] == closer:
			x.ends[open] = int32(i + 1)
			return i + 1, true
		case s[i] == ',':
			i = skipWS(s, i+1)
		default:
			return i, false
		}
	}
}

// vString validates a string whose opening quote is at s[i-1].
func vString(s string, i int) (int, bool) {
	for ; i < len(s); i++ {
		switch c := s[i]; {
		case c < ' ':
			return i, false
		case c == '\\':
			i++
			if i == len(s) {
				return i, false
			}
			switch s[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					i++
					if i >= len(s) || !isHex(s[i]) {
						return i, false
					}
				}
			default:
				return i, false
			}
		case c == '"':
			return i + 1, true
		}
	}
	return i, false
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// vNumber validates the number starting at s[i] ('-' or a digit).
func vNumber(s string, i int) (int, bool) {
	if s[i] == '-' {
		i++
		if i == len(s) || s[i] < '0' || s[i] > '9' {
			return i, false
		}
	}
	if s[i] == '0' {
		i++
	} else {
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && s[i] == '.' {
		i++
		if i == len(s) || s[i] < '0' || s[i] > '9' {
			return i, false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if i == len(s) || s[i] < '0' || s[i] > '9' {
			return i, false
		}
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	}
	return i, true
}

// vLit validates the literal lit (true, false, null) at s[i].
func vLit(s string, i int, lit string) (int, bool) {
	if strings.HasPrefix(s[i:], lit) {
		return i + len(lit), true
	}
	return i, false
}

// clear forgets the indexed text (the walkers fall back to valueEnd), and
// drops very large buffers.
func (x *containerEnds) clear() {
	x.base, x.n = 0, 0
	if cap(x.ends) > maxRetain {
		x.ends = nil
	}
}

// valueEnd is the package's valueEnd, taking a container's end from the
// index when s[i] is an opening of the indexed text.
func (x *containerEnds) valueEnd(s string, i int) int {
	if x != nil && x.n > 0 && i < len(s) && (s[i] == '{' || s[i] == '[') {
		off := uintptr(unsafe.Pointer(unsafe.StringData(s))) + uintptr(i) - x.base
		if off < uintptr(x.n) {
			// The bounds hold for every opening the walkers reach in valid
			// JSON; they are checked anyway, so that no input can make the
			// index point outside s.
			if e := int(x.ends[off]); e > int(off) && e <= x.n && i+e-int(off) <= len(s) {
				return i + e - int(off)
			}
		}
	}
	return valueEnd(s, i)
}
