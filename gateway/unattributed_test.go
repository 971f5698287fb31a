package gateway_test

import (
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestUnattributedCalls: a call that names no rollout is captured with an
// empty rollout_id by default (docs/contract.md §1.1); with unattributed
// "refuse" it is answered 400 naming the per-rollout base URL, counted,
// and neither captured nor given a sequence id, while attributed calls
// (path or headers) still pass.
func TestUnattributedCalls(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	r := do(t, "POST", e.url+"/v1/chat/completions", gatewaytest.ChatBody)
	if r.status != 200 {
		t.Fatalf("default: unattributed call %d %s, want 200 (captured)", r.status, r.body)
	}
	if rows := e.WaitCalls(r.header.Get("x-request-id"), 1); rows[0].RolloutID != "" {
		t.Fatalf("captured under %q, want ''", rows[0].RolloutID)
	}

	s2, _ := openSQLite(t)
	e = newEnv(t, s2, func(c *gateway.Config) { c.Unattributed = gateway.UnattributedRefuse })
	r = do(t, "POST", e.url+"/v1/chat/completions", gatewaytest.ChatBody)
	if r.status != 400 || !strings.Contains(string(r.body), "/rollout/{rollout_id}/attempt/{attempt_id}/v1") || r.header.Get("x-sequence-id") != "" {
		t.Fatalf("refuse: %d %s (x-sequence-id %q), want 400 naming the base URL and no sequence id", r.status, r.body, r.header.Get("x-sequence-id"))
	}
	if n := e.rejected("unattributed"); n != 1 {
		t.Errorf("rollgate_calls_rejected_total{reason=unattributed} = %v, want 1", n)
	}
	p := do(t, "POST", e.url+"/rollout/r1/attempt/a1/v1/chat/completions", gatewaytest.ChatBody)
	if p.status != 200 {
		t.Fatalf("refuse: attributed by path %d %s", p.status, p.body)
	}
	e.WaitCalls(p.header.Get("x-request-id"), 1)
	h := do(t, "POST", e.url+"/v1/chat/completions", gatewaytest.ChatBody, "x-rollout-id", "r2", "x-attempt-id", "a1")
	if h.status != 200 {
		t.Fatalf("refuse: attributed by headers %d %s", h.status, h.body)
	}
	e.WaitCalls(h.header.Get("x-request-id"), 1)
	if rows := e.StoredCalls(export.CallFilter{RolloutID: ""}); len(rows) != 2 {
		t.Errorf("refuse: %d rows stored, want the 2 attributed calls only", len(rows))
	}
}
