package controlplane_test

import (
	"strings"
	"testing"

	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestRewardForUnknownRollout: a reward under an id nothing carries (a
// misspelt rollout) is 404 naming it and the per-rollout URL, and nothing
// is stored; a rollout known only from an admitted call — its capture not
// necessarily stored yet — takes one at once, as do registered ones.
func TestRewardForUnknownRollout(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := gatewaytest.NewEnv(t, store, nil)
	r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/demo-typo/rewards", `{"value":1}`)
	if r.Status != 404 || !strings.Contains(string(r.Body), "rollout demo-typo not found") || !strings.Contains(string(r.Body), "/rollout/demo-typo/attempt/{attempt_id}/v1") {
		t.Fatalf("reward for an unknown rollout: %d %s, want 404 naming it and its base URL", r.Status, r.Body)
	}
	if got := gatewaytest.Do(t, "GET", e.URL+"/api/v1/rollouts/demo-typo", ""); got.Status != 404 {
		t.Fatalf("the refused reward was stored: GET answers %d %s", got.Status, got.Body)
	}
	if c := gatewaytest.Do(t, "POST", e.URL+"/rollout/demo/attempt/1/v1/chat/completions", gatewaytest.ChatBody); c.Status != 200 {
		t.Fatalf("call: %d %s", c.Status, c.Body)
	}
	// Right after the answer: the gateway admitted the call, so the
	// rollout is known whether or not its row is stored.
	if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/demo/rewards", `{"value":1}`); r.Status != 200 {
		t.Fatalf("reward after a call: %d %s", r.Status, r.Body)
	}
	if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts", `{"rollout_id":"reg-1","task_id":"t"}`); r.Status != 200 {
		t.Fatalf("register: %d %s", r.Status, r.Body)
	}
	if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/reg-1/rewards", `{"value":0.5}`); r.Status != 200 {
		t.Fatalf("reward of a registered rollout: %d %s", r.Status, r.Body)
	}
}
