package bridge

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

// TestDefaultsTakeUnregisteredRewardedRollouts: the natural path — calls on
// the per-rollout URL with x-task-id, one episode reward per rollout posted
// without attempt_id, nothing registered — gives every call to the default
// options, grouped by task. An unregistered rollout without a reward (perhaps
// still running) is left out as unfinished, before it joins the group: the
// siblings' advantages are those of the rewarded four alone. Calls of no
// rollout and attempts of other statuses are counted as not selected.
func TestDefaultsTakeUnregisteredRewardedRollouts(t *testing.T) {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := &export.Batch{}
	lp := []float32{-0.5}
	for i, ro := range []string{"n1", "n2", "n3", "n4", "n5"} {
		for seq := uint64(1); seq <= 2; seq++ {
			b.Calls = append(b.Calls, cs{ro: ro, at: "1", task: "math-7", seq: seq, prompt: []uint32{1, 2}, resp: []uint32{3}, lp: lp}.call())
		}
		if ro != "n5" { // n5 has no reward yet
			b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, Name: "primary", Value: float64(i), Source: "api", TimeUnixNano: 1})
		}
	}
	b.Calls = append(b.Calls, cs{ro: "", at: "", seq: 1, prompt: []uint32{1}, resp: []uint32{2}, lp: lp}.call(),
		cs{ro: "", at: "", seq: 2, prompt: []uint32{1}, resp: []uint32{2}, lp: lp}.call(),
		cs{ro: "busy", at: "1", task: "math-7", seq: 1, prompt: []uint32{1}, resp: []uint32{2}, lp: lp}.call())
	b.Rollouts = []export.Rollout{{RolloutID: "busy", AttemptID: "1", TaskID: "math-7", Status: "running", Metadata: "{}", UpdatedUnixNano: 1}}
	ctx := context.Background()
	if err := s.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	o, err := (&Request{}).Options() // every default, as `rollgate bridge --out F`
	if err != nil {
		t.Fatal(err)
	}
	o.Report = true
	res, err := Build(ctx, s, o)
	if err != nil {
		t.Fatal(err)
	}
	st := res.Stats
	if st.Samples != 8 || st.Groups != 1 || st.Attempts != 5 {
		t.Fatalf("samples %d groups %d attempts %d, want 8 in 1 group from 5 attempts; excluded %v", st.Samples, st.Groups, st.Attempts, st.Excluded)
	}
	if st.Excluded[ExclUnfinished] != 1 || st.Excluded[ExclSmallGroup] != 0 || st.FilledRewards != 0 {
		t.Errorf("excluded %v, filled %d: want unfinished=1 and no reward filled with 0", st.Excluded, st.FilledRewards)
	}
	if st.NotSelected[SkipStatus+"running"] != 1 || st.UnattributedCalls != 2 {
		t.Errorf("not selected %v, unattributed %d: want status:running=1, 2 unattributed calls", st.NotSelected, st.UnattributedCalls)
	}
	// Rewards 0..3 over four members: GRPO's mean is 1.5, so the member
	// with reward 0 has a negative advantage; the unrewarded n5 (0 if it
	// had counted) would have moved the mean to 1.2.
	var sum float64
	for _, smp := range res.Samples {
		if smp.GroupUID != "math-7@v2" {
			t.Errorf("sample of %s in group %q, want the task's (math-7@v2)", smp.RolloutID, smp.GroupUID)
		}
		sum += smp.Advantage
	}
	if sum > 1e-9 || sum < -1e-9 {
		t.Errorf("advantages sum to %v over the group, want 0 (the unrewarded rollout moved the baseline)", sum)
	}
	for _, r := range res.Report {
		if r.RolloutID == "n5" && (r.Reason != ExclUnfinished || r.Status != StatusUnregistered) {
			t.Errorf("n5 report: status %q reason %q, want %q %q", r.Status, r.Reason, StatusUnregistered, ExclUnfinished)
		}
	}
	// Without "unregistered" in the statuses they are counted as not selected.
	o.Selection.Statuses = []string{"succeeded", "failed"}
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	if res.Stats.Samples != 0 || res.Stats.NotSelected[SkipStatus+StatusUnregistered] != 5 {
		t.Errorf("statuses succeeded,failed: %d samples, not selected %v; want 0 and status:unregistered=5", res.Stats.Samples, res.Stats.NotSelected)
	}
	// Any status (--status ''): the unrewarded one too, with reward 0.
	o.Selection.Statuses = []string{}
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	if res.Stats.Samples != 11 || res.Stats.FilledRewards != 2 {
		t.Errorf("any status: %d samples, %d filled rewards; want 11 (n5: 2, busy: 1) and 2 (n5, busy)", res.Stats.Samples, res.Stats.FilledRewards)
	}
}

// TestHintNamesTheFix: every counted reason has a hint naming a flag,
// header or route that changes it.
func TestHintNamesTheFix(t *testing.T) {
	f := func(reason, want string) {
		t.Helper()
		if h := Hint(reason, 2); !strings.Contains(h, want) {
			t.Errorf("Hint(%q) = %q, want it to name %q", reason, h, want)
		}
	}
	f(ExclSmallGroup, "x-task-id")
	f(ExclSmallGroup, "fewer than 2")
	f(ExclSmallGroup, "--min-group-size")
	f(ExclUnfinished, "/rewards")
	f(SkipStatus+StatusUnregistered, "--status")
	f(SkipStatus+"running", "--status")
	f(SkipStatus+"cancelled", "succeeded,failed,unregistered")
	f(SkipUnattributed, "/rollout/{r}/attempt/{a}/v1")
	for _, r := range []string{ExclErrored, ExclUnverified, ExclRetokenize, ExclAgent, ExclPolicyVersion, ExclTruncDropped,
		ExclPromptTooLong, ExclNoLogprobs, ExclNoReward, ExclMissingGroup, ExclNoSample, ExclZeroVariance, SkipTasks, SkipRollouts, SkipTime} {
		if Hint(r, 0) == "" {
			t.Errorf("reason %s has no hint", r)
		}
	}
}
