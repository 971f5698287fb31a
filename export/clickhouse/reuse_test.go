package clickhouse

import (
	"context"
	"runtime/debug"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/ext"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// TestInsertReusesTables: an insert's external table is given back and taken
// by the next insert of the same columns, emptied: three writes of different
// sizes store exactly their rows, none twice.
func TestInsertReusesTables(t *testing.T) {
	s := openStore(t, Options{ExternalInsert: true})
	// No GC during the test: a sync.Pool lets go of what it holds at the
	// second GC after the Put.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	ctx := context.Background()
	var want []export.Call
	var first *ext.Table
	for w, n := range []int{5, 2, 3} {
		var b export.Batch
		for i := range n {
			b.Calls = append(b.Calls, storetest.FullCall("r-reuse", "a", uint64(len(want)+i+1), 0))
		}
		if err := s.Write(ctx, &b); err != nil {
			t.Fatalf("write %d: %v", w, err)
		}
		want = append(want, b.Calls...)
		cols := export.CallTable.Info()
		tbl, err := s.takeTable(names(cols), cols)
		if err != nil {
			t.Fatal(err)
		}
		if rows := tbl.Block().Rows(); rows != 0 {
			t.Fatalf("a taken table holds %d rows", rows)
		}
		if w == 0 {
			first = tbl
		} else if tbl != first {
			t.Fatalf("write %d did not give its table back for the next insert", w)
		}
		s.giveTable(names(cols), tbl)
	}
	got, err := s.Calls(ctx, export.CallFilter{RolloutID: "r-reuse"})
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.EqualCalls(got, want); d != "" {
		t.Fatal(d)
	}
}
