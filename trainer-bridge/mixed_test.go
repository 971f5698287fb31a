package bridge

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

func TestCallPolicy(t *testing.T) {
	f := func(pv, segs, wantLast string, wantMixed bool) {
		t.Helper()
		last, mixed := callPolicy(&export.Call{PolicyVersion: pv, PolicyVersions: segs})
		if last != wantLast || mixed != wantMixed {
			t.Errorf("callPolicy(%q, %q) = %q, %v; want %q, %v", pv, segs, last, mixed, wantLast, wantMixed)
		}
	}
	f("v0", "", "v0", false)
	f("v0", `[[0,"v0"]]`, "v0", false)
	f("v0", `[[0,"v0"],[12,"v0"]]`, "v0", false) // resumed on the same weights
	f("v0", `[[0,"v0"],[4,"v1"],[9,"v3"]]`, "v3", true)
	// Not segments: which token came from which policy is unknown.
	for _, bad := range []string{`{}`, `[`, `[]`, `[[1,"v0"]]`, `[[0,"v0"],[0,"v1"]]`, `[[0,"v0"],[5,"v1"],[3,"v2"]]`, `[[0,1]]`, `[[0.5,"v0"]]`, `[[0,"v0","x"]]`, `[["0","v0"]]`} {
		f("v0", bad, "v0", true)
	}
}

func FuzzCallPolicy(f *testing.F) {
	for _, s := range []string{"", `[[0,"v0"],[4,"v1"]]`, `[[0,"a"]]`, `[[1,"v"]]`, `[[0,"v0"],[4,"v1"],[4,"v2"]]`, `null`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, segs string) {
		last, mixed := callPolicy(&export.Call{PolicyVersion: "pv", PolicyVersions: segs})
		if segs == "" && (last != "pv" || mixed) {
			t.Fatalf("no segments: %q, %v", last, mixed)
		}
		if !mixed && segs != "" && last == "pv" && !strings.Contains(segs, `"pv"`) {
			t.Fatalf("segments %q read as one policy %q not among them", segs, last)
		}
	})
}

// TestBuildMixedPolicy: a call resumed after a weight update (two policy
// versions in policy_versions) becomes a sample marked mixed_policy with
// the latest version under --mixed-policy keep (the default), and is left
// out, counted as mixed_policy, under drop; a call of one version is kept
// either way.
func TestBuildMixedPolicy(t *testing.T) {
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "mixed.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mixed := cs{ro: "r1", at: "a1", task: "t", agent: "solver", seq: 1, prompt: []uint32{1, 2}, resp: []uint32{3, 4, 5}, lp: []float32{-1, -2, -3}, pv: "v0"}.call()
	mixed.PolicyVersions = `[[0,"v0"],[2,"v1"]]`
	plain := cs{ro: "r2", at: "a1", task: "t", agent: "solver", seq: 1, prompt: []uint32{1, 2}, resp: []uint32{6}, lp: []float32{-1}, pv: "v1"}.call()
	b := &export.Batch{Calls: []export.Call{mixed, plain}, Rewards: []export.Reward{
		{RolloutID: "r1", AttemptID: "a1", Name: "primary", Value: 1, Source: "api", TimeUnixNano: 1},
		{RolloutID: "r2", AttemptID: "a1", Name: "primary", Value: 0, Source: "api", TimeUnixNano: 1},
	}}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	build := func(policy string) *Result {
		t.Helper()
		o, err := (&Request{MixedPolicy: policy, MinGroupSize: 1}).Options()
		if err != nil {
			t.Fatal(err)
		}
		res, err := Build(context.Background(), s, o)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := build("")
	if len(res.Samples) != 2 {
		t.Fatalf("keep: %d samples, stats %+v", len(res.Samples), res.Stats)
	}
	if !res.Samples[0].MixedPolicy || res.Samples[0].PolicyVersion != "v1" || res.Samples[1].MixedPolicy || res.Stats.Excluded[ExclMixedPolicy] != 0 {
		t.Fatalf("keep: %d samples, first mixed %v version %q, second mixed %v, excluded %v", len(res.Samples), res.Samples[0].MixedPolicy, res.Samples[0].PolicyVersion, res.Samples[1].MixedPolicy, res.Stats.Excluded)
	}
	var buf bytes.Buffer
	if err := WriteJSONL(&buf, res.Samples[:1]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"mixed_policy":true`) {
		t.Errorf("the JSONL line does not mark it: %s", buf.String())
	}
	res = build(MixedDrop)
	if len(res.Samples) != 1 || res.Samples[0].RolloutID != "r2" || res.Stats.Excluded[ExclMixedPolicy] != 1 {
		t.Fatalf("drop: %d samples, excluded %v; want r2's alone and one mixed_policy", len(res.Samples), res.Stats.Excluded)
	}
	o, err := (&Request{MixedPolicy: "sometimes"}).Options()
	if err == nil {
		_, err = Build(context.Background(), s, o)
	}
	if err == nil || !strings.Contains(err.Error(), `--mixed-policy "sometimes" is not one of keep, drop`) {
		t.Errorf("an unknown --mixed-policy: %v", err)
	}
}
