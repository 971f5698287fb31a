package main

// Security drills on Agent Lightning's surface (issue 36 item 2): what the
// AGL key may register with POST /api/models, and what the /proxy route
// hands back from what was registered.

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// startMock starts the mock engine (the operator's backend) until the
// test ends and returns its base URL.
func startMock(t *testing.T) string {
	t.Helper()
	ms, url, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	return url
}

// aglStatus sends a request with AGL's key and returns its status and body,
// whatever they are.
func aglStatus(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	r := aglRequest(t, method, url, body)
	return r.Status, string(r.Body)
}

// aglRequest sends a request with AGL's key and more headers (name, value,
// ...).
func aglRequest(t *testing.T, method, url, body string, headers ...string) gatewaytest.Resp {
	t.Helper()
	return gatewaytest.Do(t, method, url, body, append([]string{"x-api-key", "agl-key"}, headers...)...)
}

// intruder is an OpenAI-compatible endpoint that is not the operator's: it
// counts the model calls (POSTs: the prompts) it is sent and answers
// "INTRUDER". (Health checks and engine probes are GETs.)
type intruder struct {
	*httptest.Server
	hits atomic.Int64
}

func newIntruder(t *testing.T) *intruder {
	in := &intruder{}
	in.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			in.hits.Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"INTRUDER"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	t.Cleanup(in.Close)
	return in
}

// aglServeArgs are serve's arguments for a gateway on addr and db with the
// operator's backend upstream and AGL's surface (key "agl-key").
func aglServeArgs(addr, db, upstream string, more ...string) []string {
	return append([]string{"serve", "--listen", addr, "--db", db, "--upstream", upstream,
		"--agl", "--agl-key", "agl-key", "--agl-model-name", "policy"}, more...)
}

// agentCall is an ordinary agent's call on rollgate's own route.
func agentCall(t *testing.T, base, model string) (int, string) {
	t.Helper()
	code, body, _ := post(t, base+"/v1/chat/completions", `{"model":"`+model+`","max_tokens":3,"messages":[{"role":"user","content":"hello"}]}`)
	return code, body
}

// operatorPools is GET /api/v1/backends as "model=url,url;..." in order.
func operatorPools(t *testing.T, base string) string {
	t.Helper()
	r, err := http.Get(base + "/api/v1/backends")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	var out []string
	for _, p := range gjson.GetBytes(b, "backends").Array() {
		var urls []string
		for _, u := range p.Get("replicas.#.url").Array() {
			urls = append(urls, u.String())
		}
		out = append(out, p.Get("model").String()+"="+strings.Join(urls, ","))
	}
	return strings.Join(out, ";")
}

