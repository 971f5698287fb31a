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
	s, rollouts := chunkedStore(t, 1)
	ctx := context.Background()
	refs, err := SelectAttempts(ctx, s, DefaultSelection())
	if err != nil || len(refs) != rollouts {
		t.Fatalf("%d refs, %v", len(refs), err)
	}
	bulk := s.(export.BulkRolloutReader)
	n := 0
	next, wait := readAhead(ctx, bulk, chunksOf(refs), export.ReadOptions{}, nil)
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
	next, wait = readAhead(cctx, bulk, chunksOf(refs), export.ReadOptions{}, nil)
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

// TestBuildReusesArrays: a streamed Build on ClickHouse reads each chunk's
// arrays into the memory of the chunks before it, poisoned when released;
// its samples (transitions and trajectories, several chunks of rollouts of
// three turns that extend each other) are those of an in-memory Build,
// which reuses nothing.
func TestBuildReusesArrays(t *testing.T) {
	s, _ := chunkedStore(t, 3)
	ctx := context.Background()
	defer func() { poisonArrays = false }()
	poisonArrays = true
	for _, mode := range []string{ModeTransitions, ModeTrajectories} {
		o := Options{Selection: DefaultSelection(), Estimator: advantage.GRPO, Mode: mode, SpillDir: t.TempDir()}
		want, err := Build(ctx, s, o)
		if err != nil {
			t.Fatal(err)
		}
		var got []*Sample
		o.Emit = func(x *Sample) error { got = append(got, x); return nil }
		res, err := Build(ctx, s, o)
		if err != nil {
			t.Fatal(err)
		}
		sameOutput(t, mode, got, res, want)
	}
}

// chunkedStore is a ClickHouse store of more than two chunks of rollouts
// of turns calls, each turn's prompt the previous prompt and response.
func chunkedStore(t *testing.T, turns int) (export.Store, int) {
	s := openSelectStore(t, "clickhouse")
	const rollouts = 2*bulkChunk + 234
	b := &export.Batch{}
	for r := range rollouts {
		ro := fmt.Sprintf("r%05d", r)
		var prompt []uint32
		for seq := range uint64(turns) {
			prompt = append(prompt, uint32(r), uint32(seq))
			resp := []uint32{uint32(r) + 7, uint32(seq) + 3}
			b.Calls = append(b.Calls, cs{ro: ro, at: "a", task: fmt.Sprint("t", r%7), seq: seq + 1, prompt: slices.Clone(prompt), resp: resp,
				lp: []float32{-float32(r) / 8, -float32(seq) / 4}}.call())
			prompt = append(prompt, resp...)
		}
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 1})
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: "a", Name: "primary", Value: float64(r % 3), Source: "api"})
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return s, rollouts
}
