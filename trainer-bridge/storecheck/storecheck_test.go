package storecheck

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

var serverDSN string

func TestMain(m *testing.M) { testenv.Main(m, &serverDSN) }

// batches is a deterministic capture of 30 rollouts over 6 tasks: three
// turns each with tool calls, failing tool results, truncations, backend
// errors, unverified ids, two agents, two policy versions, retried attempts,
// calls an SDK retried (two tries of one sequence id) and status rows written twice (ClickHouse keeps both until a merge).
func batches() []*export.Batch {
	const tools = `"tools":[{"type":"function","function":{"name":"run","parameters":{"type":"object","properties":{"cmd":{"type":"string"}},"required":["cmd"]}}}]`
	var out []*export.Batch
	for r := range 30 {
		b := &export.Batch{}
		ro, task := fmt.Sprintf("ro%02d", r), fmt.Sprintf("task%d", r%6)
		attempts := []string{"a1"}
		if r%5 == 0 {
			attempts = append(attempts, "a2")
		}
		for ai, at := range attempts {
			prompt := []uint32{1, uint32(r % 6), 2}
			for seq := uint64(1); seq <= 3; seq++ {
				resp := []uint32{uint32(100 + r), uint32(200 + seq), 2}
				lp := []float32{-0.25, -0.5, -0.125}
				result := "ok"
				if (r+int(seq))%4 == 0 {
					result = "Error: exit status 1"
				}
				msg := fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"c%d","type":"function","function":{"name":"run","arguments":"{\"cmd\":\"ls %d\"}"}}]}`, seq, r)
				if r%7 == 0 && seq == 2 {
					msg = `{"role":"assistant","content":null,"tool_calls":[{"id":"c2","type":"function","function":{"name":"run","arguments":"{\"cmd\":"}}]}`
				}
				req := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"go"},{"role":"tool","tool_call_id":"c%d","content":%q}],%s}`, seq-1, result, tools)
				c := export.Call{SpanID: fmt.Sprintf("%s%s%d", ro, at, seq), RolloutID: ro, AttemptID: at, TaskID: task, AgentName: []string{"coder", "reviewer"}[seq%2],
					SequenceID: seq, StartTimeUnixNano: uint64(1e18) + uint64(r*100+ai*10) + seq, HTTPStatus: 200, Endpoint: "/v1/chat/completions", Model: "m",
					PolicyVersion: fmt.Sprint(1 + r%2), RequestBody: req, ResponseMessage: msg, PromptTokenIDs: append([]uint32(nil), prompt...),
					ResponseTokenIDs: resp, ResponseLogprobs: lp, TokenSource: export.TokenSourceEngine, FinishReason: "tool_calls"}
				switch {
				case r%9 == 0 && seq == 3:
					c.HTTPStatus, c.Error, c.ResponseTokenIDs, c.ResponseLogprobs = 502, "upstream: bad gateway", nil, nil
				case r%8 == 0 && seq == 1:
					c.TokenSource = export.TokenSourceRetokenized
				case r%3 == 0 && seq == 3:
					c.FinishReason = "length"
				}
				if r%6 == 2 && seq == 2 {
					// The SDK retried this call: a first try the agent never
					// received (stored first), then the answered one.
					try0 := c
					try0.SpanID += "t0"
					try0.StartTimeUnixNano--
					try0.HTTPStatus, try0.Error, try0.ResponseTokenIDs, try0.ResponseLogprobs = 499, "client disconnected before the response", nil, nil
					b.Calls = append(b.Calls, try0)
					c.RetryCount, c.RetryOf = 1, try0.SpanID
				}
				b.Calls = append(b.Calls, c)
				prompt = append(append(prompt, resp...), 7, uint32(seq), 8) // the observation
			}
			status := "succeeded"
			if ai == 0 && len(attempts) == 2 {
				status = "failed"
			}
			b.Rollouts = append(b.Rollouts,
				export.Rollout{RolloutID: ro, AttemptID: at, TaskID: task, Status: "running", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: uint64(10 + ai)},
				export.Rollout{RolloutID: ro, AttemptID: at, TaskID: task, Status: status, Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: uint64(20 + ai)})
			if r%10 != 4 { // some rollouts never get a reward
				b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: at, Name: "primary", Value: float64((r*7)%5) / 4, Source: "api", TimeUnixNano: 5})
			}
			if r%4 == 1 {
				b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: at, SequenceID: 2, Name: "primary", Value: 0.5, Source: "api", TimeUnixNano: 6})
			}
		}
		out = append(out, b)
	}
	return out
}

