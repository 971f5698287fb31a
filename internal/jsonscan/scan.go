package jsonscan

import "bytes"

// IsWS reports whether c is JSON whitespace.
func IsWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// SkipWS returns the index of the first non-whitespace byte at or after i.
func SkipWS(b []byte, i int) int {
	for i < len(b) && IsWS(b[i]) {
		i++
	}
	return i
}

// SkipString returns the index just after the string starting at b[i] == '"',
// or -1. It jumps from quote to quote (bytes.IndexByte); a quote is escaped
// when an odd number of backslashes precede it.
func SkipString(b []byte, i int) int {
	j := i + 1
	for j < len(b) {
		q := bytes.IndexByte(b[j:], '"')
		if q < 0 {
			return -1
		}
		j += q
		n := 0
		for k := j - 1; k > i && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
	return -1
}

// structural marks the bytes SkipValue looks at inside arrays and objects.
var structural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// SkipValue returns the index just after the value starting at b[i], or -1.
// A scalar ends at the first byte that cannot continue it; an empty scalar
// is -1.
func SkipValue(b []byte, i int) int {
	if i >= len(b) || i < 0 {
		return -1
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			if !structural[b[i]] {
				continue
			}
			switch b[i] {
			case '"':
				j := SkipString(b, i)
				if j < 0 {
					return -1
				}
				i = j - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	return skipScalar(b, i)
}

// scalarStop marks the bytes that end a scalar (number, true, false, null).
var scalarStop = [256]bool{
	',': true, '}': true, ']': true, ':': true, '{': true, '[': true, '"': true,
	' ': true, '\t': true, '\n': true, '\r': true,
}

// skipScalar returns the index after the scalar at b[i], or -1 when empty.
func skipScalar(b []byte, i int) int {
	j := i
	for j < len(b) && !scalarStop[b[j]] {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// Member is one "key": value pair of an object, as offsets into the input.
type Member struct {
	KeyStart, KeyEnd int // the key including its quotes
	ValStart, ValEnd int
}

// Key returns the raw key without quotes (escapes not decoded).
func (m *Member) Key(b []byte) []byte { return b[m.KeyStart+1 : m.KeyEnd-1] }

// Val returns the raw value.
func (m *Member) Val(b []byte) []byte { return b[m.ValStart:m.ValEnd] }

// ObjIter walks the members of an object. Start it at the '{' with
// NewObjIter.
type ObjIter struct {
	b     []byte
	x     *Index
	i     int
	first bool
	// Bad is set when the walk stopped on malformed input.
	Bad bool
	// End is the index just after the closing '}', once Next or NextKey
	// returned false without Bad.
	End int
}

// NewObjIter walks the object opening at b[open]. x, when not nil, gives the
// ends of containers (see Index); it may be nil.
func NewObjIter(b []byte, open int, x *Index) ObjIter {
	return ObjIter{b: b, x: x, i: open + 1, first: true}
}

// Next reads the next member into m; false at the end of the object or on
// malformed input (then Bad is set).
func (it *ObjIter) Next(m *Member) bool {
	if !it.NextKey(m) {
		return false
	}
	i := it.x.SkipValue(it.b, m.ValStart)
	if i < 0 {
		it.Bad = true
		return false
	}
	m.ValEnd, it.i = i, i
	return true
}

// NextKey reads the next member's key into m and stops at its value
// (m.ValStart; m.ValEnd is not set): the caller then calls SkipVal, or walks
// the value itself and calls EndVal. false at the end of the object or on
// malformed input (then Bad is set).
func (it *ObjIter) NextKey(m *Member) bool {
	b := it.b
	i := SkipWS(b, it.i)
	if i >= len(b) {
		it.Bad = true
		return false
	}
	if b[i] == '}' {
		it.End = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.Bad = true
			return false
		}
		i = SkipWS(b, i+1)
	}
	it.first = false
	if i >= len(b) || b[i] != '"' {
		it.Bad = true
		return false
	}
	m.KeyStart = i
	i = SkipString(b, i)
	if i < 0 {
		it.Bad = true
		return false
	}
	m.KeyEnd = i
	i = SkipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		it.Bad = true
		return false
	}
	m.ValStart = SkipWS(b, i+1)
	it.i = m.ValStart
	return true
}

// SkipVal skips the value of the member NextKey read; false (and Bad) when
// the value is malformed.
func (it *ObjIter) SkipVal(m *Member) bool {
	i := it.x.SkipValue(it.b, m.ValStart)
	if i < 0 {
		it.Bad = true
		return false
	}
	it.EndVal(m, i)
	return true
}

// EndVal records that the value of the member NextKey read ends at end.
func (it *ObjIter) EndVal(m *Member, end int) {
	m.ValEnd = end
	it.i = end
}

// ArrIter walks the elements of an array. Start it at the '[' with
// NewArrIter.
type ArrIter struct {
	b     []byte
	x     *Index
	i     int
	first bool
	// Bad is set when the walk stopped on malformed input.
	Bad bool
	// End is the index just after the closing ']', once Next or NextStart
	// returned false without Bad.
	End int
}

// NewArrIter walks the array opening at b[open]; x is as for NewObjIter.
func NewArrIter(b []byte, open int, x *Index) ArrIter {
	return ArrIter{b: b, x: x, i: open + 1, first: true}
}

// Next returns the offsets of the next element; ok is false at the end of the
// array or on malformed input (then Bad is set).
func (it *ArrIter) Next() (start, end int, ok bool) {
	if start, ok = it.NextStart(); !ok {
		return 0, 0, false
	}
	end = it.x.SkipValue(it.b, start)
	if end < 0 {
		it.Bad = true
		return 0, 0, false
	}
	it.i = end
	return start, end, true
}

// NextStart returns the offset of the next element without skipping it: the
// caller walks the element and calls EndElem. ok is as for Next.
func (it *ArrIter) NextStart() (start int, ok bool) {
	b := it.b
	i := SkipWS(b, it.i)
	if i >= len(b) {
		it.Bad = true
		return 0, false
	}
	if b[i] == ']' {
		it.End = i + 1
		return 0, false
	}
	if !it.first {
		if b[i] != ',' {
			it.Bad = true
			return 0, false
		}
		i = SkipWS(b, i+1)
	}
	it.first = false
	return i, true
}

// EndElem records that the element NextStart returned ends at end.
func (it *ArrIter) EndElem(end int) { it.i = end }

// IsNull reports whether the raw value is the literal null.
func IsNull(v []byte) bool { return string(v) == "null" }

// IsEmptyObject reports whether the raw value is {} (whitespace allowed).
func IsEmptyObject(v []byte) bool {
	if len(v) < 2 || v[0] != '{' {
		return false
	}
	return SkipWS(v, 1) == len(v)-1
}
