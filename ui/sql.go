package ui

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// dialect quotes values for the SQL of one store kind. Every value a person
// types into a filter or a URL reaches SQL only through lit, which rejects
// what neither store can hold in a string literal and escapes the rest.
type dialect string

const (
	dialectSQLite     dialect = "sqlite"
	dialectClickHouse dialect = "clickhouse"
)

// maxFilterLen bounds one filter value (ids, names, versions).
const maxFilterLen = 512

// checkValue says why s cannot be a filter value, or returns nil.
func checkValue(what, s string) error {
	switch {
	case len(s) > maxFilterLen:
		return fmt.Errorf("%s is longer than %d bytes", what, maxFilterLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s is not valid UTF-8", what)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%s contains a NUL byte", what)
	}
	return nil
}

// lit renders s as a string literal of d. s must have passed checkValue.
func (d dialect) lit(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'' && d == dialectSQLite:
			b.WriteString("''")
		case (c == '\'' || c == '\\') && d == dialectClickHouse:
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// list renders ss as "(lit, lit, ...)" for an IN clause; ss is not empty.
func (d dialect) list(ss []string) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(d.lit(s))
	}
	b.WriteByte(')')
	return b.String()
}

// u64 renders n as an integer literal.
func u64(n uint64) string { return strconv.FormatUint(n, 10) }
