package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// TestRetryOnAnotherReplica: with a dead replica in the pool, every call
// still succeeds (retried before any byte reached the client), and the dead
// replica is marked unhealthy and left out.
func TestRetryOnAnotherReplica(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.HealthInterval = -1 // passive checks only, so the test sees them
		c.Backends[0].Replicas = append([]gateway.Replica{{Name: "dead", URL: "http://127.0.0.1:1/v1", Kind: "vllm"}}, c.Backends[0].Replicas...)
	})
	retried := 0
	for i := range 8 {
		r := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
		if r.status != 200 {
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if row.Backend != "mock-1" || row.Error != "" || row.BackendAttempts < 1 || row.BackendAttempts > 2 {
			t.Fatalf("call %d row: backend %q error %q attempts %d", i, row.Backend, row.Error, row.BackendAttempts)
		}
		if row.BackendAttempts == 2 {
			retried++
		}
	}
	// The dead replica is marked unhealthy below only by a failed attempt,
	// which the gateway retried on mock-1: that call's row counts 2 attempts.
	if retried == 0 {
		t.Fatal("no row counts the retry off the dead replica (backend_attempts 2)")
	}
	g := do(t, "GET", e.url+"/api/v1/backends", "")
	if gjson.GetBytes(g.body, `backends.0.replicas.#(name=="dead").healthy`).Bool() ||
		!gjson.GetBytes(g.body, `backends.0.replicas.#(name=="mock-1").healthy`).Bool() {
		t.Fatalf("health not tracked: %s", g.body)
	}
}

// TestPauseResume: while paused, new calls wait and in-flight ones finish;
// resume releases the held calls; past the hold deadline a call gets 503
// with Retry-After.
func TestPauseResume(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.PauseMaxHold = 3 * time.Second })
	slow := make(chan resp, 1)
	go func() {
		slow <- do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "30")
	}()
	waitFor(t, "the slow stream to be in flight", func() bool { return e.mock.ActiveStreams() == 1 })
	p := do(t, "POST", e.url+"/api/v1/pause", "")
	if p.status != 200 || !gjson.GetBytes(p.body, "paused").Bool() {
		t.Fatalf("pause: %d %s", p.status, p.body)
	}
	held := make(chan resp, 1)
	go func() { held <- do(t, "POST", e.url+"/v1/chat/completions", chatBody) }()
	if r := <-slow; r.status != 200 || !strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("in-flight stream did not finish while paused: %d %s", r.status, r.body)
	}
	// Drained: nothing in flight, one call held.
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := do(t, "GET", e.url+"/api/v1/backends", "")
		d := gjson.GetBytes(g.body, "drain")
		if d.Get("state").String() == "paused" && d.Get("held_calls").Int() == 1 && d.Get("drained").Bool() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("drain state never reached: %s", d.Raw)
		}
		time.Sleep(20 * time.Millisecond) // polling interval of this wait on the drain state
	}
	select {
	case r := <-held:
		t.Fatalf("a call went through while paused: %d", r.status)
	default:
	}
	if r := do(t, "POST", e.url+"/api/v1/resume", ""); r.status != 200 || gjson.GetBytes(r.body, "paused").Bool() {
		t.Fatalf("resume: %d %s", r.status, r.body)
	}
	if r := <-held; r.status != 200 {
		t.Fatalf("held call after resume: %d %s", r.status, r.body)
	}
	// Paused past the hold deadline: 503 + Retry-After, refused before it
	// was admitted: counted, no sequence id, nothing stored.
	do(t, "POST", e.url+"/api/v1/pause", "")
	r := do(t, "POST", e.url+"/rollout/held/attempt/1/v1/chat/completions", chatBody)
	if r.status != 503 || r.header.Get("Retry-After") == "" || r.header.Get("x-sequence-id") != "" {
		t.Fatalf("held past deadline: %d %v %s", r.status, r.header, r.body)
	}
	if n := e.rejected("paused"); n != 1 {
		t.Fatalf("rollgate_calls_rejected_total{reason=paused} = %v, want 1", n)
	}
	do(t, "POST", e.url+"/api/v1/resume", "")
	if r := do(t, "POST", e.url+"/rollout/held/attempt/1/v1/chat/completions", chatBody); r.status != 200 || r.header.Get("x-sequence-id") != "1" {
		t.Fatalf("first admitted call after a refused one: %d, sequence id %q, want 1", r.status, r.header.Get("x-sequence-id"))
	}
	if rows := e.storedCalls(export.CallFilter{RolloutID: "held"}); len(rows) != 1 || rows[0].HTTPStatus != 200 {
		t.Fatalf("rows of the rollout: %+v, want only the admitted call", rows)
	}
}

