//go:build linux

package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/netns"
)

// TestUnreachedReplicaRetried: replica e0's host is cut off (packets
// dropped, no reset) after the gateway has kept-alive connections to it.
// A call routed to e0 goes out on a pooled connection (no dial to fail),
// its request is never acknowledged, and at the idle timeout it is retried
// on the other replica: the client gets its answer, streamed or not, and
// the row says 2 attempts. Once the host is back, a call that e0 received
// and does not answer in time is a 504 and not retried (the engine may be
// generating). Before the fix the cut calls got a 504 "timeout" after
// --idle-timeout although another replica was up (drill c,
// cmd/rollgate/netns_drill_cd_e2e_test.go, failed in CI 1 run in ~10).
func TestUnreachedReplicaRetried(t *testing.T) {
	n := netns.New(t)
	h := n.Host("e0")
	ms0, err := mock.NewChecked(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := h.Listen("tcp", h.Addr(8001))
	if err != nil {
		t.Fatal(err)
	}
	go ms0.Serve(ln) //nolint:errcheck // nil after Shutdown
	t.Cleanup(func() { ms0.Shutdown() })

	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		local := c.Backends[0].Replicas[0]
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{
			{Name: "e0", URL: "http://" + h.Addr(8001) + "/v1", Kind: "vllm"}, local,
		}}}
		c.IdleTimeout = time.Second
		c.HealthInterval = -1
		c.UnhealthyAfter = 1000 // e0 stays in selection: every call of its rollouts goes there first
	})
	// Rollouts whose calls e0 serves; their calls keep connections to e0 in the pool.
	var onE0 []string
	for i := 0; len(onE0) < 2 && i < 64; i++ {
		ro := fmt.Sprintf("ro-unreached-%d", i)
		before := ms0.RequestsTo(mock.PathChat)
		if r := do(t, "POST", e.url+"/rollout/"+ro+"/attempt/1/v1/chat/completions", chatBody); r.status != 200 {
			t.Fatalf("%s: %d %s", ro, r.status, r.body)
		}
		if ms0.RequestsTo(mock.PathChat) > before {
			onE0 = append(onE0, ro)
		}
	}
	if len(onE0) < 2 {
		t.Fatalf("64 rollouts, %d served by e0", len(onE0))
	}

	n.Cut(n.Root(), h)
	streamed := do(t, "POST", e.url+"/rollout/"+onE0[0]+"/attempt/1/v1/chat/completions", withStream(chatBody, `"stream":true`))
	if data := sseData(streamed.body); streamed.status != 200 || len(data) == 0 || data[len(data)-1] != "[DONE]" || strings.Contains(string(streamed.body), `"error"`) {
		t.Fatalf("streamed call of %s with e0 cut off: %d %s", onE0[0], streamed.status, streamed.body)
	}
	whole := do(t, "POST", e.url+"/rollout/"+onE0[1]+"/attempt/1/v1/chat/completions", chatBody)
	if whole.status != 200 {
		t.Fatalf("non-streamed call of %s with e0 cut off: %d %s", onE0[1], whole.status, whole.body)
	}
	for _, ro := range onE0 {
		last := lastCall(e, ro)
		if last.Backend != "mock-1" || last.BackendAttempts != 2 || last.Error != "" {
			t.Errorf("%s's call with e0 cut off captured as backend %q, %d attempts, error %q; want mock-1 after 2 attempts, no error", ro, last.Backend, last.BackendAttempts, last.Error)
		}
	}

	n.Heal(n.Root(), h)
	slow := do(t, "POST", e.url+"/rollout/"+onE0[0]+"/attempt/1/v1/chat/completions", chatBody, "x-mock-ttft-ms", "3000")
	if slow.status != 504 {
		t.Fatalf("a call e0 received and did not answer within the idle timeout: %d %s, want 504 without a retry", slow.status, slow.body)
	}
	if last := lastCall(e, onE0[0]); last.Backend != "e0" || last.BackendAttempts != 1 {
		t.Errorf("the slow call captured as backend %q after %d attempts, want e0 after 1 (not retried)", last.Backend, last.BackendAttempts)
	}

	// With no retry the client gets a 504 naming the cause.
	s2, _ := openSQLite(t)
	only := newEnv(t, s2, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "e0", URL: "http://" + h.Addr(8001) + "/v1", Kind: "vllm"}}}}
		c.IdleTimeout = time.Second
		c.HealthInterval = -1
		c.UnhealthyAfter = 1000
		c.Retries = -1
	})
	if r := do(t, "POST", only.url+"/v1/chat/completions", chatBody); r.status != 200 {
		t.Fatalf("e0 alone, before the cut: %d %s", r.status, r.body)
	}
	n.Cut(n.Root(), h)
	r := do(t, "POST", only.url+"/v1/chat/completions", chatBody)
	if r.status != 504 || !strings.Contains(string(r.body), "did not acknowledge the request") {
		t.Fatalf("e0 alone, cut off: %d %s; want 504 saying the request was not acknowledged", r.status, r.body)
	}
}

// lastCall is the stored call of rollout with the highest sequence id.
func lastCall(e *env, rollout string) export.Call {
	e.t.Helper()
	calls := e.storedCalls(export.CallFilter{RolloutID: rollout})
	if len(calls) == 0 {
		e.t.Fatalf("no call of %s stored", rollout)
	}
	last := calls[0]
	for _, c := range calls[1:] {
		if c.SequenceID > last.SequenceID {
			last = c
		}
	}
	return last
}
