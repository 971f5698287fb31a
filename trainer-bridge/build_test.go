package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

const weatherTools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`

func body(toolResults ...string) string {
	msgs := []string{`{"role":"user","content":"weather?"}`}
	for i := 0; i+1 < len(toolResults); i += 2 {
		msgs = append(msgs, `{"role":"assistant","content":null,"tool_calls":[{"id":"`+toolResults[i]+`","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`,
			`{"role":"tool","tool_call_id":"`+toolResults[i]+`","content":"`+toolResults[i+1]+`"}`)
	}
	return `{"model":"m","messages":[` + strings.Join(msgs, ",") + `],` + weatherTools + `}`
}

const toolCall = `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`

type cs struct {
	ro, at, task, agent string
	seq                 uint64
	prompt, resp        []uint32
	lp                  []float32
	req, msg, finish    string
	src, errMsg, pv     string
}

func (c cs) call() export.Call {
	status := uint16(200)
	if c.errMsg != "" {
		status = 500
	}
	src := c.src
	if src == "" {
		src = export.TokenSourceEngine
	}
	pv := c.pv
	if pv == "" {
		pv = "v2"
	}
	if c.req == "" {
		c.req = body()
	}
	if c.msg == "" {
		c.msg = `{"role":"assistant","content":"answer ` + fmt.Sprint(c.seq) + `"}`
	}
	if c.finish == "" {
		c.finish = "stop"
	}
	return export.Call{SpanID: fmt.Sprintf("%s-%s-%d", c.ro, c.at, c.seq), RolloutID: c.ro, AttemptID: c.at, TaskID: c.task, AgentName: c.agent,
		SequenceID: c.seq, StartTimeUnixNano: 1_000 + c.seq, HTTPStatus: status, Error: c.errMsg, Endpoint: "/v1/chat/completions",
		Model: "m", PolicyVersion: pv, RequestBody: c.req, ResponseMessage: c.msg, PromptTokenIDs: c.prompt, ResponseTokenIDs: c.resp,
		ResponseLogprobs: c.lp, TokenSource: src, FinishReason: c.finish, PromptTokens: uint32(len(c.prompt)), CompletionTokens: uint32(len(c.resp))}
}

