package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// The calls of TestRetokenize: what an agent sent and the engine answered,
// captured without token ids.
const (
	rtTools  = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}}}]`
	rtUser   = `{"role":"system","content":"You are a weather bot."},{"role":"user","content":"Weather in Oslo? Answer in °C, please."}`
	rtCall   = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]}`
	rtResult = `{"role":"tool","tool_call_id":"call_1","content":"12 degrees, cloudy"}`
	rtAnswer = `{"role":"assistant","content":"It is 12 °C and cloudy in Oslo."}`
	rtLong   = `{"role":"user","content":"Écris un long poème sur la pluie, s'il te plaît 🌧️"}`
	rtCut    = `{"role":"assistant","content":"La pluie tombe, douce et"}`
)

// retokenizeStore writes the scenario of TestRetokenize to s:
//
//	q1 (task tq, R = 1): seq 1 tool call, seq 2 answer after the tool result
//	   (both without ids), seq 3 an engine call with ids [1 2 3] -> [4]
//	q2 (task tq, R = 0): seq 1 without ids, cut by max_tokens (finish length)
//	q3 (task tq, R = 1): seq 1 a /v1/completions call and seq 2 an image
//	   message, both without ids: they cannot be retokenized
func retokenizeStore(t *testing.T, s export.Store) {
	t.Helper()
	req := func(msgs string) string {
		return `{"model":"qwen","messages":[` + msgs + `],"tools":` + rtTools + `}`
	}
	none := func(ro string, seq uint64, reqBody, msg, finish string) export.Call {
		c := cs{ro: ro, at: "a1", task: "tq", agent: "solver", seq: seq, req: reqBody, msg: msg, finish: finish, src: export.TokenSourceNone}.call()
		c.ResponseLogprobs = []float32{-0.5, -0.25} // captured for the engine's tokens, not the retokenized ones
		return c
	}
	b := &export.Batch{Calls: []export.Call{
		none("q1", 1, req(rtUser), rtCall, "tool_calls"),
		none("q1", 2, req(rtUser+","+rtCall+","+rtResult), rtAnswer, "stop"),
		cs{ro: "q1", at: "a1", task: "tq", agent: "solver", seq: 3, prompt: []uint32{1, 2, 3}, resp: []uint32{4}, lp: []float32{-0.1}}.call(),
		none("q2", 1, `{"model":"qwen","messages":[`+rtLong+`],"max_tokens":6}`, rtCut, "length"),
		none("q3", 1, `{"model":"qwen","prompt":"Once upon a time"}`, `{"role":"assistant","content":" there"}`, "stop"),
		none("q3", 2, `{"model":"qwen","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:x"}}]}]}`, rtAnswer, "stop"),
	}}
	for _, ro := range []string{"q1", "q2", "q3"} {
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a1", TaskID: "tq", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 2})
	}
	for ro, v := range map[string]float64{"q1": 1, "q2": 0, "q3": 1} {
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro, AttemptID: "a1", Name: "primary", Value: v, Source: "api", TimeUnixNano: 1})
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
}