func fill(t *testing.T, s export.Store) {
	t.Helper()
	for _, b := range batches() {
		// rollouts rows in two writes: ClickHouse keeps both versions of the row
		first := &export.Batch{Calls: b.Calls, Rewards: b.Rewards}
		for i := 0; i < len(b.Rollouts); i += 2 {
			first.Rollouts = append(first.Rollouts, b.Rollouts[i])
		}
		second := &export.Batch{}
		for i := 1; i < len(b.Rollouts); i += 2 {
			second.Rollouts = append(second.Rollouts, b.Rollouts[i])
		}
		if err := s.Write(context.Background(), first); err != nil {
			t.Fatal(err)
		}
		if err := s.Write(context.Background(), second); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSameSamplesOnBothStores(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.FreshDatabase(serverDSN, "t_bridge_storecheck")
	if err := testenv.DropDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	ch, err := clickhouse.Open(ctx, dsn, clickhouse.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	sq, err := sqlite.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer sq.Close()
	fill(t, ch)
	fill(t, sq)
	e, err := air.New(air.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	sel := bridge.DefaultSelection()
	configs := map[string]bridge.Options{
		"transitions-grpo": {Selection: sel, Estimator: advantage.GRPO, AIR: e},
		"trajectories-rpp": {Selection: sel, Mode: bridge.ModeTrajectories, Estimator: advantage.ReinforcePP, AIR: e, Credit: credit.Discounted, Gamma: 0.9},
		"agent-rloo": {Selection: bridge.Selection{Statuses: []string{"succeeded"}, AgentName: regexp.MustCompile("^coder$"), MinPolicyVersion: "2"},
			Estimator: advantage.RLOO, Level: bridge.LevelTransition, DropZeroVariance: true},
		"all-attempts": {Selection: bridge.Selection{Attempts: bridge.AttemptsAll}, Estimator: advantage.DrGRPO, AIR: e, MaxResponse: 6, Truncation: bridge.TruncTrim},
	}
	for name, o := range configs {
		t.Run(name, func(t *testing.T) {
			a, err := bridge.Build(ctx, ch, o)
			if err != nil {
				t.Fatal(err)
			}
			b, err := bridge.Build(ctx, sq, o)
			if err != nil {
				t.Fatal(err)
			}
			var ja, jb bytes.Buffer
			if err := bridge.WriteJSONL(&ja, a.Samples); err != nil {
				t.Fatal(err)
			}
			if err := bridge.WriteJSONL(&jb, b.Samples); err != nil {
				t.Fatal(err)
			}
			if len(a.Samples) < 10 {
				t.Fatalf("only %d samples: %+v", len(a.Samples), a.Stats)
			}
			if ja.String() != jb.String() {
				t.Fatalf("ClickHouse and SQLite samples differ:\n%s\n---\n%s", ja.String(), jb.String())
			}
			if a.Stats.Excluded[bridge.ExclSuperseded] == 0 {
				t.Fatalf("no superseded try excluded: %v", a.Stats.Excluded)
			}
			if fmt.Sprint(a.Stats) != fmt.Sprint(b.Stats) {
				t.Fatalf("stats differ:\n%+v\n%+v", a.Stats, b.Stats)
			}
			t.Logf("%s: %d samples, excluded %v, AIR %v, breaks %v", name, a.Stats.Samples, a.Stats.Excluded, a.Stats.AIRHits, a.Stats.Breaks)
		})
	}
}
