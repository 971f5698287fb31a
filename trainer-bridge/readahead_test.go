package bridge

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
)

// TestReadAheadChunks: on ClickHouse (a bulk reader) the chunks come in
// order with exactly their rollouts, across both readers and an odd last
// chunk; a streamed Build over them writes every sample in rollout order;
// a cancelled read closes the channel.
func TestReadAheadChunks(t *testing.T) {
	s := openSelectStore(t, "clickhouse")
	ctx := context.Background()
	const rollouts = 2*bulkChunk + 234
	b := &export.Batch{}
	for r := range rollouts {
		ro := fmt.Sprintf("r%05d", r)
		b.Calls = append(b.Calls, cs{ro: ro, at: "a", task: fmt.Sprint("t", r%7), seq: 1, prompt: []uint32{uint32(r)}, resp: []uint32{1}, lp: []float32{-1}}.call())
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 1})
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: "a", Name: "primary", Value: float64(r % 2), Source: "api"})
	}
	if err := s.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	refs, err := SelectAttempts(ctx, s, DefaultSelection())
	if err != nil || len(refs) != rollouts {
		t.Fatalf("%d refs, %v", len(refs), err)
	}
	bulk := s.(export.BulkRolloutReader)
	n := 0
	next, wait := readAhead(ctx, bulk, chunksOf(refs), export.ReadOptions{})
	for c, ok := next(); ok; c, ok = next() {
		if c.err != nil {
			t.Fatal(c.err)
		}
		want := refs[n*bulkChunk : min(len(refs), (n+1)*bulkChunk)]
		if !slices.Equal(c.refs, want) {
			t.Fatalf("chunk %d: attempts %d..., want %d", n, len(c.refs), len(want))
		}
		if len(c.m) != len(want) {
			t.Fatalf("chunk %d: %d rollouts, want %d", n, len(c.m), len(want))
		}
		for _, r := range want {
			if d := c.m[r.RolloutID]; d == nil || len(d.Calls) != 1 {
				t.Fatalf("chunk %d lacks rollout %s", n, r.RolloutID)
			}
		}
		n++
	}
	if n != 3 {
		t.Fatalf("%d chunks, want 3", n)
	}
	wait()

	var order []string
	res, err := Build(ctx, s, Options{Selection: DefaultSelection(), Estimator: advantage.GRPO, SpillDir: t.TempDir(),
		Emit: func(x *Sample) error { order = append(order, x.RolloutID); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != rollouts || res.Stats.Samples != rollouts {
		t.Fatalf("%d samples emitted, %d counted, want %d", len(order), res.Stats.Samples, rollouts)
	}
	for i, ro := range order {
		if ro != refs[i].RolloutID {
			t.Fatalf("sample %d is rollout %s, want %s", i, ro, refs[i].RolloutID)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	next, wait = readAhead(cctx, bulk, chunksOf(refs), export.ReadOptions{})
	if _, ok := next(); !ok {
		t.Fatal("no first chunk")
	}
	cancel()
	for _, ok := next(); ok; _, ok = next() { // ends once the readers see the cancellation
	}
	wait()
}

// chunksOf hands out refs bulkChunk at a time, as Build's selection file does.
func chunksOf(refs []AttemptRef) func() ([]AttemptRef, error) {
	return func() ([]AttemptRef, error) {
		c := refs[:min(len(refs), bulkChunk)]
		refs = refs[len(c):]
		return c, nil
	}
}
