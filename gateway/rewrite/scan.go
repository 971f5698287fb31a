package rewrite

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
// or -1.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

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
func (it *objIter) next(m *member) bool {
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
	i = skipWS(b, i+1)
	m.valStart = i
	i = skipValue(b, i)
	if i < 0 {
		it.bad = true
		return false
	}
	m.valEnd = i
	it.i = i
	return true
}

// arrIter walks the elements of an array. Start it at the '['.
type arrIter struct {
	b     []byte
	i     int
	first bool
	bad   bool
}

func newArrIter(b []byte, open int) arrIter {
	return arrIter{b: b, i: open + 1, first: true}
}

// next returns the offsets of the next element; ok is false at the end of the
// array or on malformed input (then bad is set).
func (it *arrIter) next() (start, end int, ok bool) {
	b := it.b
	i := skipWS(b, it.i)
	if i >= len(b) {
		it.bad = true
		return 0, 0, false
	}
	if b[i] == ']' {
		return 0, 0, false
	}
	if !it.first {
		if b[i] != ',' {
			it.bad = true
			return 0, 0, false
		}
		i = skipWS(b, i+1)
	}
	it.first = false
	start = i
	end = skipValue(b, i)
	if end < 0 {
		it.bad = true
		return 0, 0, false
	}
	it.i = end
	return start, end, true
}

// isNull reports whether the raw value is the literal null.
func isNull(v []byte) bool { return string(v) == "null" }

// isEmptyObject reports whether the raw value is {} (whitespace allowed).
func isEmptyObject(v []byte) bool {
	if len(v) < 2 || v[0] != '{' {
		return false
	}
	return skipWS(v, 1) == len(v)-1
}