// fill writes the scenario described in TestBuild to a fresh SQLite store.
func fill(t *testing.T) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "bridge.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	calls := []cs{
		{ro: "r1", at: "a1", task: "t1", agent: "solver", seq: 1, prompt: []uint32{1, 2, 3}, resp: []uint32{9}},
		{ro: "r1", at: "a2", task: "t1", agent: "solver", seq: 1, prompt: []uint32{1, 2, 3}, resp: []uint32{10, 11}, lp: []float32{-0.1, -0.2}, msg: toolCall, finish: "tool_calls"},
		{ro: "r1", at: "a2", task: "t1", agent: "solver", seq: 2, prompt: []uint32{1, 2, 3, 10, 11, 20, 21}, resp: []uint32{12}, lp: []float32{-0.3}, req: body("c1", "Error: city not found")},
		{ro: "r1", at: "a2", task: "t1", agent: "critic", seq: 3, prompt: []uint32{5, 6}, resp: []uint32{7}},
		{ro: "r2", at: "a1", task: "t1", agent: "solver", seq: 1, prompt: []uint32{1, 2, 3}, resp: []uint32{13, 14, 15, 16}, lp: []float32{-1, -1, -1, -1}, msg: toolCall, finish: "tool_calls"},
		{ro: "r2", at: "a1", task: "t1", agent: "solver", seq: 2, prompt: []uint32{1, 2, 3, 13, 99, 22}, resp: []uint32{17}, lp: []float32{-2}, req: body("c1", "sunny"), finish: "length"},
		{ro: "r2", at: "a1", task: "t1", agent: "solver", seq: 3, prompt: []uint32{1}, errMsg: "upstream 500", msg: "{}"},
		{ro: "r3", at: "a1", task: "t1", agent: "solver", seq: 1, prompt: []uint32{1, 2, 3}, resp: []uint32{18}, src: export.TokenSourceRetokenized},
		{ro: "r3", at: "a1", task: "t1", agent: "solver", seq: 2, prompt: []uint32{1, 2, 3}, resp: []uint32{19}, pv: "v1"},
		{ro: "r4", at: "a1", task: "t2", agent: "solver", seq: 1, prompt: []uint32{4}, resp: []uint32{40, 41}, lp: []float32{-0.5, -0.5}},
		{ro: "r5", at: "a1", task: "t2", agent: "solver", seq: 1, prompt: []uint32{4}, resp: []uint32{40}},
		{ro: "r6", at: "a1", task: "t2", agent: "solver", seq: 1, prompt: []uint32{4}, resp: []uint32{42}},
	}
	b := &export.Batch{}
	for _, c := range calls {
		b.Calls = append(b.Calls, c.call())
	}
	ro := func(id, at, task, status string, upd uint64) export.Rollout {
		return export.Rollout{RolloutID: id, AttemptID: at, TaskID: task, Status: status, Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: upd}
	}
	b.Rollouts = []export.Rollout{
		ro("r1", "a1", "t1", "failed", 5), ro("r1", "a2", "t1", "succeeded", 9),
		ro("r2", "a1", "t1", "succeeded", 5), ro("r3", "a1", "t1", "succeeded", 5),
		ro("r4", "a1", "t2", "succeeded", 5), ro("r5", "a1", "t2", "running", 5), ro("r6", "a1", "t2", "succeeded", 5),
	}
	rw := func(id, at string, seq uint64, v float64, tm uint64) export.Reward {
		return export.Reward{RolloutID: id, AttemptID: at, SequenceID: seq, Name: "primary", Value: v, Source: "api", TimeUnixNano: tm}
	}
	b.Rewards = []export.Reward{
		rw("r1", "a1", 0, -1, 1), rw("r1", "a2", 0, 0.2, 1), rw("r1", "a2", 0, 1, 2), // the last one wins
		rw("r2", "", 0, 0.5, 1), rw("r3", "a1", 0, 0, 1),
		rw("r4", "a1", 0, 2, 1), rw("r4", "a1", 1, 0.25, 1), // a process reward on call 1
		rw("r5", "a1", 0, 3, 1),
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return s
}

