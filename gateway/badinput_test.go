package gateway_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// TestBadInputAnsweredAndCaptured sends the inputs issue 4 names (malformed
// JSON, wrong types, huge n, invalid UTF-8, odd nesting, junk paths under
// the LLM routes) through the real gateway to the mock engine: each gets a
// clear OpenAI-style error (the gateway's or the engine's, passed through)
// or a normal answer, and every call on an LLM route leaves exactly one
// captured row with its status, so nothing the agent did is lost.
func TestBadInputAnsweredAndCaptured(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	// The deepest nesting allowed (jsonscan.MaxDepth, the body's own object
	// included); deeper bodies are refused before admission, not captured
	// (TestDeepRequestBodiesRefused in cmd/rollgate; issue 36).
	deep := strings.Repeat(`{"a":`, jsonscan.MaxDepth-1) + "1" + strings.Repeat("}", jsonscan.MaxDepth-1)
	for _, tc := range []struct {
		name, path, body string
		status           int // 0: any 4xx; -1: passed through, any answer
	}{
		{"truncated JSON", "/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"x"`, 400},
		{"body is an array", "/v1/chat/completions", `[1,2,3]`, 400},
		{"model is a number", "/v1/chat/completions", `{"model":123,"messages":[{"role":"user","content":"x"}]}`, 400},
		{"messages is a string", "/v1/chat/completions", `{"model":"mock-model","messages":"hello"}`, 0},
		{"stream is a string", "/v1/chat/completions", `{"model":"mock-model","stream":"yes","messages":[{"role":"user","content":"x"}]}`, 0},
		{"huge n", "/v1/chat/completions", `{"model":"mock-model","n":100000000,"messages":[{"role":"user","content":"x"}]}`, 0},
		{"negative n", "/v1/chat/completions", `{"model":"mock-model","n":-1,"messages":[{"role":"user","content":"x"}]}`, 0},
		{"n is a float", "/v1/completions", `{"model":"mock-model","n":1e300,"prompt":"x"}`, 0},
		{"invalid UTF-8 in content", "/v1/chat/completions", "{\"model\":\"mock-model\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\xc3\"}]}", -1},
		{"invalid UTF-8 in model", "/v1/chat/completions", "{\"model\":\"\xff\xfe\",\"messages\":[]}", 0},
		{"deep nesting", "/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"x"}],"extra":` + deep + `}`, -1},
		{"null prompt", "/v1/completions", `{"model":"mock-model","prompt":null}`, 0},
		{"empty body", "/v1/embeddings", ``, 400},
		{"junk path under the rollout prefix", "/rollout/r/attempt/1/v1/chat/completions/../../x", `{}`, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, "POST", e.url+tc.path, tc.body)
			switch {
			case tc.status > 0 && r.status != tc.status:
				t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
			case tc.status == 0 && (r.status < 400 || r.status >= 500):
				t.Fatalf("status %d, want a 4xx from the gateway or the engine: %s", r.status, r.body)
			case r.status >= 500:
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			failed := r.status >= 400
			if msg := gjson.GetBytes(r.body, "error.message").String(); failed && msg == "" {
				t.Fatalf("not an OpenAI-style error: %s", r.body)
			}
			id := r.header.Get("x-request-id")
			if r.status == 404 {
				return // not an LLM call: nothing to capture
			}
			if id == "" {
				t.Fatalf("no x-request-id on an LLM route")
			}
			row := e.waitCalls(id, 1)[0]
			if int(row.HTTPStatus) != r.status || (row.Error != "") != failed {
				t.Fatalf("captured row: status %d error %q, want status %d (error recorded: %v)", row.HTTPStatus, row.Error, r.status, failed)
			}
			if row.RequestBody != tc.body {
				t.Fatalf("captured request body differs from what the client sent (%d bytes stored, %d sent)", len(row.RequestBody), len(tc.body))
			}
		})
	}
	if got := e.mock.ActiveStreams(); got != 0 {
		t.Fatalf("%d engine streams left open", got)
	}
}
