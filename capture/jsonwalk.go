// Raw JSON walking for the Assembler: member and element walkers that do not
// unescape strings (over internal/jsonscan, the scanner rewrite uses too) and
// value readers (token ids, numbers, strings).

package capture

import (
	"math"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
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

// The JSON walkers below (over internal/jsonscan) run on input already
// checked with jsonscan.Validate or jsonscan.Index.Valid (gjson.Valid's verdict,
// nested at most jsonscan.MaxDepth deep). They
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

// eachMember is the package's eachMember, taking the ends of containers
// from x (see containerEnds).
func (x *containerEnds) eachMember(obj string, fn func(key string, v gjson.Result) bool) {
	// A loop over jsonscan's primitives rather than its ObjIter: this runs
	// for every member of every chunk, and the iterator's calls cost more.
	b, idx := jsonscan.Bytes(obj), x.index()
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return
	}
	i++
	for {
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) || b[i] != '"' {
			return // '}' or malformed
		}
		end := jsonscan.SkipString(b, i)
		if end < 0 {
			return
		}
		key := obj[i+1 : end-1]
		i = jsonscan.SkipWS(b, end)
		if i >= len(b) || b[i] != ':' {
			return
		}
		i = jsonscan.SkipWS(b, i+1)
		vend := idx.SkipValue(b, i)
		if vend < 0 {
			return
		}
		if !fn(key, rawValue(obj[i:vend])) {
			return
		}
		i = jsonscan.SkipWS(b, vend)
		if i >= len(b) || b[i] != ',' {
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

// eachElem is the package's eachElem, taking the ends of containers from x
// (see containerEnds).
func (x *containerEnds) eachElem(arr string, fn func(v gjson.Result) bool) {
	b, idx := jsonscan.Bytes(arr), x.index()
	i := jsonscan.SkipWS(b, 0)
	if i >= len(b) || b[i] != '[' {
		return
	}
	i++
	for {
		i = jsonscan.SkipWS(b, i)
		if i >= len(b) || b[i] == ']' {
			return
		}
		vend := idx.SkipValue(b, i)
		if vend < 0 {
			return
		}
		if !fn(rawValue(arr[i:vend])) {
			return
		}
		i = jsonscan.SkipWS(b, vend)
		if i >= len(b) || b[i] != ',' {
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

// containerEnds indexes the ends of one stream chunk's objects and arrays
// (jsonscan.Index): the chunk is validated and indexed in one scan, and the
// walkers above take every nested container's end from the index instead of
// rescanning it. A nil or empty containerEnds walks without an index.
type containerEnds struct{ jsonscan.Index }

// index returns x's Index, or nil.
func (x *containerEnds) index() *jsonscan.Index {
	if x == nil {
		return nil
	}
	return &x.Index
}
