package air

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",` +
	`"properties":{"city":{"type":"string"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"],"additionalProperties":false}}},` +
	`{"type":"function","function":{"name":"search"}}]`

// req builds a request body: the user turn, then tool results (id -> content).
func req(results ...string) string {
	msgs := []string{`{"role":"user","content":"weather in Paris?"}`}
	for i := 0; i+1 < len(results); i += 2 {
		c, _ := json.Marshal(results[i+1])
		msgs = append(msgs, `{"role":"assistant","content":null,"tool_calls":[{"id":"`+results[i]+`","type":"function","function":{"name":"get_weather","arguments":"{}"}}]}`,
			`{"role":"tool","tool_call_id":"`+results[i]+`","content":`+string(c)+`}`)
	}
	return `{"model":"m","messages":[` + strings.Join(msgs, ",") + `],` + tools + `}`
}

func toolMsg(id, name, args string) string {
	a, _ := json.Marshal(args)
	return `{"role":"assistant","content":null,"tool_calls":[{"id":"` + id + `","type":"function","function":{"name":"` + name + `","arguments":` + string(a) + `}}]}`
}

func call(attempt string, seq uint64, choice uint32, request, msg, finish string) export.Call {
	return export.Call{SpanID: fmt.Sprintf("s%s%d", attempt, seq), RolloutID: "ro1", AttemptID: attempt, TaskID: "t", SequenceID: seq,
		ChoiceIndex: choice, HTTPStatus: 200, RequestBody: request, ResponseMessage: msg, FinishReason: finish,
		TokenSource: export.TokenSourceEngine, PromptTokenIDs: []uint32{1, 2}, ResponseTokenIDs: []uint32{3}}
}

// scenario is one attempt that hits every rule, plus a second attempt.
func scenario() []export.Call {
	errCall := call("a1", 7, 0, req(), "", "")
	errCall.HTTPStatus, errCall.Error, errCall.ResponseTokenIDs = 502, "upstream: 502 bad gateway", nil
	empty := call("a1", 8, 0, req(), `{"role":"assistant","content":""}`, "stop")
	empty.ResponseTokenIDs = nil
	return []export.Call{
		// 1: valid call; its result (next request) is an error -> tool_failure on 1.
		call("a1", 1, 0, req(), toolMsg("c1", "get_weather", `{"city":"Paris"}`), "tool_calls"),
		// 1, choice 1: truncated -> truncated on 1 (once, however many choices).
		call("a1", 1, 1, req(), `{"role":"assistant","content":"The weather in Par"}`, "length"),
		// 2: city is a number -> tool_args (schema). Its result is fine.
		call("a1", 2, 0, req("c1", "Error: city not found"), toolMsg("c2", "get_weather", `{"city":42}`), "tool_calls"),
		// 3: arguments not valid JSON -> tool_args.
		call("a1", 3, 0, req("c1", "Error: city not found", "c2", `{"temp": 20}`), toolMsg("c3", "get_weather", `{"city": "Paris"`), "tool_calls"),
		// 4, 5: the same search twice (keys spaced differently) -> repeat on 5.
		call("a1", 4, 0, req(), toolMsg("c4", "search", `{"q":"x","n":1}`), "tool_calls"),
		call("a1", 5, 0, req("c4", "Traceback (most recent call last):\n  File x"), toolMsg("c5", "search", `{ "n": 1, "q": "x" }`), "tool_calls"),
		// 6: truncated answer.
		call("a1", 6, 0, req("c5", "ok"), `{"role":"assistant","content":"It is sunny and"}`, "length"),
		errCall, // 7: backend error
		empty,   // 8: empty output
		// other attempt: unknown tool, extra property.
		call("a2", 1, 0, req(), toolMsg("d1", "delete_all", `{}`), "tool_calls"),
		call("a2", 2, 0, req(), toolMsg("d2", "get_weather", `{"city":"Rome","unit":"k"}`), "tool_calls"),
		call("a2", 3, 0, req(), toolMsg("d3", "get_weather", `{"city":"Rome","unit":"c"}`), "tool_calls"),
	}
}

