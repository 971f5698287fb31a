package bridge

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

func TestTransitions(t *testing.T) {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "r.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	call := func(seq uint64, choice uint32, src, errMsg string) export.Call {
		return export.Call{SpanID: "s", RolloutID: "ro", AttemptID: "a2", TaskID: "t", SequenceID: seq, ChoiceIndex: choice,
			HTTPStatus: 200, Error: errMsg, TokenSource: src, PromptTokenIDs: []uint32{1, 2}, ResponseTokenIDs: []uint32{3, uint32(seq)},
			ResponseLogprobs: []float32{-0.5, -0.25}, PolicyVersion: "v1"}
	}
	b := &export.Batch{
		Calls: []export.Call{
			call(2, 0, export.TokenSourceEngine, ""),
			call(1, 1, export.TokenSourceEngine, ""),
			call(1, 0, export.TokenSourceEngine, ""),
			call(3, 0, "engine_mismatch", ""),
			call(4, 0, export.TokenSourceEngine, "client disconnected mid-stream"),
			{SpanID: "old", RolloutID: "ro", AttemptID: "a1", SequenceID: 1, HTTPStatus: 200, TokenSource: export.TokenSourceEngine,
				PromptTokenIDs: []uint32{9}, ResponseTokenIDs: []uint32{9}},
		},
		Rewards: []export.Reward{
			{RolloutID: "ro", AttemptID: "a2", Name: "primary", Value: 0.25, Source: "api", TimeUnixNano: 10},
			{RolloutID: "ro", AttemptID: "a2", Name: "primary", Value: 1, Source: "api", TimeUnixNano: 20},
			{RolloutID: "ro", AttemptID: "a2", SequenceID: 2, Name: "primary", Value: -5, Source: "api", TimeUnixNano: 30},
			{RolloutID: "ro", AttemptID: "a1", Name: "primary", Value: -1, Source: "api", TimeUnixNano: 40},
		},
		Rollouts: []export.Rollout{
			{RolloutID: "ro", AttemptID: "a1", TaskID: "t", Status: "failed", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 2},
			{RolloutID: "ro", AttemptID: "a2", TaskID: "t", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 3, UpdatedUnixNano: 4},
		},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	tr, st, err := Transitions(context.Background(), s, "ro", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Calls != 5 || st.Used != 3 || st.UnverifiedIDs != 1 || st.Errored != 1 || st.NoReward != 0 {
		t.Fatalf("stats %+v", st)
	}
	want := []struct {
		seq    uint64
		choice uint32
	}{{1, 0}, {1, 1}, {2, 0}}
	for i, w := range want {
		if tr[i].SequenceID != w.seq || tr[i].ChoiceIndex != w.choice || tr[i].Reward != 1 || tr[i].AttemptID != "a2" ||
			len(tr[i].ResponseTokenIDs) != 2 || tr[i].ResponseTokenIDs[1] != uint32(w.seq) {
			t.Fatalf("transition %d: %+v", i, tr[i])
		}
	}
	// The earlier attempt has its own reward.
	tr, _, err = Transitions(context.Background(), s, "ro", "a1", "")
	if err != nil || len(tr) != 1 || tr[0].Reward != -1 {
		t.Fatalf("attempt a1: %+v %v", tr, err)
	}
	// A reward name nobody posted: no transitions, counted.
	tr, st, _ = Transitions(context.Background(), s, "ro", "", "other")
	if len(tr) != 0 || st.NoReward != 1 {
		t.Fatalf("missing reward: %+v %+v", tr, st)
	}
}
