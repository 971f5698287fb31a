package gateway_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

const chatBody = gatewaytest.ChatBody

func withStream(body string, extra string) string { return gatewaytest.WithStream(body, extra) }

func uint32s(r gjson.Result) []uint32 {
	var out []uint32
	r.ForEach(func(_, v gjson.Result) bool { out = append(out, uint32(v.Uint())); return true })
	return out
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// directIDs asks the mock directly for the ids of body (with return_token_ids).
func directIDs(t *testing.T, e *env, path, body string) (prompt []uint32, choices [][]uint32) {
	t.Helper()
	r := do(t, "POST", e.mockURL+path, withStream(body, `"return_token_ids":true`))
	if r.status != 200 {
		t.Fatalf("direct call: %d %s", r.status, r.body)
	}
	prompt = uint32s(gjson.GetBytes(r.body, "prompt_token_ids"))
	gjson.GetBytes(r.body, "choices").ForEach(func(_, c gjson.Result) bool {
		choices = append(choices, uint32s(c.Get("token_ids")))
		if len(prompt) == 0 {
			prompt = uint32s(c.Get("prompt_token_ids"))
		}
		return true
	})
	return prompt, choices
}

// TestTransparencyAndCapture checks, for chat and completions, streamed and
// not: the client's bytes equal a direct call's, and the stored rows hold the
// engine's exact token ids, verified (token_source engine).
func TestTransparencyAndCapture(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		cases := []struct {
			name, path, body string
			n                int
		}{
			{"chat", "/v1/chat/completions", chatBody, 1},
			{"chat-n3", "/v1/chat/completions", withStream(chatBody, `"n":3`), 3},
			{"completions", "/v1/completions", `{"model":"mock-model","prompt":"Once upon a time","max_tokens":9}`, 1},
			{"completions-list", "/v1/completions", `{"model":"mock-model","prompt":["a b c","d e"],"max_tokens":5,"n":2}`, 4},
		}
		for _, tc := range cases {
			for _, stream := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
					body := tc.body
					if stream {
						body = withStream(body, `"stream":true`)
					}
					direct := do(t, "POST", e.mockURL+strings.TrimPrefix(tc.path, "/v1"), body)
					got := do(t, "POST", e.url+tc.path, body)
					if got.status != 200 || direct.status != 200 {
						t.Fatalf("status: gateway %d (%s), direct %d", got.status, got.body, direct.status)
					}
					sent := string(e.mock.LastRequest())
					if !strings.Contains(sent, `"return_token_ids":true`) || stream != strings.Contains(sent, `"include_usage":true`) {
						t.Fatalf("gateway did not inject return_token_ids (and include_usage for streams): %s", sent)
					}
					if string(got.body) != string(direct.body) {
						t.Fatalf("client copy differs from a direct call\n gateway: %s\n direct:  %s", got.body, direct.body)
					}
					if strings.Contains(string(got.body), "token_ids\":[") {
						t.Fatalf("injected token ids leaked to the client: %s", got.body)
					}
					if stream && strings.Contains(string(got.body), `"usage":{`) {
						t.Fatalf("injected usage chunk leaked to the client: %s", got.body)
					}
					rows := e.waitCalls(got.header.Get("x-request-id"), tc.n)
					wantPrompt, wantChoices := directIDs(t, e, strings.TrimPrefix(tc.path, "/v1"), tc.body)
					if len(wantChoices) != tc.n {
						t.Fatalf("direct call returned %d choices, want %d", len(wantChoices), tc.n)
					}
					for i, r := range rows {
						if r.ChoiceIndex != uint32(i) {
							t.Fatalf("row %d has choice_index %d", i, r.ChoiceIndex)
						}
						if !equalIDs(r.ResponseTokenIDs, wantChoices[i]) || len(r.ResponseTokenIDs) == 0 {
							t.Fatalf("choice %d: stored ids %v, engine ids %v", i, r.ResponseTokenIDs, wantChoices[i])
						}
						if tc.name != "completions-list" && !equalIDs(r.PromptTokenIDs, wantPrompt) {
							t.Fatalf("choice %d: stored prompt ids %v, engine %v", i, r.PromptTokenIDs, wantPrompt)
						}
						if len(r.PromptTokenIDs) == 0 {
							t.Fatalf("choice %d: no prompt ids stored", i)
						}
						if r.TokenSource != export.TokenSourceEngine || r.TokenCheck != "" {
							t.Fatalf("choice %d: token_source %q check %q, want engine", i, r.TokenSource, r.TokenCheck)
						}
						if r.Stream != stream || r.HTTPStatus != 200 || r.Error != "" || r.Backend != "mock-1" || r.PolicyVersion != "v7" {
							t.Fatalf("row metadata: %+v", r)
						}
						if r.RequestBody != body {
							t.Fatalf("request_body %q, want the client's body %q", r.RequestBody, body)
						}
						if r.FinishReason == "" || r.ResponseMessage == "" || !json.Valid([]byte(r.ResponseBody)) {
							t.Fatalf("row lacks finish_reason/message/valid response_body: %+v", r)
						}
						if r.PromptTokens == 0 || r.CompletionTokens == 0 || r.EndTimeUnixNano < r.StartTimeUnixNano {
							t.Fatalf("usage/timing not recorded: %+v", r)
						}
						if stream && r.TTFTNano == 0 {
							t.Fatal("ttft_nano not recorded for a stream")
						}
					}
				})
			}
		}
	})
}

