package clickhouse

import (
	"context"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// BenchmarkReadRollouts measures a bulk read (Rollouts, as the trainer
// bridge does it) of 10 rollouts of 100 calls each from the test server,
// with and without the bodies; ns/row is reported.
func BenchmarkReadRollouts(b *testing.B) {
	s := openStore(b, Options{})
	ids := make([]string, 10)
	batch := &export.Batch{}
	for r := range ids {
		ids[r] = "bench-read-" + string(rune('a'+r))
		for i := 0; i < 100; i++ {
			batch.Calls = append(batch.Calls, storetest.FullCall(ids[r], "a", uint64(i+1), 0))
		}
	}
	if err := s.Write(context.Background(), batch); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opt  export.ReadOptions
	}{{"all", export.ReadOptions{}}, {"no-bodies", export.ReadOptions{NoRequestBody: true, NoResponseBody: true}}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m, err := s.Rollouts(context.Background(), ids, bc.opt)
				if err != nil || len(m[ids[0]].Calls) != 100 {
					b.Fatalf("%v", err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(batch.Calls)), "ns/row")
		})
	}
}
