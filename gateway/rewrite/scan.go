package rewrite

import "bytes"

// A minimal structural JSON scanner over byte slices. It never allocates and
// never panics on malformed input: every function reports failure with -1 or
// false. It does not validate (Rewrite validates with gjson first; the
// stripper leaves anything it cannot walk untouched).

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipWS returns the index of the first non-whitespace byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) && isWS(b[i]) {
		i++
	}
	return i
}

// skipString returns the index just after the string starting at b[i] == '"',
// or -1. It jumps from quote to quote (bytes.IndexByte); a quote is escaped
// when an odd number of backslashes precede it.
func skipString(b []byte, i int) int {
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

// structural marks the bytes skipValue looks at inside arrays and objects.
var structural = [256]bool{'"': true, '{': true, '[': true, '}': true, ']': true}

// skipValue returns the index just after the value starting at b[i], or -1.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			if !structural[b[i]] {
				continue
			}
			switch b[i] {
			case '"':
				j := skipString(b, i)
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
	j := i
	for j < len(b) {
		c := b[j]
		if c == ',' || c == '}' || c == ']' || c == ':' || c == '{' || c == '[' || c == '"' || isWS(c) {
			break
		}
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// member is one "key": value pair of an object, as offsets into the input.
type member struct {
	keyStart, keyEnd int // the key including its quotes
	valStart, valEnd int
}

// key returns the raw key without quotes (escapes not decoded).
func (m *member) key(b []byte) []byte { return b[m.keyStart+1 : m.keyEnd-1] }

// val returns the raw value.
func (m *member) val(b []byte) []byte { return b[m.valStart:m.valEnd] }

// objIter walks the members of an object. Start it at the '{'.
type objIter struct {
	b     []byte
	i     int
	first bool
	bad   bool
	end   int // index just after the closing '}', once next returned false without bad
}

func newObjIter(b []byte, open int) objIter {
	return objIter{b: b, i: open + 1, first: true}
}

// next reads the next member into m; false at the end of the object or on
// malformed input (then bad is set).
func (it *objIter) next(m *member) bool { return it.nextKey(m) && it.skipVal(m) }

// nextKey reads the next member's key into m and stops at its value
// (m.valStart; m.valEnd is not set): the caller then calls skipVal, or walks
// the value itself and calls endVal. false at the end of the object or on
// malformed input (then bad is set).
func (it *objIter) nextKey(m *member) bool {
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.bad = true
		return false
	}
	if b[i] == '}' {
		it.end = i + 1
		return false
	}
	if !it.first {
		if b[i] != ',' {
			it.bad = true
			return false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	if i >= len(b) || b[i] != '"' {
		it.bad = true
		return false
	}
	m.keyStart = i
	i = skipString(b, i)
	if i < 0 {
		it.bad = true
		return false
	}
	m.keyEnd = i
	i = skipWS(b, i)
	if i >= len(b) || b[i] != ':' {
		it.bad = true
		return false
	}
	m.valStart = skipWS(b, i+1)
	it.i = m.valStart
	return true
}

// skipVal skips the value of the member nextKey read; false (and bad) when
// the value is malformed.
func (it *objIter) skipVal(m *member) bool {
	i := skipValue(it.b, m.valStart)
	if i < 0 {
		it.bad = true
		return false
	}
	it.endVal(m, i)
	return true
}

// endVal records that the value of the member nextKey read ends at end.
func (it *objIter) endVal(m *member, end int) {
	m.valEnd = end
	it.i = end
}

// arrIter walks the elements of an array. Start it at the '['.
type arrIter struct {
	b     []byte
	i     int
	first bool
	bad   bool
	end   int // index just after the closing ']', once next returned false without bad
}

func newArrIter(b []byte, open int) arrIter {
	return arrIter{b: b, i: open + 1, first: true}
}

// next returns the offsets of the next element; ok is false at the end of the
// array or on malformed input (then bad is set).
func (it *arrIter) next() (start, end int, ok bool) {
	if start, ok = it.nextStart(); !ok {
		return 0, 0, false
	}
	end = skipValue(it.b, start)
	if end < 0 {
		it.bad = true
		return 0, 0, false
	}
	it.i = end
	return start, end, true
}

// nextStart returns the offset of the next element without skipping it: the
// caller walks the element and calls endElem. ok is as for next.
func (it *arrIter) nextStart() (start int, ok bool) {
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.bad = true
		return 0, false
	}
	if b[i] == ']' {
		it.end = i + 1
		return 0, false
	}
	if !it.first {
		if b[i] != ',' {
			it.bad = true
			return 0, false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	return i, true
}

// endElem records that the element nextStart returned ends at end.
func (it *arrIter) endElem(end int) { it.i = end }

// isNull reports whether the raw value is the literal null.
func isNull(v []byte) bool { return string(v) == "null" }

// isEmptyObject reports whether the raw value is {} (whitespace allowed).
func isEmptyObject(v []byte) bool {
	if len(v) < 2 || v[0] != '{' {
		return false
	}
	return skipWS(v, 1) == len(v)-1
}
