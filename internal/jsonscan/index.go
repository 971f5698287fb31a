package jsonscan

import (
	"math"
	"unsafe"
)

// Index holds where each object and array of one JSON text ends, found in
// one scan of the text (Valid, which also validates it), so that walking
// nested values afterwards does not rescan them: without it, each level of
// nesting (a stream chunk, "choices", each choice, its "logprobs",
// "content", each entry) skips its values again, and the bytes of a token's
// logprobs are read once per level. A nil or empty Index, or a value outside
// the indexed text, falls back to SkipValue. The zero value is ready to use.
type Index struct {
	base uintptr // address of the indexed text's first byte; 0 when none
	n    int     // its length
	ends []int32 // ends[i]: offset just after the container opening at i (only at openings outside strings)
}

// Valid reports whether b is valid JSON, accepting exactly what gjson.Valid
// accepts (its validator, mirrored decision for decision) nested at most
// MaxDepth deep, and records the ends of its containers on the way: one scan
// instead of gjson.Valid's and another. When it returns true, b is indexed
// and must stay unchanged until Clear or the next Valid. Validate tells a
// text too deep from an invalid one.
func (x *Index) Valid(b []byte) bool { return x.Validate(b) == nil }

// maxIndexed is the longest text Index records ends for (they are int32).
const maxIndexed = math.MaxInt32

// Indexed reports whether a text is indexed (Valid returned true, and no
// Clear since).
func (x *Index) Indexed() bool { return x != nil && x.n > 0 }

// Cap returns the capacity of the index's buffer, in entries (4 bytes each).
func (x *Index) Cap() int { return cap(x.ends) }

// Clear forgets the indexed text, and drops a buffer larger than 1 MiB of
// text.
func (x *Index) Clear() {
	x.base, x.n = 0, 0
	if cap(x.ends) > 1<<20 {
		x.ends = nil
	}
}

// End returns the recorded end (the index just after it, in b) of the
// container opening at b[i], where b is the indexed text or a slice of it;
// -1 when b[i] is not an indexed opening.
func (x *Index) End(b []byte, i int) int {
	if x == nil || x.n == 0 || i < 0 || i >= len(b) || (b[i] != '{' && b[i] != '[') {
		return -1
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(b))) + uintptr(i) - x.base
	if off >= uintptr(x.n) {
		return -1
	}
	// The bounds hold for every opening reached in valid JSON; they are
	// checked anyway, so that no input can make the index point outside b.
	if e := int(x.ends[off]); e > int(off) && e <= x.n && i+e-int(off) <= len(b) {
		return i + e - int(off)
	}
	return -1
}

// SkipValue is the package's SkipValue, taking a container's end from the
// index when b[i] is an opening of the indexed text. x may be nil.
func (x *Index) SkipValue(b []byte, i int) int {
	if i < 0 || i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		if e := x.End(b, i); e >= 0 {
			return e
		}
		return SkipValue(b, i)
	}
	return skipScalar(b, i)
}

// ValidValue validates the JSON value starting at b[i] (not whitespace) as
// gjson.Valid validates a value there, nested at most MaxDepth deep, without
// indexing it, and returns the index just after it. A text is valid JSON
// when it is whitespace, one value that ValidValue accepts, and whitespace.
func ValidValue(b []byte, i int) (int, bool) {
	if i < 0 || i >= len(b) {
		return i, false
	}
	end, err := (*Index)(nil).vAny(b, i)
	return end, err == nil
}

