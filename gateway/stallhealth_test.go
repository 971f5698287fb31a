package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/gateway"
)

// TestStalledStreamsMarkReplicaUnhealthy: a replica whose streams stall
// mid-way (its host cut off: the idle timeout ends them) counts those as
// failures, so --unhealthy-after of them in a row take it out of selection
// without waiting for the health checks; its next answer puts it back.
// rollgate_backend_healthy says the same as /api/v1/backends. Before, only failures before the response headers counted: in drill c
// (cmd/rollgate/netns_drill_cd_e2e_test.go) a cut replica stayed in
// selection until its health checks had failed 3 times.
func TestStalledStreamsMarkReplicaUnhealthy(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.IdleTimeout = 300 * time.Millisecond
		c.HealthInterval = -1 // passive checks only
		c.UnhealthyAfter = 2
		c.Retries = -1
	})
	// The API's view and the gauge rollgate_backend_healthy must agree.
	healthy := func() bool {
		g := do(t, "GET", e.url+"/api/v1/backends", "")
		api := gjson.GetBytes(g.body, `backends.0.replicas.#(name=="mock-1").healthy`).Bool()
		m := do(t, "GET", e.url+"/metrics", "")
		gauge := strings.Contains(string(m.body), "\nrollgate_backend_healthy{backend=\"mock-1\"} 1\n")
		if api != gauge || (!gauge && !strings.Contains(string(m.body), "\nrollgate_backend_healthy{backend=\"mock-1\"} 0\n")) {
			t.Fatalf("/api/v1/backends says healthy %v, /metrics has no matching rollgate_backend_healthy{backend=\"mock-1\"}:\n%s", api, m.body)
		}
		return api
	}
	for i := range 2 {
		r := do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "1500")
		if data := sseData(r.body); r.status != 200 || len(data) == 0 || !strings.Contains(data[len(data)-1], `"error"`) {
			t.Fatalf("stalled stream %d did not end with an error event: %d %s", i, r.status, r.body)
		}
	}
	if healthy() {
		t.Fatal("mock-1 still healthy after 2 stalled streams with unhealthy_after 2")
	}
	if r := do(t, "POST", e.url+"/v1/chat/completions", chatBody); r.status != 200 {
		t.Fatalf("a call with the only replica unhealthy: %d %s", r.status, r.body)
	}
	if !healthy() {
		t.Fatal("mock-1 still unhealthy after it answered a call")
	}
}
