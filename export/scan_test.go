package export

import (
	"reflect"
	"strings"
	"testing"
)

// fakeRow is one row as a driver would scan it: values by destination.
type fakeRow []any

func (r fakeRow) Scan(dest ...any) error {
	for i, d := range dest {
		reflect.ValueOf(d).Elem().Set(reflect.ValueOf(r[i]))
	}
	return nil
}

func TestScanner(t *testing.T) {
	// The columns of llm_calls as SQLite returns them (integers and bools
	// as int64) and as ClickHouse does (bools as UInt8); arrays as text.
	var sqlite, native fakeRow
	want := Call{SpanID: "s", SequenceID: 1<<64 - 1, ChoiceIndex: 2, Stream: true, HTTPStatus: 200,
		PromptTokenIDs: []uint32{1, 2}, ResponseTokenIDs: []uint32{}, ResponseLogprobs: []float32{-0.5}}
	for _, c := range CallTable.Columns {
		v := reflect.ValueOf(c.Field(&want)).Elem().Interface()
		switch x := v.(type) {
		case uint64:
			sqlite, native = append(sqlite, int64(x)), append(native, x)
		case uint32:
			sqlite, native = append(sqlite, int64(x)), append(native, x)
		case uint16:
			sqlite, native = append(sqlite, int64(x)), append(native, x)
		case bool:
			var i int64
			if x {
				i = 1
			}
			sqlite, native = append(sqlite, i), append(native, uint8(i))
		case []uint32:
			text := "[]"
			if len(x) == 2 {
				text = "[1,2]"
			}
			sqlite, native = append(sqlite, text), append(native, text)
		case []float32:
			sqlite, native = append(sqlite, "[-0.5]"), append(native, "[-0.5]")
		default:
			sqlite, native = append(sqlite, v), append(native, v)
		}
	}
	for _, tc := range []struct {
		name string
		ints IntScan
		row  fakeRow
	}{{"sqlite", IntsAsInt64, sqlite}, {"clickhouse", IntsNative, native}} {
		s := NewScanner(CallTable.Columns, tc.ints)
		if err := s.Scan(tc.row, func(c *Call) string { return c.SpanID }); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !reflect.DeepEqual(s.Row, want) {
			t.Errorf("%s: got %+v\nwant %+v", tc.name, s.Row, want)
		}
	}
	bad := append(fakeRow(nil), sqlite...)
	for i, c := range CallTable.Columns {
		if c.Name == "response_logprobs" {
			bad[i] = "[x]"
		}
	}
	err := NewScanner(CallTable.Columns, IntsAsInt64).Scan(bad, func(c *Call) string { return "span " + c.SpanID })
	if err == nil || !strings.HasPrefix(err.Error(), "span s response_logprobs: ") {
		t.Errorf("bad array: %v", err)
	}
}