// TestAGLKeyCannotTakeOverOperatorRouting: the AGL key registers a
// wildcard and the agents' model name at an endpoint of its own; ordinary
// agent calls on rollgate's own route still go to the operator's pool, the
// operator's table is unchanged, DELETE /api/models leaves it, and a
// restart does not re-apply the registrations over it. AGL's own proxy
// route still serves what AGL registered.
func TestAGLKeyCannotTakeOverOperatorRouting(t *testing.T) {
	mockURL := startMock(t)
	in := newIntruder(t)
	addr, dir := freeAddr(t), t.TempDir()
	args := aglServeArgs(addr, filepath.Join(dir, "rollgate.db"), mockURL)
	cmd, logs := start(t, addr, "/readyz", args...)
	base := "http://" + addr
	want := "*=" + mockURL
	if got := operatorPools(t, base); got != want {
		t.Fatalf("operator's table at start: %s", got)
	}
	// AGL's own surface works with what it registers.
	aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+mockURL+`","version":1}]`, 201)
	aglDo(t, "POST", base+"/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	aglDo(t, "POST", base+"/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions",
		`{"model":"auto","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, 200)

	takeover := `[{"model":"*","endpoint":"` + in.URL + `/v1"},{"model":"mock-model","endpoint":"` + in.URL + `/v1"}]`
	code, body := aglStatus(t, "POST", base+"/api/models", takeover)
	t.Logf("POST /api/models with a wildcard: %d %s", code, body)
	check := func(when string) {
		t.Helper()
		for _, model := range []string{"mock-model", "any-other-model"} {
			code, body := agentCall(t, base, model)
			if code != 200 || strings.Contains(body, "INTRUDER") {
				t.Errorf("%s: agent call for %s: %d %.200s", when, model, code, body)
			}
		}
		if n := in.hits.Load(); n != 0 {
			t.Errorf("%s: the AGL-registered endpoint got %d agent calls (prompts out, its answers back)", when, n)
		}
		if got := operatorPools(t, base); got != want {
			t.Errorf("%s: operator's table is %q, want %q", when, got, want)
		}
	}
	check("after POST /api/models")

	aglDo(t, "DELETE", base+"/api/models", "", 200)
	check("after DELETE /api/models")

	// Registered again, persisted, and the gateway restarted on the same files.
	aglStatus(t, "POST", base+"/api/models", takeover)
	stop(t, cmd, logs)
	_, logs2 := start(t, addr, "/readyz", args...)
	check("after a restart")
	if t.Failed() {
		t.Logf("logs after the restart:\n%s", logs2)
	}
}

// TestAGLPersistedModelsNeverOverrideOperator: models stored in
// rg_settings.agl_models (here written while the gateway is down, as an
// older version or a registration since disallowed left them) never
// replace the operator's pools at start; an entry the allowed endpoints no
// longer admit is dropped with a warning naming it (credentials redacted).
func TestAGLPersistedModelsNeverOverrideOperator(t *testing.T) {
	mockURL := startMock(t)
	in := newIntruder(t)
	addr, dir := freeAddr(t), t.TempDir()
	db := filepath.Join(dir, "rollgate.db")
	args := aglServeArgs(addr, db, mockURL)
	cmd, logs := start(t, addr, "/readyz", args...)
	stop(t, cmd, logs)

	q, err := tasks.Open(context.Background(), db, tasks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	stored := `[{"model":"*","endpoint":"` + in.URL + `/v1","version":0},` +
		`{"model":"policy","endpoint":"http://192.0.2.10:8000/v1","version":3},` +
		`{"model":"policy","endpoint":"http://olduser:oldpw-7731@127.0.0.1:9/v1","version":3}]`
	if err := q.PutSetting(context.Background(), "agl_models", stored); err != nil {
		t.Fatal(err)
	}
	q.Close()

	_, logs = start(t, addr, "/readyz", args...)
	base := "http://" + addr
	if code, body := agentCall(t, base, "mock-model"); code != 200 || strings.Contains(body, "INTRUDER") || in.hits.Load() != 0 {
		t.Errorf("agent call after a start with stored AGL models: %d %.200s (intruder hits %d)", code, body, in.hits.Load())
	}
	if got := operatorPools(t, base); got != "*="+mockURL {
		t.Errorf("operator's table after a start with stored AGL models: %s", got)
	}
	testenvWaitLog(t, logs, "192.0.2.10")
	l := logs.String()
	if !strings.Contains(l, "agl.allowed_endpoints") {
		t.Errorf("no warning naming agl.allowed_endpoints for the dropped entry:\n%s", l)
	}
	if strings.Contains(l, "oldpw-7731") {
		t.Errorf("the logs show a stored endpoint's password:\n%s", l)
	}
}

// testenvWaitLog waits until the logs hold s.
func testenvWaitLog(t *testing.T, logs *syncBuffer, s string) {
	t.Helper()
	waitUntil(t, "a log line with "+s, 10*time.Second, func() bool { return strings.Contains(logs.String(), s) })
}

// TestAGLEndpointsRestrictedAndCredentialFree: an endpoint outside the
// allowed hosts (default: loopback and the operator's replicas) is refused
// with 422 naming agl.allowed_endpoints; an endpoint URL with credentials
// is refused, and its password never shows in /metrics, llm_calls.backend
// or the logs.
func TestAGLEndpointsRestrictedAndCredentialFree(t *testing.T) {
	mockURL := startMock(t)
	addr, dir := freeAddr(t), t.TempDir()
	db := filepath.Join(dir, "rollgate.db")
	cmd, logs := start(t, addr, "/readyz", aglServeArgs(addr, db, mockURL, "--log-level", "debug")...)
	base := "http://" + addr

	withCreds := strings.Replace(mockURL, "http://", "http://agluser:s3cretpw-7731@", 1)
	code, body := aglStatus(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+withCreds+`"}]`)
	if code != 422 || strings.Contains(body, "s3cretpw") {
		t.Errorf("an endpoint with credentials: %d %s", code, body)
	}
	aglDo(t, "POST", base+"/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	code, body = aglStatus(t, "POST", base+"/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions",
		`{"model":"auto","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`)
	t.Logf("proxy call: %d %.200s", code, body)
	m, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(m.Body)
	m.Body.Close()
	if strings.Contains(string(mb), "s3cretpw") {
		t.Errorf("unauthenticated /metrics shows the endpoint's password")
	}
	aglDo(t, "DELETE", base+"/api/models", "", 200)
	code, body = aglStatus(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"http://192.0.2.10:8000/v1"}]`)
	if code != 422 || !strings.Contains(body, "agl.allowed_endpoints") {
		t.Errorf("an endpoint outside loopback and the operator's replicas: %d %s", code, body)
	}
	stop(t, cmd, logs)
	if n := sqlCount(t, db, "SELECT count(*) FROM llm_calls WHERE backend LIKE '%s3cretpw%'"); n != 0 {
		t.Errorf("%d llm_calls rows hold the endpoint's password in backend", n)
	}
	if strings.Contains(logs.String(), "s3cretpw") {
		t.Errorf("the logs show the endpoint's password")
	}
}

// TestAGLAllowedEndpointsSetting: agl.allowed_endpoints (here from its
// environment variable, overridden by the flag) replaces the default.
func TestAGLAllowedEndpointsSetting(t *testing.T) {
	addr := freeAddr(t)
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"),
		"--agl", "--agl-key", "agl-key", "--agl-model-name", "policy", "--agl-allowed-endpoints", "192.0.2.0/24,gpu-node.internal")
	cmd.Env = append(os.Environ(), "ROLLGATE_AGL_ALLOWED_ENDPOINTS=loopback")
	startCmd(t, cmd, addr)
	base := "http://" + addr
	aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"http://192.0.2.10:8000/v1"},{"model":"policy","endpoint":"http://GPU-node.internal:8000/v1"}]`, 201)
	for _, ep := range []string{"http://127.0.0.1:8000/v1", "http://198.51.100.1:8000/v1", "http://other.internal/v1", "http://[::ffff:127.0.0.1]:80/v1"} {
		if code, body := aglStatus(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+ep+`"}]`); code != 422 || !strings.Contains(body, "--agl-allowed-endpoints") {
			t.Errorf("%s under --agl-allowed-endpoints 192.0.2.0/24,gpu-node.internal: %d %s", ep, code, body)
		}
	}
}