// TestAdminTokenAndAuthorization: every /api/v1 route needs the admin token when set;
// the client's Authorization is not forwarded upstream by default.
func TestAdminTokenAndAuthorization(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.AdminToken = "s3cret" })
	if r := do(t, "POST", e.url+"/api/v1/pause", ""); r.status != 401 {
		t.Fatalf("pause without token: %d", r.status)
	}
	if r := do(t, "POST", e.url+"/api/v1/rollouts/x/rewards", `{"value":1}`, "Authorization", "Bearer wrong"); r.status != 401 {
		t.Fatalf("reward with a wrong token: %d", r.status)
	}
	// With the token the request reaches the route: a rollout nothing
	// names is 404 there (not 401).
	if r := do(t, "POST", e.url+"/api/v1/rollouts/x/rewards", `{"value":1}`, "Authorization", "Bearer s3cret"); r.status != 404 || !strings.Contains(string(r.body), "rollout x not found") {
		t.Fatalf("reward for an unknown rollout with the token: %d %s, want 404 naming it", r.status, r.body)
	}
	// Reads need it too (they show upstream URLs and every rollout); the
	// scheme is case-insensitive; health and metrics stay open.
	for _, path := range []string{"/api/v1/backends", "/api/v1/rollouts/x", "/api/v1/rollouts?after=0", "/api/v1/bridge/counts"} {
		if r := do(t, "GET", e.url+path, ""); r.status != 401 {
			t.Fatalf("GET %s without the token: %d", path, r.status)
		}
	}
	if r := do(t, "GET", e.url+"/api/v1/backends", "", "Authorization", "bearer s3cret"); r.status != 200 {
		t.Fatalf("GET backends with the token, scheme in lower case: %d %s", r.status, r.body)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := do(t, "GET", e.url+path, ""); r.status != 200 {
			t.Fatalf("GET %s must stay open: %d", path, r.status)
		}
	}
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody, "Authorization", "Bearer sk-agent")
	if r.status != 200 || e.mock.LastHeader("Authorization") != "" {
		t.Fatalf("client Authorization forwarded: %q", e.mock.LastHeader("Authorization"))
	}
	if row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]; strings.Contains(row.RequestBody, "sk-agent") {
		t.Fatal("credential stored")
	}
}