func options(t *testing.T) Options {
	e, err := air.New(air.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The mechanics these tests check value by value, under the policies
	// they were written for (succeeded attempts only, unrewarded ones
	// dropped, zero logprobs allowed, groups of one kept); the defaults are
	// checked by TestBuildDefaults.
	sel := DefaultSelection()
	sel.Statuses = []string{"succeeded"}
	sel.AgentName = regexp.MustCompile(`^solver$`)
	sel.MinPolicyVersion = "v2"
	return Options{Selection: sel, Estimator: advantage.GRPO, AIR: e, Now: func() time.Time { return time.Unix(0, 77) },
		MissingReward: MissingDrop, Logprobs: LogprobsOmit, MinGroupSize: 1, GroupBy: GroupTask}
}

// sp prints its operands separated by spaces.
func sp(a ...any) string { return strings.TrimSuffix(fmt.Sprintln(a...), "\n") }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// TestBuild checks a transitions run value by value.
//
// AIR: r1/a2 call 1's tool result (in request 2) is "Error: ..." -> -0.5 on seq 1;
// r2 call 2 is truncated -> -0.5 on seq 2; r2 call 3 is a backend error -> -1 on seq 3.
// Identical credit, G_t = R + p_t:
//
//	r1/a2 (R=1, the later of 0.2 and 1): seq1 1-0.5 = 0.5, seq2 1; critic excluded by agent regex
//	r2    (R=0.5, posted without attempt): seq1 0.5, seq2 0.5-0.5 = 0; seq3 errored
//	r3: seq1 retokenized (unverified), seq2 policy v1 < v2 -> no sample
//	r4    (R=2, p1=0.25): seq1 2.25
//	r5 running (not selected); r6 no reward; r1/a1 failed (not selected)
//
// Rollout-level GRPO scores R + sum p: r1 0.5, r2 0.5-1.5 = -1, r3 0 (group t1:
// r3 gives no sample, but it was sampled, so its score stays in the baseline),
// r4 2.25 (t2, alone). t1: mean -1/6, unbiased var ((2/3)^2 + (5/6)^2 + (1/6)^2)/2
// = 7/12, A(r1) = (2/3)/(std+1e-6), A(r2) = (-5/6)/(std+1e-6); t2: A(r4) = 2.25/(1+1e-6).
func TestBuild(t *testing.T) {
	s := fill(t)
	ctx := context.Background()
	res, err := Build(ctx, s, options(t))
	if err != nil {
		t.Fatal(err)
	}
	std := math.Sqrt(7.0 / 12)
	a1, a2 := (2.0/3)/(std+1e-6), (-5.0/6)/(std+1e-6)
	want := []struct {
		ro        string
		seq       uint64
		reward    float64
		advantage float64
	}{{"r1", 1, 0.5, a1}, {"r1", 2, 1, a1}, {"r2", 1, 0.5, a2}, {"r2", 2, 0, a2}, {"r4", 1, 2.25, 2.25 / (1 + 1e-6)}}
	if len(res.Samples) != len(want) {
		t.Fatalf("%d samples: %+v", len(res.Samples), res.Samples)
	}
	for i, w := range want {
		g := res.Samples[i]
		if g.RolloutID != w.ro || g.SequenceIDs[0] != w.seq || !near(g.Reward, w.reward) || !near(g.Advantage, w.advantage) {
			t.Errorf("sample %d: %s/%v reward %v adv %v, want %+v", i, g.RolloutID, g.SequenceIDs, g.Reward, g.Advantage, w)
		}
	}
	if g := res.Samples[1]; sp(g.Prompt, g.Response, g.ResponseMask, g.Logprobs, g.GroupUID, g.AttemptID) != "[1 2 3 10 11 20 21] [12] [1] [-0.3] t1 a2" {
		t.Errorf("r1 seq2: %v %v %v %v %v %v", g.Prompt, g.Response, g.ResponseMask, g.Logprobs, g.GroupUID, g.AttemptID)
	}
	st := res.Stats
	wantExcl := map[string]int{ExclAgent: 1, ExclErrored: 1, ExclUnverified: 1, ExclPolicyVersion: 1, ExclNoSample: 1, ExclNoReward: 1}
	// no_sample is r3 (no usable call); r6 counts only as no_reward.
	if fmt.Sprint(st.Excluded) != fmt.Sprint(wantExcl) {
		t.Errorf("excluded %v, want %v", st.Excluded, wantExcl)
	}
	if st.Attempts != 5 || st.Calls != 10 || st.Samples != 5 || st.Groups != 2 {
		t.Errorf("stats %+v", st)
	}
	if fmt.Sprint(st.AIRHits) != "map[air_backend_error:1 air_tool_failure:1 air_truncated:1]" {
		t.Errorf("AIR hits %v", st.AIRHits)
	}
	if ts := st.Tasks["t1"]; ts.Samples != 4 || !near(ts.Mean, 0.5) {
		t.Errorf("task stats %+v", ts)
	}

	var buf bytes.Buffer
	if err := WriteJSONL(&buf, res.Samples); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("%d lines", len(lines))
	}
	var row map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &row); err != nil {
		t.Fatal(err)
	}
	if sp(row["response_mask"], row["response_ids"], row["uid"], row["reward"], row["sequence_ids"]) != "[1 1] [10 11] t1 0.5 [1]" {
		t.Errorf("jsonl row %s", lines[0])
	}
}

