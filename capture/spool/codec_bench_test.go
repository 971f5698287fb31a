package spool

import (
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// codecBatch is 8 full calls (5,000 prompt ids each), a reward, a rollout
// and a span: what a busy capture batch holds.
func codecBatch() *export.Batch {
	b := &export.Batch{
		Rewards:  []export.Reward{{RolloutID: "r", AttemptID: "a", Name: "primary", Value: 1, Source: "api", TimeUnixNano: 9}},
		Rollouts: []export.Rollout{{RolloutID: "r", AttemptID: "a", TaskID: "t", GroupID: "g", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 5, UpdatedUnixNano: 6}},
		Spans:    []export.Span{{RolloutID: "r", AttemptID: "a", SpanID: "sp", Name: "tool", StartTimeUnixNano: 3, Attributes: "{}"}},
	}
	for i := range 8 {
		b.Calls = append(b.Calls, storetest.FullCall("r", "a", uint64(i+1), 0))
	}
	return b
}

// BenchmarkAppendBatch measures encoding a batch (the spool and the
// capture write-ahead log encode every batch and call).
func BenchmarkAppendBatch(b *testing.B) {
	bt := codecBatch()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBatch(buf[:0], bt)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkAppendSmallCall measures encoding one call without bodies or
// ids, where the per-field cost shows.
func BenchmarkAppendSmallCall(b *testing.B) {
	bt := &export.Batch{Calls: []export.Call{storetest.EmptyCall("r", "a", 1)}}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendBatch(buf[:0], bt)
	}
}

// BenchmarkDecodeBatch measures decoding codecBatch's payload.
func BenchmarkDecodeBatch(b *testing.B) {
	p := AppendBatch(nil, codecBatch())
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeBatch(p); err != nil {
			b.Fatal(err)
		}
	}
}
