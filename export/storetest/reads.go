package storetest

import (
	"context"
	"reflect"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// readsFixture writes what the typed reads are checked against: rollout
// r1 (group g, two attempts: a1 with two calls, one failed, then a2
// registered later with one call and a reward), r2 (group g, registered
// only, status updated twice), r3 (calls only, agent "other", an episode
// reward posted without attempt_id), calls attributed to no rollout, and
// agent spans.
func readsFixture(t *testing.T, s export.Store) {
	call := func(ro, at, span string, seq uint64, start uint64) export.Call {
		return export.Call{SpanID: span, RolloutID: ro, AttemptID: at, TaskID: "t", AgentName: "ag", PolicyVersion: "1", SequenceID: seq,
			StartTimeUnixNano: start, EndTimeUnixNano: start + 5, Endpoint: "/v1/chat/completions", HTTPStatus: 200,
			RequestBody: "12345", ResponseBody: "123", TokenSource: export.TokenSourceEngine, PromptTokens: 3, CompletionTokens: 2}
	}
	first := call("r1", "a1", "s1", 1, 100)
	first.ResponseTokenIDs = []uint32{7, 8}
	failed := call("r1", "a1", "s2", 2, 110)
	failed.HTTPStatus, failed.Error = 500, "boom"
	other := call("r3", "x", "s5", 1, 300)
	other.AgentName, other.TaskID = "other", "t3"
	embed := call("r1", "a2", "s6", 2, 220)
	embed.Endpoint = "embeddings"
	write(t, s, &export.Batch{
		Calls: []export.Call{first, failed, call("r1", "a2", "s3", 1, 200), embed, other,
			call("", "", "s7", 0, 50), call("", "", "s8", 0, 60)},
		Rollouts: []export.Rollout{
			{RolloutID: "r1", AttemptID: "a1", TaskID: "t", GroupID: "g", Status: "failed", UpdatedUnixNano: 150},
			{RolloutID: "r1", AttemptID: "a2", TaskID: "t", GroupID: "g", Status: "succeeded", UpdatedUnixNano: 250},
			{RolloutID: "r2", AttemptID: "b1", TaskID: "t2", GroupID: "g", Status: "queued", UpdatedUnixNano: 400},
			{RolloutID: "r2", AttemptID: "b1", TaskID: "t2", GroupID: "g", Status: "running", UpdatedUnixNano: 410},
		},
		Rewards: []export.Reward{
			{RolloutID: "r1", AttemptID: "a1", Name: "primary", Value: 0.25, Source: "api", TimeUnixNano: 160},
			{RolloutID: "r1", AttemptID: "a2", Name: "primary", Value: 0.75, Source: "api", TimeUnixNano: 260},
			{RolloutID: "r1", AttemptID: "a2", SequenceID: 1, Name: "step", Value: 0.5, Source: "api", TimeUnixNano: 261},
			{RolloutID: "r3", Name: "primary", Value: 1.5, Source: "api", TimeUnixNano: 310},
		},
		Spans: []export.Span{
			{RolloutID: "r1", AttemptID: "a1", TraceID: "t", SpanID: "sp1", ToolName: "grep", StatusCode: "error", StartTimeUnixNano: 120},
			{RolloutID: "r1", AttemptID: "a1", TraceID: "t", SpanID: "sp2", ToolName: "grep", StatusCode: "ok", StartTimeUnixNano: 121},
			{RolloutID: "", TraceID: "t", SpanID: "sp3", ToolName: "grep", StatusCode: "error", StartTimeUnixNano: 122},
		},
	})
}

// testReadsPage checks RolloutPage (the viewer's list) against readsFixture.
func testReadsPage(t *testing.T, s export.Store) {
	ctx := context.Background()
	readsFixture(t, s)

	page := func(q export.RolloutPageQuery) ([]string, bool) {
		t.Helper()
		if q.Limit == 0 {
			q.Limit = 10
		}
		rows, more, err := s.RolloutPage(ctx, q)
		if err != nil {
			t.Fatalf("RolloutPage(%+v): %v", q, err)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.RolloutID)
		}
		return ids, more
	}
	for _, tc := range []struct {
		q    export.RolloutPageQuery
		want []string
		more bool
	}{
		{export.RolloutPageQuery{}, []string{"r2", "r3", "r1", ""}, false},
		{export.RolloutPageQuery{Limit: 2}, []string{"r2", "r3"}, true},
		{export.RolloutPageQuery{Before: 300, BeforeID: "r3"}, []string{"r1", ""}, false},
		{export.RolloutPageQuery{TaskID: "t"}, []string{"r1", ""}, false},
		{export.RolloutPageQuery{GroupID: "g"}, []string{"r2", "r1"}, false},
		{export.RolloutPageQuery{Status: "running"}, []string{"r2"}, false},
		{export.RolloutPageQuery{AgentName: "other"}, []string{"r3"}, false},
		{export.RolloutPageQuery{PolicyVersion: "1", Until: 201}, []string{"r1", ""}, false},
		{export.RolloutPageQuery{Since: 250, Until: 400}, []string{"r3", "r1"}, false},
	} {
		if ids, more := page(tc.q); !reflect.DeepEqual(ids, tc.want) || more != tc.more {
			t.Errorf("RolloutPage(%+v) = %q, more %v; want %q, more %v", tc.q, ids, more, tc.want, tc.more)
		}
	}
	if _, _, err := s.RolloutPage(ctx, export.RolloutPageQuery{}); err == nil {
		t.Error("RolloutPage with limit 0: no error")
	}
	rows, _, err := s.RolloutPage(ctx, export.RolloutPageQuery{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]export.RolloutSummary{
		"r1": {RolloutID: "r1", TaskID: "t", GroupID: "g", AttemptID: "a2", Status: "succeeded", Reward: 0.75, Rewarded: true,
			Calls: 4, Errors: 1, VerifiedCalls: 3, PromptTokens: 12, CompletionTokens: 8, FirstStart: 100, LastActivity: 250},
		"r2": {RolloutID: "r2", TaskID: "t2", GroupID: "g", AttemptID: "b1", Status: "running", LastActivity: 410},
		"r3": {RolloutID: "r3", TaskID: "t3", AttemptID: "x", Reward: 1.5, Rewarded: true, Calls: 1, VerifiedCalls: 1,
			PromptTokens: 3, CompletionTokens: 2, FirstStart: 300, LastActivity: 300},
	}
	for _, r := range rows {
		if w, ok := want[r.RolloutID]; ok && r != w {
			t.Errorf("RolloutPage row %s:\n got %+v\nwant %+v", r.RolloutID, r, w)
		}
	}

}

// testReadsRollout checks RolloutAttempts, AttemptTotals and GroupMembers (the viewer's rollout and group pages) against readsFixture.
func testReadsRollout(t *testing.T, s export.Store) {
	ctx := context.Background()
	readsFixture(t, s)
	l, err := s.RolloutAttempts(ctx, "r1", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Attempts) != 2 || l.Attempts[0].AttemptID != "a1" || l.Attempts[1].Status != "succeeded" || l.Latest != "a2" || !l.Found {
		t.Errorf("RolloutAttempts(r1) = %+v", l)
	}
	if l, err = s.RolloutAttempts(ctx, "r2", 10); err != nil || len(l.Attempts) != 1 || l.Attempts[0].Status != "running" || l.Latest != "b1" {
		t.Errorf("RolloutAttempts(r2) = %+v, %v: want b1 running (the later row)", l, err)
	}
	if l, err = s.RolloutAttempts(ctx, "nope", 10); err != nil || l.Found || len(l.Attempts) != 0 {
		t.Errorf("RolloutAttempts(nope) = %+v, %v", l, err)
	}

	n, rewards, err := s.AttemptTotals(ctx, export.AttemptTotalsQuery{RolloutID: "r1", AttemptID: "a2", FirstSeq: 1, LastSeq: 1, MaxRewards: 10})
	if err != nil || n != 2 || len(rewards) != 2 || rewards[0].Value != 0.75 || rewards[1].Name != "step" || rewards[1].SequenceID != 1 {
		t.Errorf("AttemptTotals(r1/a2) = %d, %+v, %v; want 2 calls, the episode reward and step 1's", n, rewards, err)
	}
	if n, rewards, err = s.AttemptTotals(ctx, export.AttemptTotalsQuery{RolloutID: "r3", AttemptID: "x", FirstSeq: 1, LastSeq: 0, MaxRewards: 10}); err != nil ||
		n != 1 || len(rewards) != 1 || rewards[0].Value != 1.5 {
		t.Errorf("AttemptTotals(r3/x) = %d, %+v, %v; want 1 call and the rollout's reward", n, rewards, err)
	}

	members, err := s.GroupMembers(ctx, "g")
	if err != nil || len(members) != 2 || members[0].RolloutID != "r1" || members[0].AttemptID != "a2" || members[1].Status != "running" {
		t.Errorf("GroupMembers(g) = %+v, %v", members, err)
	}

}

// testReadsBridge checks the trainer bridge's reads: EachRolloutState, EachAttemptCalls, FailedToolSpans against readsFixture.
func testReadsBridge(t *testing.T, s export.Store) {
	ctx := context.Background()
	readsFixture(t, s)
	var states []string
	if err := s.EachRolloutState(ctx, func(r *export.Rollout) error {
		if r.Status != "queued" { // a replaced row, which a merge may have removed
			states = append(states, r.RolloutID+"/"+r.AttemptID+"/"+r.Status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"r1/a1/failed", "r1/a2/succeeded", "r2/b1/running"}; !reflect.DeepEqual(states, want) {
		t.Errorf("EachRolloutState: %q, want %q", states, want)
	}
	var calls []export.AttemptCalls
	if err := s.EachAttemptCalls(ctx, func(a export.AttemptCalls) error {
		calls = append(calls, a)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wantCalls := []export.AttemptCalls{{Calls: 2, TaskID: "t", FirstStart: 50}, {RolloutID: "r1", AttemptID: "a1", TaskID: "t", FirstStart: 100, Calls: 2},
		{RolloutID: "r1", AttemptID: "a2", TaskID: "t", FirstStart: 200, Calls: 2}, {RolloutID: "r3", AttemptID: "x", TaskID: "t3", FirstStart: 300, Calls: 1}}
	if !reflect.DeepEqual(calls, wantCalls) {
		t.Errorf("EachAttemptCalls:\n got %+v\nwant %+v", calls, wantCalls)
	}

	spans, err := s.FailedToolSpans(ctx)
	if err != nil || len(spans) != 1 || spans[0].SpanID != "sp1" || spans[0].ToolName != "grep" || spans[0].StartTimeUnixNano != 120 {
		t.Errorf("FailedToolSpans = %+v, %v", spans, err)
	}

}

// testReadsCalls checks CallHeads and AttemptFirstEnds (AGL's events), CallChecks and StoreVersion against readsFixture.
func testReadsCalls(t *testing.T, s export.Store) {
	ctx := context.Background()
	readsFixture(t, s)
	heads, err := s.CallHeads(ctx, export.CallHeadQuery{RolloutID: "r1", AttemptID: "a1", Since: 100})
	wantHeads := []export.CallHead{{SpanID: "s1", SequenceID: 1, EndTimeUnixNano: 105, BodyBytes: 8}, {SpanID: "s2", SequenceID: 2, EndTimeUnixNano: 115, BodyBytes: 8}}
	if err != nil || !reflect.DeepEqual(heads, wantHeads) {
		t.Errorf("CallHeads(r1/a1) = %+v, %v; want %+v", heads, err, wantHeads)
	}
	if heads, err = s.CallHeads(ctx, export.CallHeadQuery{RolloutID: "r1", AttemptID: "a1", Since: 101}); err != nil || len(heads) != 1 {
		t.Errorf("CallHeads since 101 = %+v, %v; want the second call alone", heads, err)
	}
	ends, err := s.AttemptFirstEnds(ctx, export.CallHeadQuery{RolloutID: "r1"})
	if want := map[string]uint64{"a1": 105, "a2": 205}; err != nil || !reflect.DeepEqual(ends, want) {
		t.Errorf("AttemptFirstEnds(r1) = %v, %v; want %v (the embedding call left out)", ends, err, want)
	}

	checks, err := s.CallChecks(ctx, export.RolloutRange{From: "r1", To: "r2"})
	if err != nil || len(checks) != 4 {
		t.Fatalf("CallChecks(r1..r2) = %+v, %v; want r1's 4 calls", checks, err)
	}
	for _, c := range checks {
		if want := map[bool]int{true: 2}[c.SpanID == "s1"]; c.RolloutID != "r1" || c.ResponseTokens != want || c.CompletionTokens != 2 || c.TokenSource != export.TokenSourceEngine {
			t.Errorf("CallChecks row %+v: want r1's, %d response ids", c, want)
		}
	}

	v1, err := s.StoreVersion(ctx)
	if err != nil || v1 == "" {
		t.Fatalf("StoreVersion = %q, %v", v1, err)
	}
	write(t, s, &export.Batch{Rewards: []export.Reward{{RolloutID: "r2", Name: "primary", Value: 1, TimeUnixNano: 500}}})
	if v2, err := s.StoreVersion(ctx); err != nil || v2 == v1 {
		t.Errorf("StoreVersion after a reward = %q, %v; was %q", v2, err, v1)
	}
}

// hostile are filter values that must reach SQL as exactly themselves.
var hostile = []string{"it's", `back\slash`, `\'`, "a?b", "?", `'; DROP TABLE llm_calls; --`, "ünï€😀", "a\nb\tc\r\x01", "%", "_", "''"}

// testReadsHostileValues stores rollouts whose task and group are hostile
// values and reads each back by exactly that value: bound parameters, never
// spliced SQL.
func testReadsHostileValues(t *testing.T, s export.Store) {
	ctx := context.Background()
	var b export.Batch
	for i, v := range hostile {
		id := v + "#"
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: id, AttemptID: v, TaskID: v, GroupID: v, Status: "running", UpdatedUnixNano: uint64(i + 1)})
		b.Calls = append(b.Calls, export.Call{SpanID: "s" + v, RolloutID: id, AttemptID: v, TaskID: v, AgentName: v, PolicyVersion: v,
			StartTimeUnixNano: uint64(i + 1), EndTimeUnixNano: uint64(i + 2)})
	}
	write(t, s, &b)
	for _, v := range hostile {
		for _, q := range []export.RolloutPageQuery{{TaskID: v}, {GroupID: v}, {AgentName: v}, {PolicyVersion: v}} {
			q.Limit = 100
			rows, _, err := s.RolloutPage(ctx, q)
			if err != nil || len(rows) != 1 || rows[0].RolloutID != v+"#" {
				t.Errorf("RolloutPage(%#v) = %+v, %v; want the rollout %q alone", q, rows, err, v+"#")
			}
		}
		if rows, _, err := s.RolloutPage(ctx, export.RolloutPageQuery{Before: 1000, BeforeID: v + "#", Limit: 100}); err != nil {
			t.Errorf("RolloutPage(before id %q): %v", v+"#", err)
		} else {
			for _, r := range rows {
				if r.RolloutID >= v+"#" && r.LastActivity == 1000 {
					t.Errorf("RolloutPage(before id %q) returned %q", v+"#", r.RolloutID)
				}
			}
		}
		if m, err := s.GroupMembers(ctx, v); err != nil || len(m) != 1 || m[0].AttemptID != v {
			t.Errorf("GroupMembers(%q) = %+v, %v", v, m, err)
		}
		if l, err := s.RolloutAttempts(ctx, v+"#", 10); err != nil || !l.Found || l.Latest != v {
			t.Errorf("RolloutAttempts(%q) = %+v, %v", v+"#", l, err)
		}
		if h, err := s.CallHeads(ctx, export.CallHeadQuery{RolloutID: v + "#", AttemptID: v}); err != nil || len(h) != 1 || h[0].SpanID != "s"+v {
			t.Errorf("CallHeads(%q) = %+v, %v", v, h, err)
		}
	}
}