// TestAttributionAndSequence checks path and header attribution, sequence ids
// from 1 per (rollout, attempt), and the response headers.
func TestAttributionAndSequence(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		var spans []string
		for i := 1; i <= 3; i++ {
			r := do(t, "POST", e.url+"/rollout/ro-1/attempt/at-1/v1/chat/completions", chatBody, "x-agent-name", "planner", "x-task-id", "task-9")
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if r.header.Get("x-rollout-id") != "ro-1" || r.header.Get("x-attempt-id") != "at-1" || r.header.Get("x-sequence-id") != strconv.Itoa(i) {
				t.Fatalf("call %d: response headers %v", i, r.header)
			}
			spans = append(spans, r.header.Get("x-request-id"))
		}
		// Another attempt starts again at 1; headers attribute too.
		r := do(t, "POST", e.url+"/v1/chat/completions", chatBody, "x-rollout-id", "ro-1", "x-attempt-id", "at-2")
		if r.header.Get("x-sequence-id") != "1" || r.header.Get("x-attempt-id") != "at-2" {
			t.Fatalf("header attribution: %v", r.header)
		}
		hdrRow := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if hdrRow.RolloutID != "ro-1" || hdrRow.AttemptID != "at-2" || hdrRow.SequenceID != 1 {
			t.Fatalf("header-attributed row: %+v", hdrRow)
		}
		// The path wins over headers.
		r = do(t, "POST", e.url+"/rollout/ro-2/attempt/a/v1/chat/completions", chatBody, "x-rollout-id", "ro-x")
		if r.header.Get("x-rollout-id") != "ro-2" {
			t.Fatalf("path must win over headers: %v", r.header)
		}
		// Unattributed: still proxied and captured, no rollout headers.
		r = do(t, "POST", e.url+"/v1/chat/completions", chatBody)
		if r.status != 200 || r.header.Get("x-rollout-id") != "" || r.header.Get("x-sequence-id") == "" || r.header.Get("x-request-id") == "" {
			t.Fatalf("unattributed call: %d %v", r.status, r.header)
		}
		if row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]; row.RolloutID != "" {
			t.Fatalf("unattributed row has rollout %q", row.RolloutID)
		}
		for i, sp := range spans {
			row := e.waitCalls(sp, 1)[0]
			if row.RolloutID != "ro-1" || row.AttemptID != "at-1" || row.SequenceID != uint64(i+1) ||
				row.AgentName != "planner" || row.TaskID != "task-9" || row.Endpoint != "/v1/chat/completions" || row.SpanID != sp || len(row.TraceID) != 32 {
				t.Fatalf("row %d: %+v", i, row)
			}
		}
	})
}