// vAny validates the value starting at b[i] (not whitespace) and returns the
// index after it, recording the end of every container in it when x is not
// nil. It follows gjson's validany and the functions it calls decision for
// decision, but walks nested values with a loop and a fixed stack instead
// of recursion: the depth is bounded by MaxDepth (ErrTooDeep), and no input
// can grow the goroutine's stack.
//
// The stack holds one bit per open container (set: an object). When x is
// not nil, x.ends of an open container holds the offset of the container
// around it (-1 at the top) until it closes and gets its end: the offsets
// of open containers need no stack of their own.
func (x *Index) vAny(b []byte, i int) (int, error) {
	var (
		objs   [MaxDepth / 64]uint64 // bit d: the container at depth d is an object
		depth  int                   // containers open
		parent = -1                  // offset of the innermost open container (x != nil)
		ok     bool
	)
value: // b[i] starts a value (not whitespace, i < len(b))
	for {
		if c := b[i]; c == '{' || c == '[' {
			if depth == MaxDepth {
				return i, ErrTooDeep
			}
			obj := c == '{'
			if obj {
				objs[depth/64] |= 1 << (depth % 64)
			} else {
				objs[depth/64] &^= 1 << (depth % 64)
			}
			depth++
			if x != nil {
				x.ends[i] = int32(parent)
				parent = i
			}
			i = SkipWS(b, i+1)
			if i >= len(b) || !(b[i] == '}' && obj || b[i] == ']' && !obj) {
				if obj {
					if i, ok = vKey(b, i); !ok {
						return i, ErrInvalid
					}
				}
				if i >= len(b) {
					return i, ErrInvalid
				}
				continue
			}
			// An empty container: it is the value.
			parent = x.close(parent, i)
			depth--
			i, ok = i+1, true
		} else {
			i, ok = vScalar(b, i)
		}
		if !ok {
			return i, ErrInvalid
		}
		// A value ended just before b[i]: close the containers it ends, or
		// go on to the next member or element.
		for depth > 0 {
			i = SkipWS(b, i)
			if i >= len(b) {
				return i, ErrInvalid
			}
			d := depth - 1
			obj := objs[d/64]&(1<<(d%64)) != 0
			switch {
			case b[i] == '}' && obj || b[i] == ']' && !obj:
				parent = x.close(parent, i)
				depth--
				i++
			case b[i] == ',':
				i = SkipWS(b, i+1)
				if obj {
					if i, ok = vKey(b, i); !ok {
						return i, ErrInvalid
					}
				}
				if i >= len(b) {
					return i, ErrInvalid
				}
				continue value
			default:
				return i, ErrInvalid
			}
		}
		return i, nil
	}
}

// vScalar validates the string, number or literal starting at b[i] and
// returns the index after it.
func vScalar(b []byte, i int) (int, bool) {
	switch b[i] {
	case '"':
		return vString(b, i+1)
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return vNumber(b, i)
	case 't':
		return vLit(b, i, "true")
	case 'f':
		return vLit(b, i, "false")
	case 'n':
		return vLit(b, i, "null")
	}
	return i, false
}

// close records that the open container at offset open (see vAny) ends
// just after b[closer], and returns the container around it. Nothing is
// recorded when x is nil.
func (x *Index) close(open, closer int) (parent int) {
	if x == nil {
		return -1
	}
	parent = int(x.ends[open])
	x.ends[open] = int32(closer + 1)
	return parent
}

// vKey validates `"key" :` and the whitespace after it, starting at b[i],
// and returns the index after them.
func vKey(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	i, ok := vString(b, i+1)
	if !ok {
		return i, false
	}
	i = SkipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		return i, false
	}
	return SkipWS(b, i+1), true
}

// strPlain marks the bytes a string holds as they are: not a control
// character, a quote or a backslash.
var strPlain = func() (t [256]bool) {
	for c := ' '; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// vString validates a string whose opening quote is at b[i-1].
func vString(b []byte, i int) (int, bool) {
	for ; i < len(b); i++ {
		// Runs of plain bytes first, eight at a time.
		for i+8 <= len(b) && strPlain[b[i]] && strPlain[b[i+1]] && strPlain[b[i+2]] && strPlain[b[i+3]] &&
			strPlain[b[i+4]] && strPlain[b[i+5]] && strPlain[b[i+6]] && strPlain[b[i+7]] {
			i += 8
		}
		for i < len(b) && strPlain[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c < ' ':
			return i, false
		case c == '\\':
			i++
			if i == len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					i++
					if i >= len(b) || !isHex(b[i]) {
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

// vNumber validates the number starting at b[i] ('-' or a digit).
func vNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return i, false
		}
	}
	if b[i] == '0' {
		i++
	} else {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return i, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return i, false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	return i, true
}

// vLit validates the literal lit (true, false, null) at b[i].
func vLit(b []byte, i int, lit string) (int, bool) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), true
	}
	return i, false
}
