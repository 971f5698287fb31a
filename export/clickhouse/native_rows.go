package clickhouse

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/rollgate/rollgate/export"
)

// nativeSelectList is the select list of cols for the native reader: every
// column as stored, the columns omit names as empty strings.
func nativeSelectList[R any](cols []export.Column[R], omit func(string) bool) string {
	return export.SelectList(cols, omit)
}

// readNative runs the SELECT body on the native reader and calls f with each
// row of cols, read into a fresh R, which f may keep (the Rs of a block are
// one slice, never reused).
func readNative[R any](ctx context.Context, n *nativeReader, body string, cols []export.Column[R], f func(*R)) error {
	var (
		set    []func(*R, int)
		arrays []arrayColumn
	)
	return n.query(ctx, body, func(res proto.Results, rows int) error {
		if set == nil {
			var err error
			if set, arrays, err = columnSetters(cols, res); err != nil {
				return err
			}
		}
		block := make([]R, rows)
		for i := range block {
			r := &block[i]
			for _, s := range set {
				s(r, i)
			}
			f(r)
		}
		for _, a := range arrays {
			a.release() // the calls keep the block's arrays
		}
		return nil
	})
}

// columnSetters returns, for each of cols, a function that copies row i of
// its result column into the field of a row; the result's columns must have
// the types the stores create (String or LowCardinality(String), UInt64,
// UInt32, UInt16, UInt8 for bools, Float64, Array(UInt32), Array(Float32)).
func columnSetters[R any](cols []export.Column[R], res proto.Results) ([]func(*R, int), []arrayColumn, error) {
	if len(res) != len(cols) {
		return nil, nil, fmt.Errorf("%d columns in the result, %d selected", len(res), len(cols))
	}
	out := make([]func(*R, int), len(cols))
	var arrays []arrayColumn
	for k, c := range cols {
		field, data := c.Field, res[k].Data
		var ok bool
		switch c.Type {
		case export.TypeString:
			var col proto.ColumnOf[string]
			if col, ok = data.(proto.ColumnOf[string]); ok {
				out[k] = func(r *R, i int) { *field(r).(*string) = col.Row(i) }
			}
		case export.TypeUint64:
			out[k], ok = numberSetter[R, uint64](field, data)
		case export.TypeUint32:
			out[k], ok = numberSetter[R, uint32](field, data)
		case export.TypeUint16:
			out[k], ok = numberSetter[R, uint16](field, data)
		case export.TypeFloat64:
			out[k], ok = numberSetter[R, float64](field, data)
		case export.TypeBool:
			var col proto.ColumnOf[uint8]
			if col, ok = data.(proto.ColumnOf[uint8]); ok {
				out[k] = func(r *R, i int) { *field(r).(*bool) = col.Row(i) != 0 }
			}
		case export.TypeUint32s:
			var a arrayColumn
			if out[k], a, ok = arraySetter[R, uint32](field, data); ok {
				arrays = append(arrays, a)
			}
		case export.TypeFloat32s:
			var a arrayColumn
			if out[k], a, ok = arraySetter[R, float32](field, data); ok {
				arrays = append(arrays, a)
			}
		}
		if !ok {
			return nil, nil, fmt.Errorf("column %s: the server sent %s, which is not %s", c.Name, data.Type(), c.ClickHouseType())
		}
	}
	return out, arrays, nil
}

// arrayColumn is an array column whose elements the rows read share.
type arrayColumn struct {
	// release gives the column new memory for the next block: the rows of
	// this one keep its elements.
	release func()
}

func numberSetter[R any, T uint64 | uint32 | uint16 | float64](field func(*R) any, data proto.ColResult) (func(*R, int), bool) {
	col, ok := data.(proto.ColumnOf[T])
	if !ok {
		return nil, false
	}
	return func(r *R, i int) { *field(r).(*T) = col.Row(i) }, true
}

// arraySetter sets row i of an Array(UInt32) or Array(Float32) column as a
// slice of the block's memory, its capacity cut at its end: no copy, and
// the block is never overwritten (releaseBlock gives the next one memory of
// its own).
func arraySetter[R any, T uint32 | float32](field func(*R) any, data proto.ColResult) (func(*R, int), arrayColumn, bool) {
	arr, ok := data.(*proto.ColArr[T])
	if !ok {
		return nil, arrayColumn{}, false
	}
	// The element column's memory; ch-go decodes Array(UInt32) and
	// Array(Float32) into these two.
	var (
		flat func(start, end uint64) []T
		col  arrayColumn
	)
	switch d := any(arr.Data).(type) {
	case *proto.ColUInt32:
		flat = func(start, end uint64) []T { return any([]uint32(*d)[start:end:end]).([]T) }
		col.release = func() { *d = nil }
	case *proto.ColFloat32:
		flat = func(start, end uint64) []T { return any([]float32(*d)[start:end:end]).([]T) }
		col.release = func() { *d = nil }
	default:
		return nil, col, false
	}
	return func(r *R, i int) {
		start := uint64(0)
		if i > 0 {
			start = arr.Offsets[i-1]
		}
		v := flat(start, arr.Offsets[i])
		if len(v) == 0 {
			v = []T{} // empty, not nil, as the text route reads "[]"
		}
		*field(r).(*[]T) = v
	}, col, true
}

// bindArgs replaces each ? of query, in order, with args as SQL literals:
// strings quoted, clickhouse.GroupSet as a parenthesised list, integers as
// they are. The queries it binds are the store's own, whose only ? are
// placeholders.
func bindArgs(query string, args []any) (string, error) {
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] != '?' {
			b.WriteByte(query[i])
			continue
		}
		if n == len(args) {
			return "", fmt.Errorf("bind: more placeholders than the %d arguments", len(args))
		}
		if err := appendLiteral(&b, args[n]); err != nil {
			return "", err
		}
		n++
	}
	if n != len(args) {
		return "", fmt.Errorf("bind: %d arguments for %d placeholders", len(args), n)
	}
	return b.String(), nil
}

const hexDigits = "0123456789abcdef"

// appendLiteral appends v as a ClickHouse literal: a string quoted, with
// backslash and quote escaped and control bytes as \xHH.
func appendLiteral(b *strings.Builder, v any) error {
	switch v := v.(type) {
	case string:
		b.WriteByte('\'')
		for i := 0; i < len(v); i++ {
			switch c := v[i]; {
			case c == '\\' || c == '\'':
				b.WriteByte('\\')
				b.WriteByte(c)
			case c < 0x20 || c == 0x7f:
				b.WriteString(`\x`)
				b.WriteByte(hexDigits[c>>4])
				b.WriteByte(hexDigits[c&15])
			default:
				b.WriteByte(c)
			}
		}
		b.WriteByte('\'')
	case int:
		b.WriteString(strconv.Itoa(v))
	case uint64:
		b.WriteString(strconv.FormatUint(v, 10))
	case uint32:
		b.WriteString(strconv.FormatUint(uint64(v), 10))
	case int64:
		b.WriteString(strconv.FormatInt(v, 10))
	case clickhouse.GroupSet:
		b.WriteByte('(')
		for i, x := range v.Value {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := appendLiteral(b, x); err != nil {
				return err
			}
		}
		b.WriteByte(')')
	default:
		return fmt.Errorf("bind: argument of type %T", v)
	}
	return nil
}
