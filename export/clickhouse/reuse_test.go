package clickhouse

import (
	"context"
	"runtime/debug"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// TestInsertReusesTables: a table given back is taken again, emptied, by the
// next insert of the same columns; and writes of different sizes through
// reused tables store exactly their rows, none twice.
func TestInsertReusesTables(t *testing.T) {
	s := openStore(t, Options{ExternalInsert: true})
	// No GC during the test: a sync.Pool lets go of what it holds at the
	// second GC after the Put.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	ctx := context.Background()
	cols := export.CallTable.Info()
	list := names(cols)

	var want []export.Call
	for w, n := range []int{5, 2, 3} {
		var b export.Batch
		for i := range n {
			b.Calls = append(b.Calls, storetest.FullCall("r-reuse", "a", uint64(len(want)+i+1), 0))
		}
		if err := s.Write(ctx, &b); err != nil {
			t.Fatalf("write %d: %v", w, err)
		}
		want = append(want, b.Calls...)
		if _, ok := s.tables.Load(list); !ok {
			t.Fatalf("write %d gave no table back", w)
		}
	}
	got, err := s.Calls(ctx, export.CallFilter{RolloutID: "r-reuse"})
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.EqualCalls(got, want); d != "" {
		t.Fatal(d)
	}

	// A table with rows, given back, comes back empty. Under -race a
	// sync.Pool drops a quarter of what it is given at random, so it is
	// given back until taken (at most 20 times).
	tbl, err := s.takeTable(list, cols)
	if err != nil {
		t.Fatal(err)
	}
	var vals []any
	vals = appendValues(vals, export.CallTable.Columns, &want[0])
	if err := tbl.Append(vals...); err != nil {
		t.Fatal(err)
	}
	for try := 1; ; try++ {
		s.giveTable(list, tbl)
		again, err := s.takeTable(list, cols)
		if err != nil {
			t.Fatal(err)
		}
		if again == tbl {
			if rows := again.Block().Rows(); rows != 0 {
				t.Fatalf("a table taken again holds %d rows", rows)
			}
			break
		}
		if try == 20 {
			t.Fatal("a table given back 20 times was never taken again")
		}
	}
}
