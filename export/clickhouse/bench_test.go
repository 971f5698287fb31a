package clickhouse

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// BenchmarkEncodeCalls measures turning 100 calls into a Native block (the
// conversion path of both insert modes) without a server.
func BenchmarkEncodeCalls(b *testing.B) {
	calls := make([]export.Call, 100)
	for i := range calls {
		calls[i] = storetest.FullCall("r", "a", uint64(i+1), 0)
	}
	b.ReportAllocs()
	for b.Loop() {
		cols := export.CallTable.Info()
		defs := make([]func(*ext.Table) error, len(cols))
		for i, c := range cols {
			defs[i] = ext.Column(c.Name, column.Type(c.ClickHouseType()))
		}
		tbl, err := ext.NewTable(externalTable, defs...)
		if err != nil {
			b.Fatal(err)
		}
		var vals []any
		for i := range calls {
			vals = appendValues(vals[:0], export.CallTable.Columns, &calls[i])
			if err := tbl.Append(vals...); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkWrite measures a 100-call Write against the test server.
func BenchmarkWrite(b *testing.B) {
	s := openStore(b, Options{})
	batch := &export.Batch{}
	for i := 0; i < 100; i++ {
		batch.Calls = append(batch.Calls, storetest.FullCall("r", "a", uint64(i+1), 0))
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Write(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}