func TestRulesThroughSQLite(t *testing.T) {
	ctx := context.Background()
	s, err := sqlite.Open(filepath.Join(t.TempDir(), "air.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, &export.Batch{Calls: scenario()}); err != nil {
		t.Fatal(err)
	}
	calls, err := s.Calls(ctx, export.CallFilter{RolloutID: "ro1"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rs := e.Evaluate(calls, 99)
	if err := Write(ctx, s, rs); err != nil {
		t.Fatal(err)
	}
	res, err := s.Query(ctx, "SELECT attempt_id, sequence_id, source, value, name, time_unix_nano FROM rewards ORDER BY attempt_id, sequence_id, source")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res.Rows {
		got = append(got, strings.Join(r, " "))
	}
	want := []string{
		"a1 1 air_tool_failure -0.5 air 99",
		"a1 1 air_truncated -0.5 air 99",
		"a1 2 air_tool_args -0.5 air 99",
		"a1 3 air_tool_args -0.5 air 99",
		"a1 4 air_tool_failure -0.5 air 99", // the traceback result of c4 arrives in request 5
		"a1 5 air_repeat -0.5 air 99",
		"a1 6 air_truncated -0.5 air 99",
		"a1 7 air_backend_error -1 air 99",
		"a1 8 air_backend_error -1 air 99",
		"a2 1 air_tool_args -0.5 air 99",
		"a2 2 air_tool_args -0.5 air 99",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rewards:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	c := Counts(rs)
	if c[RuleToolArgs] != 4 || c[RuleTruncated] != 2 || c[RuleBackendError] != 2 || c[RuleToolFailure] != 2 || c[RuleRepeat] != 1 {
		t.Fatalf("counts %v", c)
	}
}

func TestConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Rules[RuleTruncated] = Rule{Enabled: false, Weight: -1}
	cfg.Rules[RuleToolFailure] = Rule{Enabled: true, Weight: -2}
	cfg.FailurePatterns = []string{`^Error:`} // the traceback no longer counts
	cfg.MinRepeats = 3                        // two in a row is not a loop
	cfg.RewardName = "auto"
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rs := e.Evaluate(scenario(), 1)
	var got []string
	for _, r := range rs {
		got = append(got, fmt.Sprintf("%s/%d/%s/%v/%s", r.AttemptID, r.SequenceID, r.Source, r.Value, r.Name))
	}
	want := "a1/1/air_tool_failure/-2/auto a1/2/air_tool_args/-0.5/auto a1/3/air_tool_args/-0.5/auto a1/7/air_backend_error/-1/auto a1/8/air_backend_error/-1/auto a2/1/air_tool_args/-0.5/auto a2/2/air_tool_args/-0.5/auto"
	if strings.Join(got, " ") != want {
		t.Fatalf("got  %s\nwant %s", strings.Join(got, " "), want)
	}
	if _, err := New(Config{Rules: map[string]Rule{"nope": {}}}); err == nil {
		t.Fatal("unknown rule accepted")
	}
	if _, err := New(Config{FailurePatterns: []string{"("}}); err == nil {
		t.Fatal("bad pattern accepted")
	}
}

func TestSchema(t *testing.T) {
	schema := map[string]any{}
	_ = json.Unmarshal([]byte(`{"type":"object","properties":{"n":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},
		"opt":{"type":["string","null"]}},"required":["n"]}`), &schema)
	for args, ok := range map[string]bool{
		`{"n":3}`:                        true,
		`{"n":3.0,"tags":["a"]}`:         true,
		`{"n":3.5}`:                      false,
		`{"tags":["a"]}`:                 false,
		`{"n":1,"tags":["a",2]}`:         false,
		`{"n":1,"opt":null}`:             true,
		`{"n":1,"opt":true}`:             false,
		`{"n":1,"extra":{"anything":1}}`: true,
	} {
		d := json.NewDecoder(strings.NewReader(args))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		if msg := checkSchema(schema, v, "$"); (msg == "") != ok {
			t.Errorf("%s: %q", args, msg)
		}
	}
}

func FuzzEvaluate(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"tool","tool_call_id":"x","content":"Error"}],`+tools+`}`, toolMsg("x", "get_weather", `{"city":"a"}`), "length")
	f.Add(`{`, `{"tool_calls":[{"function":{"arguments":"[1,"}}]}`, "")
	e, err := New(DefaultConfig())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body, msg, finish string) {
		calls := []export.Call{call("a", 1, 0, body, msg, finish), call("a", 2, 0, body, msg, finish)}
		for _, r := range e.Evaluate(calls, 0) {
			if r.SequenceID != 1 && r.SequenceID != 2 || !known(r.Source) {
				t.Fatalf("bad reward %+v", r)
			}
		}
	})
}

func BenchmarkEvaluate(b *testing.B) { benchEvaluate(b, scenario()) }

// TestToolSpanRule: failed tool spans the agent reported are hits on the call
// that asked for the tool, by tool call id or else by time.
func TestToolSpanRule(t *testing.T) {
	e, err := New(Config{Rules: map[string]Rule{RuleToolSpan: {Enabled: true, Weight: -0.25}}})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(seq uint64, id string, end uint64) export.Call {
		c := call("a1", seq, 0, req(), toolMsg(id, "search", `{"q":"x"}`), "tool_calls")
		c.StartTimeUnixNano, c.EndTimeUnixNano = end-50, end
		return c
	}
	calls := []export.Call{mk(1, "c1", 100), mk(2, "c2", 200), mk(3, "c3", 300)}
	spans := []export.Span{
		{RolloutID: "ro1", AttemptID: "a1", ToolCallID: "c1", ToolName: "search", StatusCode: "error", StartTimeUnixNano: 250}, // by id: call 1
		{RolloutID: "ro1", AttemptID: "a1", ToolName: "search", StatusCode: "error", StartTimeUnixNano: 210},                   // by time: call 2
		{RolloutID: "ro1", AttemptID: "a1", ToolName: "search", StatusCode: "ok", StartTimeUnixNano: 310},                      // not failed
		{RolloutID: "ro1", AttemptID: "a1", StatusCode: "error", StartTimeUnixNano: 310},                                       // not a tool span
		{RolloutID: "ro1", AttemptID: "a2", ToolName: "search", StatusCode: "error", StartTimeUnixNano: 310},                   // other attempt
		{RolloutID: "ro1", AttemptID: "a1", ToolName: "search", StatusCode: "error", StartTimeUnixNano: 50},                    // before any call ended
	}
	rs := e.EvaluateSpans(calls, spans, 7)
	if len(rs) != 2 || rs[0].SequenceID != 1 || rs[1].SequenceID != 2 || rs[0].Source != RuleToolSpan || rs[0].Value != -0.25 || rs[1].TimeUnixNano != 7 {
		t.Fatalf("hits: %+v", rs)
	}
	if rs := e.Evaluate(calls, 7); len(rs) != 0 {
		t.Fatalf("hits without spans: %+v", rs)
	}
	off, _ := New(Config{Rules: map[string]Rule{RuleToolSpan: {Enabled: false}}})
	if rs := off.EvaluateSpans(calls, spans, 7); len(rs) != 0 {
		t.Fatalf("rule off: %+v", rs)
	}
}

// TestEvaluateInPlace checks that one attempt's calls in order (read in
// place) and the same calls shuffled (copied and sorted) give the same
// rewards, and that neither input is modified.
func TestEvaluateInPlace(t *testing.T) {
	e, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	var ordered []export.Call
	for _, c := range scenario() {
		if c.AttemptID == "a1" {
			ordered = append(ordered, c)
		}
	}
	shuffled := slices.Clone(ordered)
	slices.Reverse(shuffled)
	want := slices.Clone(shuffled)
	inPlace, copied := e.Evaluate(ordered, 1), e.Evaluate(shuffled, 1)
	if len(inPlace) == 0 || !reflect.DeepEqual(inPlace, copied) {
		t.Fatalf("in order: %+v\nshuffled: %+v", inPlace, copied)
	}
	if !reflect.DeepEqual(shuffled, want) {
		t.Fatal("Evaluate reordered its input")
	}
	if got := e.Evaluate(ordered[:0], 1); got != nil {
		t.Fatalf("no calls: %+v", got)
	}
}