// TestBuildTrajectories: r1/a2's two solver calls merge (prompt 2 = prompt 1 +
// response 1 + observation [20 21]); r2's second prompt keeps prompt 1 but
// rewrites response 1 (13 99 ... instead of 13 14 15 16): a retokenization break.
// Identical credit: sample reward R + sum of its calls' process rewards.
func TestBuildTrajectories(t *testing.T) {
	s := fill(t)
	o := options(t)
	o.Mode, o.Estimator = ModeTrajectories, advantage.None
	res, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range res.Samples {
		got = append(got, sp(g.RolloutID, g.SequenceIDs, g.Prompt, g.Response, g.ResponseMask, g.Logprobs, g.Reward, g.Advantage))
	}
	want := []string{
		// advantage none at rollout level = the rollout score (R + sum p): r1 0.5, r2 -1, r4 2.25
		"r1 [1 2] [1 2 3] [10 11 20 21 12] [1 1 0 0 1] [-0.1 -0.2 0 0 -0.3] 0.5 0.5",
		"r2 [1] [1 2 3] [13 14 15 16] [1 1 1 1] [-1 -1 -1 -1] 0.5 -1",
		"r2 [2] [1 2 3 13 99 22] [17] [1] [-2] 0 -1",
		"r4 [1] [4] [40 41] [1 1] [-0.5 -0.5] 2.25 2.25",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Stats.Merged != 1 || fmt.Sprint(res.Stats.Breaks) != "map[retokenization:1]" {
		t.Fatalf("merged %d breaks %v", res.Stats.Merged, res.Stats.Breaks)
	}

	// Truncation: responses over 4 tokens. drop removes r1's trajectory (5),
	// trim keeps its first 4 tokens.
	o.MaxResponse, o.Truncation = 4, TruncDrop
	res, err = Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 3 || res.Stats.Excluded[ExclTruncDropped] != 1 || res.Samples[0].RolloutID != "r2" {
		t.Fatalf("drop: %d samples, %v", len(res.Samples), res.Stats.Excluded)
	}
	o.Truncation = TruncTrim
	res, err = Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	if g := res.Samples[0]; res.Stats.Trimmed != 1 || sp(g.Response, g.ResponseMask, g.Logprobs, g.Trimmed) != "[10 11 20 21] [1 1 0 0] [-0.1 -0.2 0 0] true" {
		t.Fatalf("trim: %+v %+v", res.Stats, g)
	}
}

// TestBuildCredit: discounted credit over every call of the attempt. r1/a2 has
// three calls (the critic's is the last step): r = [-0.5, 0, 1] with gamma 0.5
// G3 = 1, G2 = 0 + 0.5*1 = 0.5, G1 = -0.5 + 0.5*0.5 = -0.25.
// Last-call-only: G = r_t: seq1 -0.5, seq2 0 (R sits on the critic's call).
// Transition-level Dr.GRPO over t1's samples under discounted credit:
// r2: r = [0, -0.5, 0.5-1] -> G3 = -0.5, G2 = -0.5 + 0.5*-0.5 = -0.75, G1 = 0 + 0.5*-0.75 = -0.375
// t1 scores [-0.25, 0.5, -0.375, -0.75], mean -0.21875.
func TestBuildCredit(t *testing.T) {
	s := fill(t)
	o := options(t)
	o.Credit, o.Gamma, o.Estimator, o.Level = credit.Discounted, 0.5, advantage.DrGRPO, LevelTransition
	res, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	wantR := []float64{-0.25, 0.5, -0.375, -0.75, 2.25}
	wantA := []float64{-0.25 + 0.21875, 0.5 + 0.21875, -0.375 + 0.21875, -0.75 + 0.21875, 2.25}
	for i := range wantR {
		if !near(res.Samples[i].Reward, wantR[i]) || !near(res.Samples[i].Advantage, wantA[i]) {
			t.Errorf("sample %d: reward %v adv %v, want %v %v", i, res.Samples[i].Reward, res.Samples[i].Advantage, wantR[i], wantA[i])
		}
	}
	o.Credit, o.Estimator = credit.LastOnly, advantage.None
	res, err = Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Samples[0].Reward != -0.5 || res.Samples[1].Reward != 0 {
		t.Fatalf("last-only: %v %v", res.Samples[0].Reward, res.Samples[1].Reward)
	}
}

// TestSelection checks the filters on their own.
func TestSelection(t *testing.T) {
	s := fill(t)
	ctx := context.Background()
	names := func(sel Selection) string {
		refs, err := SelectAttempts(ctx, s, sel)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range refs {
			out = append(out, r.RolloutID+"/"+r.AttemptID)
		}
		return strings.Join(out, " ")
	}
	cases := []struct {
		sel  Selection
		want string
	}{
		{DefaultSelection(), "r1/a2 r2/a1 r3/a1 r4/a1 r6/a1"},
		{Selection{}, "r1/a2 r2/a1 r3/a1 r4/a1 r5/a1 r6/a1"},
		{Selection{Attempts: AttemptsAll}, "r1/a1 r1/a2 r2/a1 r3/a1 r4/a1 r5/a1 r6/a1"},
		{Selection{Statuses: []string{"failed"}}, "r1/a1"},
		{Selection{TaskIDs: []string{"t2"}, Statuses: []string{"succeeded", "running"}}, "r4/a1 r5/a1 r6/a1"},
		// first call start times are 1000 + seq: every attempt starts at 1001
		{Selection{Since: time.Unix(0, 1002)}, ""},
		{Selection{Until: time.Unix(0, 1002), TaskIDs: []string{"t1"}}, "r1/a2 r2/a1 r3/a1"},
	}
	for i, c := range cases {
		if got := names(c.sel); got != c.want {
			t.Errorf("case %d: got %q want %q", i, got, c.want)
		}
	}
	if _, err := SelectAttempts(ctx, s, Selection{Attempts: "first"}); err == nil {
		t.Error("bad attempt choice accepted")
	}
	for _, c := range []struct {
		v, min string
		below  bool
	}{{"v1", "v2", true}, {"v10", "v9", false}, {"3", "3", false}, {"", "v1", true}, {"b", "a", false}, {"x", "", false}} {
		if got := versionBelow(c.v, c.min); got != c.below {
			t.Errorf("versionBelow(%q, %q) = %v", c.v, c.min, got)
		}
	}
}

// TestWriteAIR: the rule outcomes land in the rewards table with their rule
// as source, and a second run does not count them twice.
func TestWriteAIR(t *testing.T) {
	s := fill(t)
	o := options(t)
	o.WriteAIR = true
	first, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Query(context.Background(), "SELECT rollout_id, sequence_id, source, value FROM rewards WHERE name = 'air' ORDER BY rollout_id, sequence_id")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(res.Rows) != "[[r1 1 air_tool_failure -0.5] [r2 2 air_truncated -0.5] [r2 3 air_backend_error -1]]" {
		t.Fatalf("rows %v", res.Rows)
	}
	o.WriteAIR = false
	second, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	for i := range first.Samples {
		if first.Samples[i].Reward != second.Samples[i].Reward {
			t.Fatalf("sample %d reward changed: %v -> %v", i, first.Samples[i].Reward, second.Samples[i].Reward)
		}
	}
}

// TestBuildStreamingMatches: with Emit, Build hands out exactly the samples
// (advantages included, batch-whitened estimators too) and stats it returns
// without it, for every estimator, level and mode.
func TestBuildStreamingMatches(t *testing.T) {
	s := fill(t)
	for _, est := range []advantage.Estimator{advantage.GRPO, advantage.DrGRPO, advantage.RLOO, advantage.ReinforcePP, advantage.None} {
		for _, level := range []string{LevelRollout, LevelTransition} {
			for _, mode := range []string{ModeTransitions, ModeTrajectories} {
				for _, drop := range []bool{false, true} {
					o := options(t)
					o.Selection = Selection{Attempts: AttemptsAll}
					o.Estimator, o.Level, o.Mode, o.DropZeroVariance = est, level, mode, drop
					want, err := Build(context.Background(), s, o)
					if err != nil {
						t.Fatal(err)
					}
					var got []*Sample
					o.Emit = func(s *Sample) error { got = append(got, s); return nil }
					res, err := Build(context.Background(), s, o)
					if err != nil {
						t.Fatal(err)
					}
					name := fmt.Sprint(est, "/", level, "/", mode, "/drop=", drop)
					sameOutput(t, name, got, res, want)
				}
			}
		}
	}
}

// TestBuildDefaults: groups as sampled. Latest succeeded or failed attempts
// (r5 running is not selected); r6 has no reward and gets 0; samples
// without logprobs are excluded as no_logprobs; r3 and r6 give no sample but
// their scores stay in their groups' baselines.
//
//	t1: r1 1, r2 0.5, r3 0 -> mean 0.5, std 0.5: A(r1) = 0.5/(0.5+1e-6), A(r2) = 0
//	t2: r4 2 + 0.25, r6 0 -> mean 1.125, std 1.125*sqrt(2): A(r4) = 1.125/(std+1e-6)
func TestBuildDefaults(t *testing.T) {
	s := fill(t)
	ctx := context.Background()
	o := Options{Selection: DefaultSelection(), Estimator: advantage.GRPO}
	res, err := Build(ctx, s, o)
	if err != nil {
		t.Fatal(err)
	}
	aR1, aR4 := 0.5/(0.5+1e-6), 1.125/(1.125*math.Sqrt2+1e-6)
	var got []string
	for _, g := range res.Samples {
		got = append(got, fmt.Sprintf("%s/%s %v %.9f %v", g.RolloutID, g.AttemptID, g.SequenceIDs, g.Advantage, g.HasLogprobs))
	}
	want := []string{
		fmt.Sprintf("r1/a2 [1] %.9f true", aR1), fmt.Sprintf("r1/a2 [2] %.9f true", aR1),
		"r2/a1 [1] 0.000000000 true", "r2/a1 [2] 0.000000000 true",
		fmt.Sprintf("r4/a1 [1] %.9f true", aR4),
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("samples\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	st := res.Stats
	wantExcl := map[string]int{ExclNoLogprobs: 3, ExclErrored: 1, ExclUnverified: 1, ExclNoSample: 2}
	if fmt.Sprint(st.Excluded) != fmt.Sprint(wantExcl) || st.FilledRewards != 1 || st.Attempts != 5 {
		t.Fatalf("excluded %v (want %v), filled %d, attempts %d", st.Excluded, wantExcl, st.FilledRewards, st.Attempts)
	}

	// drop-group: t2 has an unrewarded attempt (r6), so r4's sample goes.
	o.MissingReward = MissingDropGroup
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 4 || res.Stats.Excluded[ExclMissingGroup] != 1 {
		t.Fatalf("drop-group: %d samples, %v", len(res.Samples), res.Stats.Excluded)
	}
	// drop: r6 leaves, t2 is left with r4 alone: below GRPO's minimum of 2.
	o.MissingReward = MissingDrop
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 4 || res.Stats.Excluded[ExclSmallGroup] != 1 || res.Stats.Excluded[ExclNoReward] != 1 || res.Stats.SmallGroups != 1 {
		t.Fatalf("drop: %d samples, %v, %d small groups", len(res.Samples), res.Stats.Excluded, res.Stats.SmallGroups)
	}
	// Omitting logprobs keeps the samples without them.
	o.MissingReward, o.Logprobs = "", LogprobsOmit
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 8 || res.Stats.Excluded[ExclNoLogprobs] != 0 {
		t.Fatalf("omit: %d samples, %v", len(res.Samples), res.Stats.Excluded)
	}
	for _, bad := range []Options{{MissingReward: "1"}, {Logprobs: "zeros"}, {Truncation: "chop"}, {MinGroupSize: -1}} {
		if _, err := Build(ctx, s, bad); err == nil {
			t.Errorf("options %+v accepted", bad)
		}
	}
}

// TestBuildTruncationCut: a response over the limit is cut and kept (its
// group's baseline unchanged); a prompt over the limit excludes the sample;
// a trajectory cut inside an observation ends on its last generated token.
func TestBuildTruncationCut(t *testing.T) {
	s := fill(t)
	ctx := context.Background()
	o := Options{Selection: DefaultSelection(), Estimator: advantage.GRPO}
	base, err := Build(ctx, s, o)
	if err != nil {
		t.Fatal(err)
	}
	o.MaxPrompt, o.MaxResponse = 3, 1
	res, err := Build(ctx, s, o)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range res.Samples {
		got = append(got, sp(g.RolloutID, g.SequenceIDs, g.Response, g.Truncated))
	}
	// r1 seq2 (7 prompt ids) and r2 seq2 (6) are over 3; r2 seq1 and r4 are cut to 1.
	if sp(got) != sp([]string{"r1 [1] [10] true", "r2 [1] [13] true", "r4 [1] [40] true"}) {
		t.Fatalf("samples %v", got)
	}
	if res.Stats.Excluded[ExclPromptTooLong] != 2 || res.Stats.Truncated != 3 {
		t.Fatalf("stats %+v", res.Stats)
	}
	if res.Samples[0].Advantage != base.Samples[0].Advantage || res.Samples[2].Advantage != base.Samples[4].Advantage {
		t.Fatalf("a cut or an exclusion moved a baseline: %v %v vs %v %v", res.Samples[0].Advantage, res.Samples[2].Advantage, base.Samples[0].Advantage, base.Samples[4].Advantage)
	}
	o.MaxPrompt, o.MaxResponse, o.Mode = 0, 3, ModeTrajectories
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	if g := res.Samples[0]; sp(g.RolloutID, g.Response, g.ResponseMask, g.Truncated) != "r1 [10 11] [1 1] true" {
		t.Fatalf("trajectory cut: %s %v %v %v", g.RolloutID, g.Response, g.ResponseMask, g.Truncated)
	}
}

// TestBuildReport: every selected attempt is explained, item by item.
func TestBuildReport(t *testing.T) {
	s := fill(t)
	o := Options{Selection: DefaultSelection(), Estimator: advantage.GRPO, MissingReward: MissingDrop, Report: true}
	res, err := Build(context.Background(), s, o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range res.Report {
		var items []string
		for _, d := range r.Items {
			items = append(items, fmt.Sprintf("%s%v:%v:%s", d.Kind, d.SequenceIDs, d.Included, d.Reason))
		}
		got[r.RolloutID+"/"+r.AttemptID] = fmt.Sprintf("group=%s reason=%s missing=%v %s", r.Group, r.Reason, r.RewardMissing, strings.Join(items, " "))
	}
	want := map[string]string{
		"r1/a2": "group=t1@v2 reason= missing=false sample[1]:true: sample[2]:true: sample[3]:false:no_logprobs",
		"r2/a1": "group=t1@v2 reason= missing=false call[3]:false:errored sample[1]:true: sample[2]:true:",
		"r3/a1": "group=t1@v2 reason=no_sample missing=false call[1]:false:unverified_ids sample[2]:false:no_logprobs",
		"r4/a1": "group=t2@v2 reason=small_group missing=false sample[1]:false:small_group",
		"r6/a1": "group=t2@v2 reason=no_reward missing=true ",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("report\n%v\nwant\n%v", got, want)
	}
	if st := res.Stats; st.Excluded[ExclSmallGroup] != 1 || st.Excluded[ExclNoReward] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestBuildGroupByPolicy: two training steps of one task (served by
// different policy versions) are two groups by default, one with GroupTask.
func TestBuildGroupByPolicy(t *testing.T) {
	s := fill(t)
	ctx := context.Background()
	b := &export.Batch{}
	for i, ro := range []string{"s1", "s2"} {
		c := cs{ro: ro, at: "a1", task: "t1", agent: "solver", seq: 1, prompt: []uint32{1}, resp: []uint32{5}, lp: []float32{-1}, pv: "v3"}.call()
		b.Calls = append(b.Calls, c)
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a1", TaskID: "t1", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 5})
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: "a1", Name: "primary", Value: float64(i), Source: "api", TimeUnixNano: 1})
	}
	if err := s.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	o := Options{Selection: DefaultSelection(), Estimator: advantage.GRPO}
	res, err := Build(ctx, s, o)
	if err != nil {
		t.Fatal(err)
	}
	uids := map[string]int{}
	for _, smp := range res.Samples {
		uids[smp.GroupUID]++
	}
	if uids["t1@v2"] != 4 || uids["t1@v3"] != 2 || len(uids) != 3 {
		t.Fatalf("groups by task and policy: %v", uids)
	}
	o.GroupBy = GroupTask
	if res, err = Build(ctx, s, o); err != nil {
		t.Fatal(err)
	}
	uids = map[string]int{}
	for _, smp := range res.Samples {
		uids[smp.GroupUID]++
	}
	if uids["t1"] != 6 {
		t.Fatalf("groups by task: %v", uids)
	}
}
