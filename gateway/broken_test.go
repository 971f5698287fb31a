package gateway_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
)

// TestBrokenBackendResponses: a backend that sends broken SSE (an event with
// cut JSON, a line that is not SSE, a stream that stops without finish or
// [DONE]) or a broken JSON body never crashes the gateway: the client gets
// the backend's bytes (and, when the stream ends without [DONE], an
// OpenAI-style error event), and exactly one row is captured per call with
// the problem in its error column, in both stores.
func TestBrokenBackendResponses(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		body := `{"model":"mock-model","messages":[{"role":"user","content":"hi"}],"stream":true}`
		for _, c := range []struct {
			knob, clientHas, rowError string
		}{
			{"badjson", `"delta":{"content":"x` + "\n\n", "invalid JSON"},
			{"junk", "this line is not server-sent events\n\n", ""},
			{"truncate", "ended without [DONE]", "ended without [DONE]"},
		} {
			t.Run(c.knob, func(t *testing.T) {
				r := do(t, "POST", e.url+"/v1/chat/completions", body, "x-mock-fail", c.knob, "x-mock-tokens", "10")
				if r.status != 200 || !strings.Contains(string(r.body), c.clientHas) {
					t.Fatalf("client got %d:\n%s", r.status, r.body)
				}
				rows := e.waitCalls(r.header.Get("x-request-id"), 1)
				if c.rowError == "" {
					if rows[0].Error != "" || rows[0].FinishReason != "stop" {
						t.Fatalf("junk between events should be ignored: error %q finish %q", rows[0].Error, rows[0].FinishReason)
					}
				} else if !strings.Contains(rows[0].Error, c.rowError) {
					t.Fatalf("row error %q, want it to mention %q", rows[0].Error, c.rowError)
				}
			})
		}
		// Non-streamed: a cut body and a body that is not JSON. Each is
		// followed by a normal call: a broken body once put a buffer capture
		// still owned into the gateway's pool, corrupting the next request.
		for i := 0; i < 10; i++ {
			for _, knob := range []string{"badjson", "junk"} {
				r := do(t, "POST", e.url+"/v1/chat/completions", chatBody, "x-mock-fail", knob)
				if i == 0 {
					rows := e.waitCalls(r.header.Get("x-request-id"), 1)
					if rows[0].Error == "" {
						t.Errorf("%s: non-streamed broken body captured without an error (client got %d %s)", knob, r.status, r.body)
					}
					if r.status == 200 && gjson.ValidBytes(r.body) {
						t.Errorf("%s: client got a valid 200 body from a broken backend body: %s", knob, r.body)
					}
				}
				if ok := do(t, "POST", e.url+"/v1/chat/completions", chatBody); ok.status != 200 {
					t.Fatalf("call after a broken %s body: %d %s", knob, ok.status, ok.body)
				}
			}
		}
		// The gateway is still fine.
		if r := do(t, "POST", e.url+"/v1/chat/completions", chatBody); r.status != 200 {
			t.Fatalf("after broken backends: %d %s", r.status, r.body)
		}
	})
}
