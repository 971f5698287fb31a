package storetest

import (
	"context"
	"math"
	"reflect"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// TrainingFixture writes the rollouts testTrainingSteps reads back:
//
//	group g1, task t1: r1 succeeded (2 verified calls, policy 1, rewards 0.2 then 1: the latest counts, an older "running" row),
//	                   r2 failed (1 failed call, policy 1, reward 0), r3 succeeded (1 call without ids, policy 2, no reward)
//	group g2, task t2: r4 queued (no call), r5 succeeded (1 verified call, policy 2, reward 0.5)
//	no group, task t3: r6 never registered (1 verified call, policy 2, reward 0.25)
//
// Every call has 10 prompt and 5 completion tokens; first calls start at
// 1000 (r1), 1200, 1300, 4000 (r5), 6000 (r6); r4 was registered at 5000.
// A reward of attempt "a9" of r1, which no call or registration names,
// makes no attempt.
func TrainingFixture(t *testing.T, s export.Store) {
	t.Helper()
	call := func(r string, seq uint64, start uint64, pv string, verified bool, failed bool, task string) export.Call {
		c := EmptyCall(r, "a1", seq)
		c.StartTimeUnixNano, c.EndTimeUnixNano = start, start+50
		c.PolicyVersion, c.TaskID = pv, task
		c.PromptTokens, c.CompletionTokens, c.HTTPStatus = 10, 5, 200
		if verified {
			c.TokenSource = export.TokenSourceEngine
		}
		if failed {
			c.HTTPStatus, c.Error = 500, "boom"
		}
		return c
	}
	ro := func(r, task, group, status string, upd uint64) export.Rollout {
		return export.Rollout{RolloutID: r, AttemptID: "a1", TaskID: task, GroupID: group, Status: status, Metadata: "{}", CreatedUnixNano: 900, UpdatedUnixNano: upd}
	}
	rw := func(r string, v float64, at uint64) export.Reward {
		return export.Reward{RolloutID: r, AttemptID: "a1", Name: "primary", Value: v, Source: "api", TimeUnixNano: at}
	}
	write(t, s, &export.Batch{
		Calls: []export.Call{
			call("r1", 1, 1000, "1", true, false, "t1"), call("r1", 2, 1100, "1", true, false, "t1"),
			call("r2", 1, 1200, "1", false, true, "t1"),
			call("r3", 1, 1300, "2", false, false, "t1"),
			call("r5", 1, 4000, "2", true, false, "t2"),
			call("r6", 1, 6000, "2", true, false, "t3"),
		},
		Rollouts: []export.Rollout{
			ro("r1", "t1", "g1", "running", 1050), ro("r1", "t1", "g1", "succeeded", 2000),
			ro("r2", "t1", "g1", "failed", 2000), ro("r3", "t1", "g1", "succeeded", 2000),
			ro("r4", "t2", "g2", "queued", 5000), ro("r5", "t2", "g2", "succeeded", 4500),
		},
		Rewards: []export.Reward{
			rw("r1", 0.2, 1500), rw("r1", 1, 2500), rw("r2", 0, 2500), rw("r5", 0.5, 4600), rw("r6", 0.25, 6100),
			{RolloutID: "r1", AttemptID: "a9", Name: "primary", Value: 7, TimeUnixNano: 9000},
			{RolloutID: "r3", AttemptID: "a1", SequenceID: 1, Name: "primary", Value: 9, TimeUnixNano: 1400}, // a step reward: not the episode's
		},
	})
}

func testTrainingSteps(t *testing.T, s export.Store) {
	ctx := context.Background()
	TrainingFixture(t, s)
	read := func(q export.TrainingQuery) []export.TrainingStep {
		t.Helper()
		got, err := s.TrainingSteps(ctx, q)
		if err != nil {
			t.Fatalf("TrainingSteps(%+v): %v", q, err)
		}
		return got
	}
	check := func(what string, got, want []export.TrainingStep) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d steps, want %d: %+v", what, len(got), len(want), got)
		}
		for i := range want {
			g := got[i]
			// Float sums may differ in the last bit between stores.
			for _, f := range []*float64{&g.RewardSum, &g.RewardSumSq} {
				*f = math.Round(*f*1e9) / 1e9
			}
			if !reflect.DeepEqual(g, want[i]) {
				t.Errorf("%s step %d:\n got %+v\nwant %+v", what, i, g, want[i])
			}
		}
	}
	check("by policy", read(export.TrainingQuery{By: export.TrainingByPolicy, Limit: 10}), []export.TrainingStep{
		{PolicyVersion: "", TaskID: "t2", FirstStart: 5000, LastStart: 5000, LastActivity: 5000, Attempts: 1},
		{PolicyVersion: "2", TaskID: "t3", FirstStart: 1300, LastStart: 6000, LastActivity: 6100, Attempts: 3, Succeeded: 2, FinishedNoReward: 1, Rewarded: 2,
			RewardSum: 0.75, RewardSumSq: 0.3125, RewardMin: 0.25, RewardMax: 0.5, Calls: 3, VerifiedCalls: 2, PromptTokens: 30, CompletionTokens: 15},
		{PolicyVersion: "1", TaskID: "t1", FirstStart: 1000, LastStart: 1200, LastActivity: 2500, Attempts: 2, Succeeded: 1, Failed: 1, Rewarded: 2,
			RewardSum: 1, RewardSumSq: 1, RewardMin: 0, RewardMax: 1, Calls: 3, FailedCalls: 1, VerifiedCalls: 2, PromptTokens: 30, CompletionTokens: 15},
	})
	g1 := export.TrainingStep{GroupID: "g1", TaskID: "t1", FirstStart: 1000, LastStart: 1300, LastActivity: 2500, Attempts: 3, Succeeded: 2, Failed: 1, FinishedNoReward: 1, Rewarded: 2,
		RewardSum: 1, RewardSumSq: 1, RewardMin: 0, RewardMax: 1, Calls: 4, FailedCalls: 1, VerifiedCalls: 2, PromptTokens: 40, CompletionTokens: 20}
	check("by group", read(export.TrainingQuery{By: export.TrainingByGroup, Limit: 10}), []export.TrainingStep{
		{TaskID: "t3", FirstStart: 6000, LastStart: 6000, LastActivity: 6100, Attempts: 1, Rewarded: 1,
			RewardSum: 0.25, RewardSumSq: 0.0625, RewardMin: 0.25, RewardMax: 0.25, Calls: 1, VerifiedCalls: 1, PromptTokens: 10, CompletionTokens: 5},
		{GroupID: "g2", TaskID: "t2", FirstStart: 4000, LastStart: 5000, LastActivity: 5000, Attempts: 2, Succeeded: 1, Rewarded: 1,
			RewardSum: 0.5, RewardSumSq: 0.25, RewardMin: 0.5, RewardMax: 0.5, Calls: 1, VerifiedCalls: 1, PromptTokens: 10, CompletionTokens: 5},
		g1,
	})
	check("by group, limit 1", read(export.TrainingQuery{By: export.TrainingByGroup, Limit: 1}), []export.TrainingStep{
		{TaskID: "t3", FirstStart: 6000, LastStart: 6000, LastActivity: 6100, Attempts: 1, Rewarded: 1,
			RewardSum: 0.25, RewardSumSq: 0.0625, RewardMin: 0.25, RewardMax: 0.25, Calls: 1, VerifiedCalls: 1, PromptTokens: 10, CompletionTokens: 5},
	})
	// A window on the first call: r1 (1000) and r4 (registered at 5000) fall out.
	check("by group, [1100, 5000)", read(export.TrainingQuery{By: export.TrainingByGroup, Since: 1100, Until: 5000, Limit: 10}), []export.TrainingStep{
		{GroupID: "g2", TaskID: "t2", FirstStart: 4000, LastStart: 4000, LastActivity: 4600, Attempts: 1, Succeeded: 1, Rewarded: 1,
			RewardSum: 0.5, RewardSumSq: 0.25, RewardMin: 0.5, RewardMax: 0.5, Calls: 1, VerifiedCalls: 1, PromptTokens: 10, CompletionTokens: 5},
		{GroupID: "g1", TaskID: "t1", FirstStart: 1200, LastStart: 1300, LastActivity: 2500, Attempts: 2, Succeeded: 1, Failed: 1, FinishedNoReward: 1, Rewarded: 1,
			RewardSum: 0, RewardSumSq: 0, RewardMin: 0, RewardMax: 0, Calls: 2, FailedCalls: 1, PromptTokens: 20, CompletionTokens: 10},
	})
	if m, sd := g1.RewardMean(), g1.RewardStd(); m != 0.5 || sd != 0.5 {
		t.Errorf("g1 mean, std = %v, %v; want 0.5, 0.5", m, sd)
	}
	for _, bad := range []export.TrainingQuery{{By: "step", Limit: 1}, {By: export.TrainingByPolicy}, {By: export.TrainingByPolicy, Limit: export.MaxTrainingSteps + 1},
		{By: export.TrainingByGroup, Limit: 1, Since: 5, Until: 5}} {
		if _, err := s.TrainingSteps(ctx, bad); err == nil {
			t.Errorf("TrainingSteps(%+v): no error", bad)
		}
	}
}