// TestAGLProxyWithholdsNonEngineAnswers: the /proxy route does not turn the
// AGL key into a port scanner that reads what local services answer: an
// endpoint that answers HTML, a non-JSON error, invalid JSON or no HTTP at
// all gets the client a 502 naming the status, never the body, and nothing
// of it is stored in the rollout's events. An engine's own JSON error
// still passes as AGL passes it.
func TestAGLProxyWithholdsNonEngineAnswers(t *testing.T) {
	mockURL := startMock(t)
	const secret = "BANNER-7731"
	service := func(status int, ctype, body string) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", ctype)
			w.Header().Set("X-Service-Secret", secret)
			w.WriteHeader(status)
			io.WriteString(w, body)
		}))
		t.Cleanup(s.Close)
		return s.URL + "/v1"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "SSH-2.0-OpenSSH_9.6 "+secret+"\r\n")
			c.Close()
		}
	}()
	addr := freeAddr(t)
	start(t, addr, "/readyz", aglServeArgs(addr, filepath.Join(t.TempDir(), "r.db"), mockURL, "--agl-retries", "1", "--agl-retry-backoff", "10ms")...)
	base := "http://" + addr
	proxy := base + "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
	chat := `{"model":"auto","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	aglDo(t, "POST", base+"/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	for _, tc := range []struct {
		name, endpoint, says string
	}{
		{"html page", service(200, "text/html", "<html><title>"+secret+"</title></html>"), "HTTP 200"},
		{"plain 404", service(404, "text/plain", "not found: "+secret), "HTTP 404"},
		{"invalid JSON", service(200, "application/json", `{"admin": "`+secret), "HTTP 200"},
		{"JSON array", service(200, "application/json", `["`+secret+`"]`), "HTTP 200"},
		{"event stream error", service(500, "text/event-stream", "data: "+secret+"\n\n"), "HTTP 500"},
		{"event stream to a call that asked for none", service(200, "text/event-stream", "data: "+secret+"\n\n"), "HTTP 200"},
		{"not HTTP", "http://" + ln.Addr().String() + "/v1", "not valid HTTP"},
	} {
		aglDo(t, "DELETE", base+"/api/models", "", 200)
		aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+tc.endpoint+`"}]`, 201)
		r := aglRequest(t, "POST", proxy, chat)
		if b := string(r.Body); r.Status != 502 || strings.Contains(b, secret) || r.Header.Get("X-Service-Secret") != "" || !strings.Contains(b, tc.says) {
			t.Errorf("%s: %d %v %s", tc.name, r.Status, r.Header, b)
		}
	}
	if _, evs := aglStatus(t, "GET", base+"/api/rollouts/r1/events", ""); strings.Contains(evs, secret) {
		t.Errorf("the rollout's events hold what the services answered: %.600s", evs)
	}
	// An engine: its answer and its own JSON error pass as AGL passes them.
	aglDo(t, "DELETE", base+"/api/models", "", 200)
	aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+mockURL+`"}]`, 201)
	aglDo(t, "POST", proxy, chat, 200)
	if r := aglRequest(t, "POST", proxy, chat, "x-mock-fail", "status=400"); r.Status != 400 || gjson.GetBytes(r.Body, "error.code").Int() != 400 {
		t.Errorf("an engine's JSON error: %d %s", r.Status, r.Body)
	}
}
