package sqlite

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// BenchmarkReadCalls measures reading 1,000 stored calls (benchCall rows)
// back with Calls; ns/row is reported.
func BenchmarkReadCalls(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const n = 1000
	batch := &export.Batch{Calls: make([]export.Call, n)}
	for i := range batch.Calls {
		batch.Calls[i] = benchCall(i)
		batch.Calls[i].RolloutID = "r"
	}
	if err := s.Write(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		got, err := s.Calls(context.Background(), export.CallFilter{RolloutID: "r"})
		if err != nil || len(got) != n {
			b.Fatalf("%d calls, %v", len(got), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
}
