package main

// Deeply nested JSON against the real process (issue 36, item 1): a body of
// millions of '[' overflowed the stack of gjson's recursive validator, a
// fatal error recover cannot catch, on the agent routes, on AGL's routes
// and in capture (an upstream answer), where the WAL replayed it at every
// start. Bodies are now refused, or captured as error rows, at
// jsonscan.MaxDepth (512).

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
)

// deepLevels nests well past what a goroutine's 1 GB stack holds for
// gjson's validator (5 million levels sometimes did not crash; 10 million
// always did).
const deepLevels = 10 << 20

// deepJSON is `prefix` + deepLevels '[' (+ as many ']' and `suffix` when
// closed: valid JSON then).
func deepJSON(prefix, suffix string, closed bool) string {
	var b strings.Builder
	b.Grow(len(prefix) + 2*deepLevels + len(suffix))
	b.WriteString(prefix)
	b.WriteString(strings.Repeat("[", deepLevels))
	if closed {
		b.WriteString(strings.Repeat("]", deepLevels))
		b.WriteString(suffix)
	}
	return b.String()
}

// rawPost sends body to addr's path with the given Content-Type over a raw
// connection (so that nothing on the client side parses or changes it) and
// returns the answer.
func rawPost(t *testing.T, addr, path, contentType, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	return rawExchange(t, addr, "POST "+path+" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "+contentType+"\r\n"+
		strings.Join(headers, "")+"Content-Length: "+strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
}

// TestDeepRequestBodiesRefused: a request nested deeper than the limit on
// the agent route (any Content-Type, no key), on /api/v1 and on /v1/traces
// gets a 400 naming the limit; the gateway stays up, the next call of the
// same rollout works and gets sequence id 1, nothing is stored under the
// rollout, and the refusal is counted (json_depth).
func TestDeepRequestBodiesRefused(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	deep := deepJSON(`{"model":"mock-model","x":`, "", false)
	for _, ct := range []string{"application/json", "text/plain"} {
		r, b := rawPost(t, addr, "/rollout/deep/attempt/1/v1/chat/completions", ct, deep)
		if r.StatusCode != 400 || !strings.Contains(b, `"invalid_request_error"`) || !strings.Contains(b, "512 levels") {
			t.Fatalf("deep chat request (%s): %d %s, want a 400 OpenAI-style error naming the limit\n%s", ct, r.StatusCode, truncateForLog(b), logs)
		}
		if v := r.Header.Get("X-Sequence-Id"); v != "" {
			t.Fatalf("deep chat request took sequence id %s", v)
		}
	}
	if n := metricSum(t, addr, `rollgate_calls_rejected_total{reason="json_depth"}`); n != 2 {
		t.Errorf(`rollgate_calls_rejected_total{reason="json_depth"} = %v, want 2`, n)
	}
	// /api/v1 and OTLP/JSON: 400 in their own styles, naming the limit.
	for _, c := range []struct{ path, body string }{
		{"/api/v1/tasks", deepJSON(`{"task_id":"t","input":`, "", false)},
		{"/api/v1/rollouts", deepJSON(`{"rollout_id":"deep","metadata":`, "}", true)},
		{"/api/v1/rollouts/deep/calls", deepJSON(`{"calls":[{"request":`, "}]}", true)},
		{"/api/v1/pause", deepJSON(``, "", false)},
		{"/v1/traces", deepJSON(`{"resourceSpans":`, "}", true)},
	} {
		r, b := rawPost(t, addr, c.path, "application/json", c.body)
		if r.StatusCode != 400 || !strings.Contains(b, "512 levels") {
			t.Fatalf("deep body on %s: %d %s, want 400 naming the limit\n%s", c.path, r.StatusCode, truncateForLog(b), logs)
		}
	}
	if r, b := rawPost(t, addr, "/api/v1/pause", "application/json", ""); r.StatusCode != 200 {
		t.Fatalf("POST /api/v1/pause without a body: %d %s", r.StatusCode, b)
	} else if r, b := rawPost(t, addr, "/api/v1/resume", "application/json", ""); r.StatusCode != 200 {
		t.Fatalf("POST /api/v1/resume: %d %s", r.StatusCode, b)
	}
	// Still up; the rollout's first admitted call is sequence 1.
	r, b := rawPost(t, addr, "/rollout/deep/attempt/1/v1/chat/completions", "application/json",
		`{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`)
	if r.StatusCode != 200 || r.Header.Get("X-Sequence-Id") != "1" {
		t.Fatalf("the call after the deep ones: %d seq %q %s", r.StatusCode, r.Header.Get("X-Sequence-Id"), b)
	}
	stop(t, cmd, logs)
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE rollout_id = 'deep'"); n != 1 {
		t.Fatalf("%d rows under the rollout, want only the valid call's", n)
	}
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE length(request_body) > 100000"); n != 0 {
		t.Fatalf("%d rows hold a deep request body", n)
	}
}