// TestRetokenize builds samples from calls captured without ids, on SQLite
// and ClickHouse, with Options.Retokenize set to the real Qwen2.5 template
// and tokenizer, and checks every id against the independent references:
// @huggingface/jinja's rendering of the same messages, tokenized by
// transformers.js. Without the option the same calls stay excluded.
func TestRetokenize(t *testing.T) {
	r, err := chattemplate.LoadDir(chattemplatetest.ModelDir(t, "qwen2_5"))
	if err != nil {
		t.Fatal(err)
	}
	tools := json.RawMessage(rtTools)
	ref := chattemplatetest.Reference(t, "qwen2_5", []chattemplatetest.Case{
		{Name: "q1/1", Messages: json.RawMessage(`[` + rtUser + `]`), Tools: tools, Response: json.RawMessage(rtCall), FinishReason: "tool_calls"},
		{Name: "q1/2", Messages: json.RawMessage(`[` + rtUser + "," + rtCall + "," + rtResult + `]`), Tools: tools, Response: json.RawMessage(rtAnswer), FinishReason: "stop"},
		{Name: "q2/1", Messages: json.RawMessage(`[` + rtLong + `]`), Response: json.RawMessage(rtCut), FinishReason: "length"},
	})
	for _, r := range ref {
		if r.Error != "" || r.Response == nil {
			t.Fatalf("reference %s: %q", r.Name, r.Error)
		}
	}
	if !strings.HasSuffix(*ref[0].Response, "<|im_end|>") || strings.HasSuffix(*ref[2].Response, "<|im_end|>") {
		t.Fatalf("reference responses: %q, %q", *ref[0].Response, *ref[2].Response)
	}
	stores := map[string]func(t *testing.T) export.Store{
		"sqlite": func(t *testing.T) export.Store {
			s, err := sqlite.Open(filepath.Join(t.TempDir(), "bridge.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"clickhouse": func(t *testing.T) export.Store {
			dsn := os.Getenv(testenv.EnvClickHouseDSN)
			if dsn == "" {
				t.Fatalf("set %s to a ClickHouse server (scripts/test starts one)", testenv.EnvClickHouseDSN)
			}
			s, err := clickhouse.Open(context.Background(), testenv.FreshDatabase(dsn, fmt.Sprint("bridge_retokenize_", time.Now().UnixNano())), clickhouse.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
	for _, name := range []string{"sqlite", "clickhouse"} {
		t.Run(name, func(t *testing.T) {
			s := stores[name](t)
			retokenizeStore(t, s)
			ctx := context.Background()

			// Off (the default): the calls without ids are excluded as before.
			res, err := Build(ctx, s, Options{Selection: DefaultSelection()})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Samples) != 1 || res.Samples[0].TokenSource != export.TokenSourceEngine || res.Stats.Retokenized != 0 ||
				res.Stats.Excluded[ExclUnverified] != 5 {
				t.Fatalf("without Retokenize: %d samples, stats %+v", len(res.Samples), res.Stats)
			}

			// Transitions: one sample per call, retokenized ids equal the references'.
			res, err = Build(ctx, s, Options{Selection: DefaultSelection(), Retokenize: r})
			if err != nil {
				t.Fatal(err)
			}
			st := res.Stats
			if st.Retokenized != 3 || st.RetokenizedSamples != 3 || st.Samples != 4 || st.Excluded[ExclRetokenize] != 2 ||
				st.Excluded[ExclUnverified] != 0 || st.Excluded[ExclNoSample] != 1 {
				t.Fatalf("stats %+v", st)
			}
			want := []struct {
				ro  string
				seq uint64
				ref *chattemplatetest.IDs
			}{{"q1", 1, &ref[0]}, {"q1", 2, &ref[1]}, {"q1", 3, nil}, {"q2", 1, &ref[2]}}
			for i, w := range want {
				g := res.Samples[i]
				if g.RolloutID != w.ro || g.SequenceIDs[0] != w.seq {
					t.Fatalf("sample %d is %s/%v, want %s/%d", i, g.RolloutID, g.SequenceIDs, w.ro, w.seq)
				}
				if w.ref == nil {
					if g.TokenSource != export.TokenSourceEngine || sp(g.Prompt, g.Response, g.Logprobs) != "[1 2 3] [4] [-0.1]" {
						t.Errorf("engine call changed: %s %v %v %v", g.TokenSource, g.Prompt, g.Response, g.Logprobs)
					}
					continue
				}
				if g.TokenSource != export.TokenSourceRetokenized {
					t.Errorf("%s/%d: token_source %q", w.ro, w.seq, g.TokenSource)
				}
				if !slices.Equal(g.Prompt, w.ref.PromptIDs) {
					t.Errorf("%s/%d: prompt ids differ from the reference's for %q\n got %v\nwant %v", w.ro, w.seq, w.ref.Prompt, g.Prompt, w.ref.PromptIDs)
				}
				if !slices.Equal(g.Response, w.ref.ResponseIDs) {
					t.Errorf("%s/%d: response ids differ from the reference's for %q\n got %v\nwant %v", w.ro, w.seq, *w.ref.Response, g.Response, w.ref.ResponseIDs)
				}
				if len(g.Logprobs) != len(g.Response) || slices.ContainsFunc(g.Logprobs, func(x float32) bool { return x != 0 }) {
					t.Errorf("%s/%d: logprobs %v, want zeros", w.ro, w.seq, g.Logprobs)
				}
			}

			// Outputs carry token_source.
			var jl bytes.Buffer
			if err := WriteJSONL(&jl, res.Samples); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(jl.String(), `"token_source":"retokenized"`); n != 3 || !strings.Contains(jl.String(), `"token_source":"engine"`) {
				t.Errorf("JSONL token_source: %d retokenized rows\n%s", n, jl.String())
			}
			var pq bytes.Buffer
			if err := WriteParquet(&pq, res.Samples, ParquetOptions{}); err != nil {
				t.Fatal(err)
			}
			rows, err := parquet.Read[parquetRow](bytes.NewReader(pq.Bytes()), int64(pq.Len()))
			if err != nil {
				t.Fatal(err)
			}
			var srcs []string
			for _, row := range rows {
				srcs = append(srcs, row.TokenSource)
			}
			if sp(srcs) != "[retokenized retokenized engine retokenized]" {
				t.Errorf("parquet token_source %v", srcs)
			}

			// Trajectories: the two retokenized turns of q1 merge (the
			// reference's second prompt extends the first prompt + response);
			// the engine call is never merged with them.
			full := concat(ref[0].PromptIDs, ref[0].ResponseIDs)
			if !hasPrefix(ref[1].PromptIDs, full) {
				t.Fatalf("reference: prompt 2 does not extend prompt 1 + response 1")
			}
			res, err = Build(ctx, s, Options{Selection: DefaultSelection(), Retokenize: r, Mode: ModeTrajectories})
			if err != nil {
				t.Fatal(err)
			}
			st = res.Stats
			if len(res.Samples) != 3 || st.Merged != 1 || st.Breaks[BreakMixedSources] != 1 || st.RetokenizedSamples != 2 {
				t.Fatalf("trajectories: %d samples, stats %+v", len(res.Samples), st)
			}
			g := res.Samples[0]
			obs := ref[1].PromptIDs[len(full):]
			wantResp := concat(concat(ref[0].ResponseIDs, obs), ref[1].ResponseIDs)
			wantMask := append(append(ones(len(ref[0].ResponseIDs)), make([]uint8, len(obs))...), ones(len(ref[1].ResponseIDs))...)
			if g.TokenSource != export.TokenSourceRetokenized || !slices.Equal(g.Prompt, ref[0].PromptIDs) ||
				!slices.Equal(g.Response, wantResp) || !slices.Equal(g.ResponseMask, wantMask) || sp(g.SequenceIDs) != "[1 2]" {
				t.Errorf("merged trajectory: %s %v\n response %v\n want     %v\n mask %v\n want %v", g.TokenSource, g.SequenceIDs, g.Response, wantResp, g.ResponseMask, wantMask)
			}
			if g := res.Samples[1]; g.TokenSource != export.TokenSourceEngine || sp(g.SequenceIDs) != "[3]" {
				t.Errorf("engine call: %s %v", g.TokenSource, g.SequenceIDs)
			}
		})
	}
}

// TestRetokenizeAll: with Options.RetokenizeAll, calls captured with the
// engine's ids (here deliberately not the template's: [1 2 3] -> [4], as a
// non-canonical sample would be) are retokenized from their text too, their
// engine logprobs dropped; without it Retokenize leaves them alone, and
// RetokenizeAll without a Retokenizer is the caller's mistake.
func TestRetokenizeAll(t *testing.T) {
	r, err := chattemplate.LoadDir(chattemplatetest.ModelDir(t, "qwen2_5"))
	if err != nil {
		t.Fatal(err)
	}
	ref := chattemplatetest.Reference(t, "qwen2_5", []chattemplatetest.Case{
		{Name: "e/1", Messages: json.RawMessage(`[` + rtUser + `]`), Tools: json.RawMessage(rtTools), Response: json.RawMessage(rtCall), FinishReason: "tool_calls"},
	})
	if ref[0].Error != "" || ref[0].Response == nil {
		t.Fatalf("reference: %q", ref[0].Error)
	}
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "bridge.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	req := `{"model":"qwen","messages":[` + rtUser + `],"tools":` + rtTools + `}`
	b := &export.Batch{
		Calls: []export.Call{cs{ro: "e", at: "a1", task: "tq", agent: "solver", seq: 1, req: req, msg: rtCall, finish: "tool_calls",
			prompt: []uint32{1, 2, 3}, resp: []uint32{4}, lp: []float32{-0.1}}.call()},
		Rollouts: []export.Rollout{{RolloutID: "e", AttemptID: "a1", TaskID: "tq", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 2}},
		Rewards:  []export.Reward{{RolloutID: "e", AttemptID: "a1", Name: "primary", Value: 1, Source: "api", TimeUnixNano: 1}},
	}
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	res, err := Build(ctx, s, Options{Selection: DefaultSelection(), Retokenize: r})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 1 || res.Stats.Retokenized != 0 || res.Samples[0].TokenSource != export.TokenSourceEngine ||
		sp(res.Samples[0].Prompt, res.Samples[0].Response) != "[1 2 3] [4]" {
		t.Fatalf("Retokenize alone touched the engine call: %+v %+v", res.Stats, res.Samples)
	}

	res, err = Build(ctx, s, Options{Selection: DefaultSelection(), Retokenize: r, RetokenizeAll: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 1 || res.Stats.Retokenized != 1 || res.Stats.RetokenizedSamples != 1 {
		t.Fatalf("RetokenizeAll: %d samples, stats %+v", len(res.Samples), res.Stats)
	}
	g := res.Samples[0]
	if g.TokenSource != export.TokenSourceRetokenized || g.HasLogprobs ||
		!slices.Equal(g.Prompt, ref[0].PromptIDs) || !slices.Equal(g.Response, ref[0].ResponseIDs) ||
		slices.ContainsFunc(g.Logprobs, func(x float32) bool { return x != 0 }) {
		t.Errorf("RetokenizeAll sample: %s has logprobs %v %v\n prompt %v\n want   %v\n response %v\n want     %v",
			g.TokenSource, g.HasLogprobs, g.Logprobs, g.Prompt, ref[0].PromptIDs, g.Response, ref[0].ResponseIDs)
	}

	// Asking to keep logprobs excludes the retokenized sample rather than
	// write zeros as the engine's.
	res, err = Build(ctx, s, Options{Selection: DefaultSelection(), Retokenize: r, RetokenizeAll: true, Logprobs: LogprobsKeep})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Samples) != 0 || res.Stats.Excluded[ExclNoLogprobs] != 1 {
		t.Errorf("RetokenizeAll with --logprobs keep: %d samples, stats %+v", len(res.Samples), res.Stats)
	}

	var oe *OptionError
	if _, err := Build(ctx, s, Options{Selection: DefaultSelection(), RetokenizeAll: true}); !errors.As(err, &oe) {
		t.Errorf("RetokenizeAll without Retokenize: %v, want an OptionError", err)
	}
}
