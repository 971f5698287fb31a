package clickhouse

import (
	"context"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/ext"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// BenchmarkEncodeCalls measures turning 1,000 calls (the capture
// pipeline's batch under load) into a Native block, the conversion path of
// both insert modes, without a server: in a new external table each time,
// and in one reused as insertExternal reuses them (takeTable, giveTable).
func BenchmarkEncodeCalls(b *testing.B) {
	calls := make([]export.Call, 1000)
	for i := range calls {
		calls[i] = storetest.FullCall("r", "a", uint64(i+1), 0)
	}
	cols := export.CallTable.Info()
	list := names(cols)
	for _, reuse := range []bool{false, true} {
		b.Run(map[bool]string{false: "new", true: "reused"}[reuse], func(b *testing.B) {
			var s Store
			b.ReportAllocs()
			for b.Loop() {
				var (
					tbl *ext.Table
					err error
				)
				if reuse {
					tbl, err = s.takeTable(list, cols)
				} else {
					tbl, err = newExternalTable(cols)
				}
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
				if got := tbl.Block().Rows(); got != len(calls) {
					b.Fatalf("block has %d rows, want %d", got, len(calls))
				}
				if reuse {
					s.giveTable(list, tbl)
				}
			}
		})
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