// TestDeepAGLBodiesRefused: AGL's routes answer a body nested deeper than
// the limit with 422 (json_invalid, naming the limit) — POST /api/rollouts,
// /proxy/pause, /api/models — and its LLM proxy route with 400 as for any
// invalid JSON; AGL goes on serving.
func TestDeepAGLBodiesRefused(t *testing.T) {
	ms, mockURL, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	addr, dir := freeAddr(t), t.TempDir()
	cmd, logs := start(t, addr, "/healthz", "serve", "--listen", addr, "--db", filepath.Join(dir, "rollgate.db"),
		"--upstream", mockURL, "--agl", "--agl-key", "agl-key", "--agl-model-name", "policy")
	base := "http://" + addr
	key := "x-api-key: agl-key\r\n"
	for _, c := range []struct{ path, body string }{
		{"/api/rollouts", deepJSON(`[{"input":`, "}]", true)},
		{"/api/rollouts", deepJSON(``, "", false)},
		{"/proxy/pause", deepJSON(`{"reason":`, "", false)},
		{"/api/models", deepJSON(`[`, "]", true)},
	} {
		r, b := rawPost(t, addr, c.path, "application/json", c.body, key)
		if r.StatusCode != 422 || !strings.Contains(b, `"json_invalid"`) || !strings.Contains(b, "512 levels") {
			t.Fatalf("deep body on %s: %d %s, want 422 json_invalid naming the limit\n%s", c.path, r.StatusCode, truncateForLog(b), logs)
		}
	}
	aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+mockURL+`","version":1}]`, 201)
	aglDo(t, "POST", base+"/api/rollouts", `[{"input":{"data_id":"d1"},"rollout_id":"r1"}]`, 201)
	agent := "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
	r, b := rawPost(t, addr, agent, "application/json", deepJSON(`{"model":"auto","messages":`, "}", true), key)
	if r.StatusCode != 400 || !strings.Contains(b, "512 levels") {
		t.Fatalf("deep body on the LLM proxy: %d %s, want 400 naming the limit\n%s", r.StatusCode, truncateForLog(b), logs)
	}
	aglDo(t, "POST", base+agent, `{"model":"auto","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 200)
	aglDo(t, "POST", base+"/proxy/pause", `{}`, 200)
	aglDo(t, "POST", base+"/proxy/resume", `{}`, 200)
	stop(t, cmd, logs)
}

// deepUpstream is an OpenAI-compatible server whose chat answers nest
// deeper than the limit: the non-streamed body, or one event of a stream
// between two regular ones.
type deepUpstream struct {
	*httptest.Server
	body   string // the non-streamed answer
	stream string // the whole SSE stream
}

func newDeepUpstream(t *testing.T) *deepUpstream {
	u := &deepUpstream{
		body: deepJSON(`{"id":"d1","object":"chat.completion","model":"deep-model","x":`, `}`, true),
		stream: "data: " + `{"id":"d2","object":"chat.completion.chunk","model":"deep-model","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}` + "\n\n" +
			"data: " + deepJSON(`{"id":"d2","object":"chat.completion.chunk","model":"deep-model","x":`, `}`, true) + "\n\n" +
			"data: " + `{"id":"d2","object":"chat.completion.chunk","model":"deep-model","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]}` + "\n\n" +
			"data: [DONE]\n\n",
	}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := io.ReadAll(r.Body)
		switch {
		case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/chat/completions") && bytes.Contains(req, []byte(`"stream":true`)):
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, u.stream)
		case r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/chat/completions"):
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, u.body)
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"object":"list","data":[{"id":"deep-model","object":"model","owned_by":"deep"}]}`)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

// TestDeepUpstreamAnswerCaptured: an upstream answer nested deeper than the
// limit, streamed or not, reaches the client unchanged and is stored as an
// error row naming the limit (token_source none, no response body; the
// stream's other events assembled). With --spool-dir the calls are in the
// WAL when the gateway is killed before storing them, and the restart
// replays them without dying.
func TestDeepUpstreamAnswerCaptured(t *testing.T) {
	up := newDeepUpstream(t)
	addr, dir := freeAddr(t), t.TempDir()
	db := filepath.Join(dir, "r.db")
	args := []string{"serve", "--listen", addr, "--db", db, "--spool-dir", filepath.Join(dir, "spool"),
		"--upstream", up.URL + "/v1", "--upstream-kind", "openai", "--model", "deep-model"}
	// The first run never writes its rows (flushes once an hour), so both
	// calls are still in the WAL when it is killed.
	first := exec.Command(binary, append(args, "--capture-flush-interval", "1h", "--capture-batch-size", "100000")...)
	logs := startCmd(t, first, addr)
	call := func(stream bool) (*http.Response, string) {
		return rawPost(t, addr, "/rollout/deepup/attempt/1/v1/chat/completions", "application/json",
			`{"model":"deep-model","stream":`+strconv.FormatBool(stream)+`,"messages":[{"role":"user","content":"hi"}]}`)
	}
	r, b := call(false)
	if r.StatusCode != 200 || b != up.body {
		t.Fatalf("non-streamed deep answer: %d, %d bytes (want the upstream's %d unchanged)\n%s", r.StatusCode, len(b), len(up.body), logs)
	}
	r, b = call(true)
	if r.StatusCode != 200 || b != up.stream {
		t.Fatalf("streamed deep answer: %d, %d bytes (want the upstream's %d unchanged)\n%s", r.StatusCode, len(b), len(up.stream), logs)
	}
	waitUntil(t, "the gateway to stay up after capturing the deep answers", 10*time.Second, func() bool {
		return metricSum(t, addr, "rollgate_captured_rows_total") >= 2
	})
	if err := first.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	first.Wait()

	// The restart replays both calls from the WAL, stores their rows and
	// stays up.
	second := exec.Command(binary, args...)
	logs = startCmd(t, second, addr)
	waitUntil(t, "the WAL's calls to be replayed", 20*time.Second, func() bool {
		return strings.Contains(logs.String(), "calls of an earlier run queued for capture again")
	})
	if !strings.Contains(logs.String(), `calls=2`) {
		t.Fatalf("the restart did not replay both calls:\n%s", logs)
	}
	r, b = rawPost(t, addr, "/rollout/deepup/attempt/2/v1/chat/completions", "application/json",
		`{"model":"deep-model","messages":[{"role":"user","content":"hi"}]}`)
	if r.StatusCode != 200 || b != up.body {
		t.Fatalf("a call after the replay: %d, %d bytes\n%s", r.StatusCode, len(b), logs)
	}
	stop(t, second, logs)
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE rollout_id = 'deepup' AND attempt_id = '1' AND stream = 0 "+
		"AND error LIKE 'response body not captured: JSON nested more than 512 levels deep%' AND response_body = '' AND token_source = 'none'"); n != 1 {
		t.Fatalf("%d error rows for the non-streamed deep answer, want 1\n%s", n, logs)
	}
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE rollout_id = 'deepup' AND attempt_id = '1' AND stream = 1 "+
		"AND error LIKE 'stream event not captured: JSON nested more than 512 levels deep%' AND response_message LIKE '%hi!%'"); n != 1 {
		t.Fatalf("%d error rows for the streamed deep answer, want 1\n%s", n, logs)
	}
	if n := sqlCount(t, db, "SELECT count(*) AS n FROM llm_calls WHERE length(response_body) > 100000"); n != 0 {
		t.Fatalf("%d rows hold a deep response body", n)
	}
}
