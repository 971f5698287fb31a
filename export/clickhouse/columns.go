package clickhouse

import (
	"fmt"
	"strings"

	"github.com/rollgate/rollgate/export"
)

// The columns of every insert and select come from export's column table
// (export.CallTable and the others), in table order.

// names joins the column names with ", ".
func names(cols []export.ColumnInfo) string {
	s := make([]string, len(cols))
	for i, c := range cols {
		s[i] = c.Name
	}
	return strings.Join(s, ", ")
}

// nonNil returns s, or an empty slice when s is nil (the driver wants a slice).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// appendValues appends r's values for an insert, in column order, to dst:
// bools as UInt8, nil arrays as empty ones.
func appendValues[R any](dst []any, cols []export.Column[R], r *R) []any {
	for i := range cols {
		c := &cols[i]
		p := c.Field(r)
		switch c.Type {
		case export.TypeString:
			dst = append(dst, *p.(*string))
		case export.TypeUint64:
			dst = append(dst, *p.(*uint64))
		case export.TypeUint32:
			dst = append(dst, *p.(*uint32))
		case export.TypeUint16:
			dst = append(dst, *p.(*uint16))
		case export.TypeBool:
			var u uint8
			if *p.(*bool) {
				u = 1
			}
			dst = append(dst, u)
		case export.TypeFloat64:
			dst = append(dst, *p.(*float64))
		case export.TypeUint32s:
			dst = append(dst, nonNil(*p.(*[]uint32)))
		case export.TypeFloat32s:
			dst = append(dst, nonNil(*p.(*[]float32)))
		default:
			panic(fmt.Sprintf("clickhouse: column %s: unknown type %d", c.Name, c.Type))
		}
	}
	return dst
}

// selectList is the select list of cols for an export.Scanner: arrays as text
// (toString; floats in their shortest round-trip form), the columns omit
// names as empty strings.
func selectList[R any](cols []export.Column[R], omit func(string) bool) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		switch {
		case omit != nil && omit(c.Name):
			b.WriteString("'' AS " + c.Name)
		case c.Type == export.TypeUint32s || c.Type == export.TypeFloat32s:
			b.WriteString("toString(" + c.Name + ") AS " + c.Name)
		default:
			b.WriteString(c.Name)
		}
	}
	return b.String()
}