// TestIdleTimeouts: a backend silent before its first byte gets 504; one that
// stalls between chunks ends the stream with an SSE error event and a row
// that says so. A stream that keeps flowing is not cut, however long. (The
// idle timeout is 700 ms: 100 ms token gaps stretched past 300 ms on a
// machine at load 25 made an earlier 300 ms timeout cut the flowing stream
// 2 times in 20; the stalls, 1.5 s, stay twice the timeout.)
func TestIdleTimeouts(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.IdleTimeout = 700 * time.Millisecond; c.Retries = -1 })
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody, "x-mock-ttft-ms", "1500")
	if r.status != 504 {
		t.Fatalf("first-byte timeout: %d %s", r.status, r.body)
	}
	r = do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "1500")
	data := sseData(r.body)
	if r.status != 200 || len(data) == 0 || !strings.Contains(data[len(data)-1], `"error"`) {
		t.Fatalf("stalled stream did not end with an error event: %d %s", r.status, r.body)
	}
	if row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]; !strings.Contains(row.Error, "mid-stream") {
		t.Fatalf("row error %q", row.Error)
	}
	// 40 tokens 100ms apart: 4s in all, never idle for 700ms.
	r = do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true,"max_tokens":40`), "x-mock-itl-ms", "100", "x-mock-tokens", "40")
	if r.status != 200 || !strings.Contains(string(r.body), "[DONE]") {
		t.Fatalf("a flowing stream was cut: %s", r.body)
	}
}

// TestConcurrencyLimit: with max_concurrency 1, a second call waits for the
// slot up to queue_timeout and then gets 429 with Retry-After (counted, not
// captured);
// once the first call ends, calls go through again.
func TestConcurrencyLimit(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.MaxConcurrency = 1; c.QueueTimeout = 200 * time.Millisecond })
	slow := make(chan resp, 1)
	go func() {
		slow <- do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "100")
	}()
	waitFor(t, "the first call to hold the slot", func() bool { return e.mock.ActiveStreams() == 1 })
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
	if r.status != 429 || r.header.Get("Retry-After") == "" || gjson.GetBytes(r.body, "error.type").String() != "rate_limit_error" {
		t.Fatalf("over the limit: %d %v %s", r.status, r.header, r.body)
	}
	if n := e.rejected("concurrency_limit"); n != 1 || r.header.Get("x-sequence-id") != "" {
		t.Fatalf("429: rollgate_calls_rejected_total{reason=concurrency_limit} = %v (want 1), sequence id %q (want none)", n, r.header.Get("x-sequence-id"))
	}
	if rows := e.storedCalls(export.CallFilter{SpanID: r.header.Get("x-request-id")}); len(rows) != 0 {
		t.Fatalf("a call refused by the limit was stored: %+v", rows)
	}
	if first := <-slow; first.status != 200 || !strings.Contains(string(first.body), "[DONE]") {
		t.Fatalf("first call: %d", first.status)
	}
	for i := range 3 {
		if r := do(t, "POST", e.url+"/v1/chat/completions", chatBody); r.status != 200 {
			t.Fatalf("call %d after the slot freed: %d %s", i, r.status, r.body)
		}
	}
}

// TestClientKeys: with client keys configured, calls need one (401 otherwise,
// counted, never stored nor given a sequence id); the key's name is recorded, the key is neither stored nor
// forwarded upstream.
func TestClientKeys(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), func(c *gateway.Config) {
			c.ClientKeys = []gateway.ClientKey{{Name: "team-a", Key: "sk-aaa"}, {Name: "team-b", Key: "sk-bbb"}}
		})
		// Refused calls naming a rollout: counted, not stored, no sequence id.
		r := do(t, "POST", e.url+"/rollout/victim/attempt/1/v1/chat/completions", chatBody)
		if r.status != 401 || gjson.GetBytes(r.body, "error.message").String() == "" || r.header.Get("x-sequence-id") != "" || r.header.Get("x-rollout-id") != "" {
			t.Fatalf("no key: %d %v %s", r.status, r.header, r.body)
		}
		if r := do(t, "POST", e.url+"/rollout/victim/attempt/1/v1/chat/completions", chatBody, "Authorization", "Bearer sk-wrong"); r.status != 401 {
			t.Fatalf("wrong key: %d", r.status)
		}
		if n := e.rejected("unauthenticated"); n != 2 {
			t.Fatalf("rollgate_calls_rejected_total{reason=unauthenticated} = %v, want 2", n)
		}
		if r := do(t, "POST", e.url+"/rollout/victim/attempt/1/v1/chat/completions", chatBody, "Authorization", "Bearer sk-aaa"); r.status != 200 || r.header.Get("x-sequence-id") != "1" {
			t.Fatalf("the owner's first call: %d, sequence id %q, want 1", r.status, r.header.Get("x-sequence-id"))
		}
		if rows := e.storedCalls(export.CallFilter{RolloutID: "victim"}); len(rows) != 1 || rows[0].APIKeyName != "team-a" {
			t.Fatalf("rows under the rollout: %+v, want only the owner's call", rows)
		}
		if r := do(t, "GET", e.url+"/v1/models", ""); r.status != 401 {
			t.Fatalf("models without key: %d", r.status)
		}
		r = do(t, "POST", e.url+"/v1/chat/completions", chatBody, "Authorization", "Bearer sk-bbb")
		if r.status != 200 {
			t.Fatalf("good key: %d %s", r.status, r.body)
		}
		row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
		if row.APIKeyName != "team-b" || strings.Contains(row.RequestBody+row.ResponseBody, "sk-bbb") {
			t.Fatalf("api_key_name %q (or the key was stored)", row.APIKeyName)
		}
		if got := e.mock.LastHeader("Authorization"); got != "" {
			t.Fatalf("client key forwarded upstream: %q", got)
		}
		if r := do(t, "POST", e.url+"/v1/chat/completions", chatBody, "api-key", "sk-aaa"); r.status != 200 {
			t.Fatalf("api-key header: %d", r.status)
		}
	})
}