// testTrainingRolloutRewards: an episode reward posted without attempt_id
// (POST /api/v1/rollouts/{r}/rewards {"value":1}) is the rollout's and
// counts for every attempt of the rollout, as the trainer bridge counts it:
// an attempt's reward is the latest by time of its own and its rollout's,
// its own on a tie. Each rollout is its own step (policy version = rollout).
func testTrainingRolloutRewards(t *testing.T, s export.Store) {
	ctx := context.Background()
	var b export.Batch
	attempt := func(r, a string, start uint64, status string) {
		c := EmptyCall(r, a, 1)
		c.StartTimeUnixNano, c.EndTimeUnixNano, c.PolicyVersion, c.TaskID, c.HTTPStatus = start, start+50, r, "t", 200
		b.Calls = append(b.Calls, c)
		if status != "" {
			b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: r, AttemptID: a, TaskID: "t", Status: status, Metadata: "{}", CreatedUnixNano: start - 10, UpdatedUnixNano: start + 100})
		}
	}
	reward := func(r, a string, v float64, at uint64) {
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: r, AttemptID: a, Name: "primary", Value: v, Source: "api", TimeUnixNano: at})
	}
	// q1: rollout-level rewards only (the latest of two counts).
	attempt("q1", "a1", 1000, "succeeded")
	reward("q1", "", 0.8, 1200)
	reward("q1", "", 0.5, 1300)
	// q2: its own reward, then a later rollout-level one: the later counts.
	attempt("q2", "a1", 2000, "succeeded")
	reward("q2", "a1", 0.1, 2200)
	reward("q2", "", 0.9, 2300)
	// q3: a rollout-level reward, then a later own one: the later counts.
	attempt("q3", "a1", 3000, "succeeded")
	reward("q3", "", 0.7, 3200)
	reward("q3", "a1", 0.3, 3300)
	// q4: both at the same time: the attempt's own counts.
	attempt("q4", "a1", 4000, "failed")
	reward("q4", "", 0.6, 4200)
	reward("q4", "a1", 0.4, 4200)
	// q5: two attempts; a2 has a later reward of its own.
	attempt("q5", "a1", 5000, "failed")
	attempt("q5", "a2", 5100, "succeeded")
	reward("q5", "", 1, 5300)
	reward("q5", "a2", 0.2, 5400)
	// q6: never registered (calls only), rewarded without attempt_id.
	attempt("q6", "a1", 6000, "")
	reward("q6", "", 0.25, 6200)
	// A rollout-level reward of a rollout without attempts makes none, and
	// a step reward without attempt_id is not the episode's.
	reward("q7", "", 3, 7000)
	b.Rewards = append(b.Rewards, export.Reward{RolloutID: "q1", SequenceID: 1, Name: "primary", Value: 9, TimeUnixNano: 1400})
	write(t, s, &b)

	got, err := s.TrainingSteps(ctx, export.TrainingQuery{By: export.TrainingByPolicy, Limit: 10})
	if err != nil {
		t.Fatalf("TrainingSteps: %v", err)
	}
	type rewards struct {
		Attempts, Rewarded, FinishedNoReward int
		Sum, Min, Max                        float64
		LastActivity                         uint64
	}
	want := map[string]rewards{
		"q1": {1, 1, 0, 0.5, 0.5, 0.5, 1300},
		"q2": {1, 1, 0, 0.9, 0.9, 0.9, 2300},
		"q3": {1, 1, 0, 0.3, 0.3, 0.3, 3300},
		"q4": {1, 1, 0, 0.4, 0.4, 0.4, 4200},
		"q5": {2, 2, 0, 1.2, 0.2, 1, 5400},
		"q6": {1, 1, 0, 0.25, 0.25, 0.25, 6200},
	}
	if len(got) != len(want) {
		t.Errorf("%d steps, want %d: %+v", len(got), len(want), got)
	}
	for _, st := range got {
		g := rewards{st.Attempts, st.Rewarded, st.FinishedNoReward, math.Round(st.RewardSum*1e9) / 1e9, st.RewardMin, st.RewardMax, st.LastActivity}
		if w, ok := want[st.PolicyVersion]; !ok || g != w {
			t.Errorf("step %q: got %+v, want %+v", st.PolicyVersion, g, w)
		}
	}
}