// TestTraceparent checks that the client's W3C trace id is recorded.
func TestTraceparent(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody, "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]; row.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace_id %q", row.TraceID)
	}
	r = do(t, "POST", e.url+"/v1/chat/completions", chatBody, "traceparent", "00-zz-not-valid")
	if row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]; len(row.TraceID) != 32 || row.TraceID == "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("invalid traceparent: trace %q", row.TraceID)
	}
}

// TestToolCallRoundTrip runs an agent turn that calls a tool, then answers
// with the tool result, streamed and not.
func TestToolCallRoundTrip(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		tools := `[{"type":"function","function":{"name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
		for _, stream := range []bool{false, true} {
			base := `{"model":"mock-model","tools":` + tools + `,"messages":[{"role":"user","content":"weather in Paris?"}]}`
			body := base
			if stream {
				body = withStream(base, `"stream":true`)
			}
			r := do(t, "POST", e.url+"/rollout/tool/attempt/1/v1/chat/completions", body)
			if r.status != 200 {
				t.Fatalf("status %d %s", r.status, r.body)
			}
			row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
			if row.FinishReason != "tool_calls" {
				t.Fatalf("stream=%v: finish_reason %q, want tool_calls", stream, row.FinishReason)
			}
			tc := gjson.Get(row.ResponseMessage, "tool_calls.0")
			if tc.Get("function.name").String() != "get_weather" || !json.Valid([]byte(tc.Get("function.arguments").String())) || tc.Get("id").String() == "" {
				t.Fatalf("stream=%v: rebuilt tool call %s", stream, row.ResponseMessage)
			}
			if row.TokenSource != export.TokenSourceEngine {
				t.Fatalf("token_source %q (%s)", row.TokenSource, row.TokenCheck)
			}
			// Second turn with the tool result.
			id := tc.Get("id").String()
			second := `{"model":"mock-model","tools":` + tools + `,"messages":[{"role":"user","content":"weather in Paris?"},` +
				`{"role":"assistant","content":null,"tool_calls":[` + tc.Raw + `]},{"role":"tool","tool_call_id":"` + id + `","content":"sunny"}]}`
			r2 := do(t, "POST", e.url+"/rollout/tool/attempt/1/v1/chat/completions", second)
			row2 := e.waitCalls(r2.header.Get("x-request-id"), 1)[0]
			if r2.status != 200 || row2.FinishReason == "tool_calls" || gjson.Get(row2.ResponseMessage, "content").String() == "" {
				t.Fatalf("second turn: %d %s / %s", r2.status, r2.body, row2.ResponseMessage)
			}
			if row2.SequenceID != row.SequenceID+1 {
				t.Fatalf("sequence ids %d then %d", row.SequenceID, row2.SequenceID)
			}
		}
	})
}

// TestOtherRoutes covers responses, embeddings, models, health and metrics.
func TestOtherRoutes(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		r := do(t, "POST", e.url+"/v1/responses", `{"model":"mock-model","input":"hi there"}`)
		if r.status != 200 || gjson.GetBytes(r.body, "object").String() != "response" {
			t.Fatalf("responses: %d %s", r.status, r.body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if row.Endpoint != "/v1/responses" || row.ResponseBody == "" || row.PromptTokens == 0 {
			t.Fatalf("responses row: %+v", row)
		}
		r = do(t, "POST", e.url+"/v1/responses", `{"model":"mock-model","input":"hi there","stream":true}`)
		if r.status != 200 || !strings.Contains(string(r.body), "response.completed") {
			t.Fatalf("responses stream: %d %s", r.status, r.body)
		}
		row = e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if gjson.Get(row.ResponseBody, "status").String() != "completed" || !row.Stream {
			t.Fatalf("responses stream row: %+v", row)
		}
		r = do(t, "POST", e.url+"/v1/embeddings", `{"model":"mock-model","input":["a","b"]}`)
		if r.status != 200 || len(gjson.GetBytes(r.body, "data").Array()) != 2 {
			t.Fatalf("embeddings: %d %s", r.status, r.body)
		}
		row = e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if row.RequestBody != "" || row.ResponseBody != "" || row.Endpoint != "/v1/embeddings" {
			t.Fatalf("embedding bodies must not be stored by default: %+v", row)
		}
		r = do(t, "GET", e.url+"/v1/models", "")
		if r.status != 200 || gjson.GetBytes(r.body, "object").String() != "list" || gjson.GetBytes(r.body, "data.0.id").String() != "mock-model" {
			t.Fatalf("models: %d %s", r.status, r.body)
		}
		for _, p := range []string{"/healthz", "/readyz"} {
			if r := do(t, "GET", e.url+p, ""); r.status != 200 {
				t.Fatalf("%s: %d", p, r.status)
			}
		}
		r = do(t, "GET", e.url+"/metrics", "")
		for _, name := range []string{"rollgate_requests_total", "rollgate_request_duration_seconds", "rollgate_time_to_first_token_seconds",
			"rollgate_tokens_total", "rollgate_in_flight_requests", "rollgate_capture_queue_depth", "rollgate_capture_dropped_total",
			"rollgate_export_batches_total", "rollgate_export_rows_total", "rollgate_token_ids_total"} {
			if !strings.Contains(string(r.body), name) {
				t.Fatalf("metric %s missing from /metrics", name)
			}
		}
	})
}

// TestErrors covers every error case: each answers OpenAI-style JSON and is
// captured with its error.
func TestErrors(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), func(c *gateway.Config) {
			c.MaxRequestBodyBytes = 64 << 10
			c.UpstreamTimeout = 700 * time.Millisecond
			c.Backends[0].Model = "mock-model" // no wildcard: unknown models are 404
			c.Backends = append(c.Backends,
				gateway.Backend{Model: "dead", Replicas: []gateway.Replica{{URL: "http://127.0.0.1:1/v1", Kind: "vllm"}}})
		})
		check := func(name string, r resp, status int, captured bool) {
			t.Helper()
			if r.status != status {
				t.Fatalf("%s: status %d, want %d (%s)", name, r.status, status, r.body)
			}
			msg := gjson.GetBytes(r.body, "error.message").String()
			if msg == "" || gjson.GetBytes(r.body, "error.type").String() == "" {
				t.Fatalf("%s: not an OpenAI-style error: %s", name, r.body)
			}
			if captured {
				row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
				if row.HTTPStatus != uint16(status) || row.Error == "" {
					t.Fatalf("%s: captured row status %d error %q", name, row.HTTPStatus, row.Error)
				}
			}
		}
		check("non-JSON", do(t, "POST", e.url+"/v1/chat/completions", "this is not json"), 400, true)
		check("no model", do(t, "POST", e.url+"/v1/chat/completions", `{"messages":[]}`), 400, true)
		big := `{"model":"mock-model","messages":[{"role":"user","content":"` + strings.Repeat("x", 100<<10) + `"}]}`
		check("too large", do(t, "POST", e.url+"/rollout/big/attempt/1/v1/chat/completions", big), 413, true)
		check("unknown route", do(t, "POST", e.url+"/v1/nothing-here", `{}`), 404, false)
		check("unknown api route", do(t, "GET", e.url+"/api/v1/nothing", ""), 404, false)
		check("model not routed", do(t, "POST", e.url+"/v1/chat/completions", `{"model":"dead-and-gone","messages":[]}`), 404, true)
		check("backend unreachable", do(t, "POST", e.url+"/v1/chat/completions", `{"model":"dead","messages":[{"role":"user","content":"x"}]}`), 502, true)
		check("backend timeout", do(t, "POST", e.url+"/v1/chat/completions", chatBody, "x-mock-fail", "hang"), 504, true)
		check("backend 400", do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream_options":{"include_usage":true}`)), 400, true)
	})
}

