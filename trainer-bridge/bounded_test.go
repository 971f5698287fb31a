package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
)

// TestBuildBoundedMemory: with sorters that hold 3 records, a Build over 50
// rollouts (3 of them with a second attempt) in 4 groups gives what an
// in-memory Build gives, byte for byte (samples, stats, report), while it
// never held more than 3 units or outcomes at once, more than one group's
// members or more than one rollout's attempts: what it keeps in memory is
// bounded by the size of a group, not by the number of attempts.
func TestBuildBoundedMemory(t *testing.T) {
	s := openSelectStore(t, "sqlite")
	b := &export.Batch{}
	const rollouts = 50
	for r := range rollouts {
		ro := fmt.Sprintf("r%03d", r)
		attempts := []string{"a"}
		if r%17 == 3 {
			attempts = append(attempts, "b")
		}
		for k, at := range attempts {
			for seq := range uint64(3) {
				b.Calls = append(b.Calls, cs{ro: ro, at: at, task: fmt.Sprint("t", r%4), seq: 10*uint64(k) + seq + 1, prompt: []uint32{uint32(r), uint32(seq)},
					resp: []uint32{uint32(seq) + 1, 2}, lp: []float32{-1, -0.5}}.call())
			}
			b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: at, Status: "succeeded", Metadata: "{}", UpdatedUnixNano: uint64(k + 1)})
			if r == 7 {
				continue // no reward: 0, or its group dropped with drop-group
			}
			v := float64((r * 7) % 5)
			if r%4 == 2 {
				v = 1 // group t2: all equal
			}
			b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: at, Name: "primary", Value: v, Source: "api"})
			b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: at, SequenceID: 2, Name: "primary", Value: 0.25 * float64(r%3), Source: "api"})
		}
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	most := map[string]int{}
	noteHeld = func(kind string, n int) { most[kind] = max(most[kind], n) }
	defer func(n int) { noteHeld, sortRun = nil, n }(sortRun)
	for _, est := range []advantage.Estimator{advantage.GRPO, advantage.ReinforcePP} {
		for _, level := range []string{LevelRollout, LevelTransition} {
			for _, missing := range []string{MissingZero, MissingDropGroup} {
				name := fmt.Sprint(est, "/", level, "/", missing)
				o := Options{Selection: Selection{Attempts: AttemptsAll}, Estimator: est, Level: level, MissingReward: missing,
					DropZeroVariance: true, Report: true, SpillDir: t.TempDir()}
				want, err := Build(context.Background(), s, o)
				if err != nil {
					t.Fatal(err)
				}
				clear(most)
				sortRun = 3
				var got []*Sample
				o.Emit = func(s *Sample) error { got = append(got, s); return nil }
				res, err := Build(context.Background(), s, o)
				sortRun = defaultSortRun
				if err != nil {
					t.Fatal(err)
				}
				sameOutput(t, name, got, res, want)
				a, _ := json.Marshal(res.Report)
				w, _ := json.Marshal(want.Report)
				if string(a) != string(w) {
					t.Fatalf("%s: reports differ:\n%s\n%s", name, a, w)
				}
				group := 14 // the largest group's attempts: t0 has 13 rollouts, 1 with two attempts
				if level == LevelTransition {
					group *= 3
				}
				if most["sort"] != 3 || most["group"] != group || most["rollout"] != 2 {
					t.Fatalf("%s: held at most %v, want 3 sorted records, one group (%d), one rollout's 2 attempts", name, most, group)
				}
				if left, _ := filepath.Glob(filepath.Join(o.SpillDir, "*")); len(left) != 0 {
					t.Fatalf("%s: temporary files left: %v", name, left)
				}
			}
		}
	}
}

// TestSorter: records come out in order from runs on disk as from memory,
// as often as asked, and the runs' file goes with close.
func TestSorter(t *testing.T) {
	defer func(n int) { sortRun = n }(sortRun)
	for _, run := range []int{1 << 14, 7, 1} {
		sortRun = run
		dir := t.TempDir()
		s := newSorter(dir, "test", byGroup, encodeUnit, decodeUnit)
		var want []unitRec
		for i := range 200 {
			u := unitRec{group: fmt.Sprint("g", rand.IntN(9)), idx: i, value: rand.Float64(), tokens: rand.Int32N(9), ref: int32(i / 2), n: rand.Int32N(3), missing: i%5 == 0}
			want = append(want, u)
			if err := s.add(u); err != nil {
				t.Fatal(err)
			}
		}
		slices.SortFunc(want, func(a, b unitRec) int { return byGroup(&a, &b) })
		for range 2 {
			var got []unitRec
			if err := s.each(func(u *unitRec) error { got = append(got, *u); return nil }); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("run of %d: got %v, want %v", run, got[:5], want[:5])
			}
		}
		s.close()
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Fatalf("run of %d: %d files left", run, len(left))
		}
	}
}

// sameOutput fails t unless a streamed Build's samples got and result res
// are those of the in-memory Build want, byte for byte.
func sameOutput(t *testing.T, name string, got []*Sample, res, want *Result) {
	t.Helper()
	if res.Samples != nil {
		t.Fatalf("%s: streaming returned samples too", name)
	}
	if len(got) == 0 || len(got) != len(want.Samples) {
		t.Fatalf("%s: streamed %d samples, built %d", name, len(got), len(want.Samples))
	}
	for i := range got {
		a, _ := json.Marshal(got[i].ToRow())
		b, _ := json.Marshal(want.Samples[i].ToRow())
		if string(a) != string(b) {
			t.Fatalf("%s: sample %d differs:\n%s\n%s", name, i, a, b)
		}
	}
	if fmt.Sprint(res.Stats) != fmt.Sprint(want.Stats) {
		t.Fatalf("%s: stats differ:\n%+v\n%+v", name, res.Stats, want.Stats)
	}
}