// TestNothingInjectedTowardsOpenAI checks that an openai-kind backend gets the
// client's body untouched, and the row says no ids were available.
func TestNothingInjectedTowardsOpenAI(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.Backends[0].Replicas[0].Kind = "openai"; c.InjectLogprobs = true })
	for _, body := range []string{chatBody, withStream(chatBody, `"stream":true`)} {
		r := do(t, "POST", e.url+"/v1/chat/completions", body)
		if r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		if sent := string(e.mock.LastRequest()); sent != body {
			t.Fatalf("body sent to an openai backend was changed:\n sent %s\n want %s", sent, body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if row.TokenSource != export.TokenSourceNone || len(row.ResponseTokenIDs) != 0 {
			t.Fatalf("token_source %q ids %v, want none", row.TokenSource, row.ResponseTokenIDs)
		}
	}
}

// TestInjectLogprobs checks --inject-logprobs: the engine is asked for
// logprobs, they are stored, and the client's copy has none.
func TestInjectLogprobs(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.InjectLogprobs = true })
	for _, stream := range []bool{false, true} {
		body := chatBody
		if stream {
			body = withStream(chatBody, `"stream":true`)
		}
		direct := do(t, "POST", e.mockURL+"/chat/completions", body)
		r := do(t, "POST", e.url+"/v1/chat/completions", body)
		if !strings.Contains(string(e.mock.LastRequest()), `"logprobs":true`) {
			t.Fatalf("logprobs not injected: %s", e.mock.LastRequest())
		}
		if string(r.body) != string(direct.body) {
			t.Fatalf("stream=%v: client copy differs:\n%s\n%s", stream, r.body, direct.body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if len(row.ResponseLogprobs) == 0 || len(row.ResponseLogprobs) != len(row.ResponseTokenIDs) || row.TokenSource != export.TokenSourceEngine {
			t.Fatalf("stream=%v: logprobs %d, ids %d, source %q", stream, len(row.ResponseLogprobs), len(row.ResponseTokenIDs), row.TokenSource)
		}
	}
}

// TestTokenMismatchRecorded runs against an engine that drops ids of some
// streamed chunks (vLLM's parser bug): the row must not claim engine ids.
func TestTokenMismatchRecorded(t *testing.T) {
	s, _ := openSQLite(t)
	ms, base, err := mock.Start(mock.Config{DropIDsEvery: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	e := newEnv(t, s, func(c *gateway.Config) { c.Backends[0].Replicas[0].URL = base })
	r := do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`))
	row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
	if row.TokenSource != "engine_mismatch" || !strings.Contains(row.TokenCheck, "completion_count") {
		t.Fatalf("token_source %q check %q, want engine_mismatch/completion_count", row.TokenSource, row.TokenCheck)
	}
	m := do(t, "GET", e.url+"/metrics", "")
	if !strings.Contains(string(m.body), `rollgate_token_ids_total{source="engine_mismatch"} 1`) {
		t.Fatalf("mismatch not counted in metrics")
	}
}

// TestBackendFailsMidStream: the engine sends an error event and closes; the
// client receives it as sent and the row records the error.
func TestBackendFailsMidStream(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	r := do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-fail", "midstream")
	if r.status != 200 || !strings.Contains(string(r.body), `"error"`) {
		t.Fatalf("client did not get the error event: %d %s", r.status, r.body)
	}
	row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
	if row.Error == "" {
		t.Fatalf("row has no error: %+v", row)
	}
}

// TestClientAskedFieldsKept: what the client asked for itself (token ids, the
// usage chunk, logprobs) reaches it untouched, byte for byte as from the engine.
func TestClientAskedFieldsKept(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.InjectLogprobs = true })
	for _, body := range []string{
		withStream(chatBody, `"return_token_ids":true,"logprobs":true`),
		withStream(chatBody, `"stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}`),
		`{"model":"m","prompt":"abc","stream":true,"stream_options":{"include_usage":true},"logprobs":1}`,
	} {
		path := "/chat/completions"
		if strings.Contains(body, `"prompt"`) {
			path = "/completions"
		}
		direct := do(t, "POST", e.mockURL+path, body)
		got := do(t, "POST", e.url+"/v1"+path, body)
		if string(got.body) != string(direct.body) {
			t.Fatalf("client-requested fields altered:\n gateway %s\n direct  %s", got.body, direct.body)
		}
		if strings.Contains(body, "return_token_ids") && !strings.Contains(string(got.body), `"token_ids":[`) {
			t.Fatalf("ids the client asked for are missing: %s", got.body)
		}
		if strings.Contains(body, "include_usage") && !strings.Contains(string(got.body), `"usage":{`) {
			t.Fatalf("usage chunk the client asked for is missing: %s", got.body)
		}
	}
}

// TestTokenizeFallback: an engine that ignores return_token_ids (vLLM before
// 0.10.2) still yields exact ids when the agent asked for logprobs with
// return_tokens_as_token_ids: prompt ids from /tokenize, output ids from the
// logprobs, marked token_source = tokenize and equal to what a newer engine sends.
func TestTokenizeFallback(t *testing.T) {
	s, _ := openSQLite(t)
	old, base, err := mock.Start(mock.Config{IgnoreReturnTokenIDs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { old.Shutdown() })
	e := newEnv(t, s, func(c *gateway.Config) { c.Backends[0].Replicas[0].URL = base })
	for _, stream := range []bool{false, true} {
		body := withStream(chatBody, `"logprobs":true,"return_tokens_as_token_ids":true`)
		if stream {
			body = withStream(body, `"stream":true`)
		}
		r := do(t, "POST", e.url+"/v1/chat/completions", body)
		if r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		wantPrompt, wantChoices := directIDs(t, e, "/chat/completions", chatBody)
		if row.TokenSource != export.TokenSourceTokenize || !equalIDs(row.PromptTokenIDs, wantPrompt) || !equalIDs(row.ResponseTokenIDs, wantChoices[0]) {
			t.Fatalf("stream=%v: source %q check %q prompt %v (want %v) output %v (want %v)", stream, row.TokenSource, row.TokenCheck,
				row.PromptTokenIDs, wantPrompt, row.ResponseTokenIDs, wantChoices[0])
		}
	}
	// Without logprobs the output ids cannot be recovered: not claimed.
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
	if row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]; row.TokenSource == export.TokenSourceEngine || row.TokenSource == export.TokenSourceTokenize {
		t.Fatalf("ids claimed without a source: %q", row.TokenSource)
	}
}

// TestTurnConsistencyRecorded: consecutive calls of a rollout get turn_kind:
// "first", then "prefix" when the agent appends to the conversation, and a
// break kind when it rewrites earlier context.
func TestTurnConsistencyRecorded(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	url := e.url + "/rollout/turns/attempt/1/v1/chat/completions"
	first := `{"model":"mock-model","messages":[{"role":"user","content":"Plan a trip to Rome"}]}`
	r1 := do(t, "POST", url, first)
	row1 := e.waitCalls(r1.header.Get("x-request-id"), 1)[0]
	reply := gjson.Get(row1.ResponseMessage, "content").String()
	second := `{"model":"mock-model","messages":[{"role":"user","content":"Plan a trip to Rome"},{"role":"assistant","content":` +
		strconv.Quote(reply) + `},{"role":"user","content":"Make it shorter"}]}`
	r2 := do(t, "POST", url, second)
	row2 := e.waitCalls(r2.header.Get("x-request-id"), 1)[0]
	edited := `{"model":"mock-model","messages":[{"role":"user","content":"Plan a trip to Paris instead"},{"role":"user","content":"Go"}]}`
	r3 := do(t, "POST", url, edited)
	row3 := e.waitCalls(r3.header.Get("x-request-id"), 1)[0]
	if row1.TurnKind != "first" || row2.TurnKind != "prefix" || row2.TurnPrevSequenceID != 1 ||
		row2.TurnPrefixLen != uint32(len(row1.PromptTokenIDs)+len(row1.ResponseTokenIDs)) {
		t.Fatalf("turns: %q, then %q (prev %d, prefix %d of %d)", row1.TurnKind, row2.TurnKind, row2.TurnPrevSequenceID,
			row2.TurnPrefixLen, len(row1.PromptTokenIDs)+len(row1.ResponseTokenIDs))
	}
	if row3.TurnKind == "prefix" || row3.TurnKind == "" || row3.TurnPrevSequenceID != 2 {
		t.Fatalf("edited context recorded as %q (prev %d)", row3.TurnKind, row3.TurnPrevSequenceID)
	}
	t.Logf("edited context classified %q", row3.TurnKind)
}

// TestOldVLLMIdsWithoutAgentChanges: a vLLM before 0.10.2 (by its /version,
// or token_ids: logprobs in the config) is asked for logprobs named by id
// instead of return_token_ids; the client gets exactly the bytes of a direct
// call, and the row has the exact ids (token_source = tokenize).
func TestOldVLLMIdsWithoutAgentChanges(t *testing.T) {
	s, _ := openSQLite(t)
	for _, c := range []struct {
		name, version, tokenIDs string
	}{{"by version", "0.9.2", ""}, {"by config", "0.10.2", "logprobs"}} {
		t.Run(c.name, func(t *testing.T) {
			old, base, err := mock.Start(mock.Config{IgnoreReturnTokenIDs: true, Version: c.version})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { old.Shutdown() })
			e := newEnv(t, s, func(cfg *gateway.Config) {
				cfg.Backends[0].Replicas[0].URL = base
				cfg.Backends[0].Replicas[0].Kind = "vllm"
				cfg.Backends[0].Replicas[0].TokenIDs = c.tokenIDs
			})
			for _, stream := range []bool{false, true} {
				body := chatBody
				if stream {
					body = withStream(chatBody, `"stream":true`)
				}
				r := do(t, "POST", e.url+"/v1/chat/completions", body)
				direct := do(t, "POST", base+"/chat/completions", body)
				if r.status != 200 || string(r.body) != string(direct.body) {
					t.Fatalf("stream=%v: the client's copy differs from a direct call:\n%s\n--- direct:\n%s", stream, r.body, direct.body)
				}
				row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
				wantPrompt, wantChoices := directIDs(t, e, "/chat/completions", chatBody)
				if row.TokenSource != export.TokenSourceTokenize || !equalIDs(row.PromptTokenIDs, wantPrompt) || !equalIDs(row.ResponseTokenIDs, wantChoices[0]) {
					t.Fatalf("stream=%v: source %q check %q prompt %v (want %v) output %v (want %v)", stream, row.TokenSource, row.TokenCheck,
						row.PromptTokenIDs, wantPrompt, row.ResponseTokenIDs, wantChoices[0])
				}
			}
		})
	}
}

// TestDetokCheckWithEngine: with detok_check "engine", each captured call's
// output ids are decoded by the replica's own /detokenize and match the text
// it returned (streamed and not): counted, token_check stays clean.
func TestDetokCheckWithEngine(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.DetokCheck = "engine" })
	for _, body := range []string{chatBody, withStream(chatBody, `"stream":true`)} {
		r := do(t, "POST", e.url+"/v1/chat/completions", body)
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if r.status != 200 || row.TokenSource != export.TokenSourceEngine || row.TokenCheck != "" {
			t.Fatalf("%d source %q check %q", r.status, row.TokenSource, row.TokenCheck)
		}
	}
	m := string(do(t, "GET", e.url+"/metrics", "").body)
	if !strings.Contains(m, `rollgate_detok_total{outcome="match"} 2`) {
		t.Fatalf("detok metric:\n%s", grepLines(m, "rollgate_detok_total"))
	}
	if e.mock.RequestsTo("/detokenize") < 2 {
		t.Fatalf("the engine's /detokenize was called %d times", e.mock.RequestsTo("/detokenize"))
	}
}
