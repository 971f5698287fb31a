package controlplane_test

import (
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestForceModesFollowQueueMode: a dequeued task's mode selects its calls'
// forced fields (force_modes) on the base URL it is handed, with no header.
func TestForceModesFollowQueueMode(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := gatewaytest.NewEnv(t, store, func(c *gateway.Config) {
		c.ForceModes = map[string]map[string]any{"train": {"temperature": 1.0}, "val": {"temperature": 0.6}}
	})
	withQueue(t, e, "")
	api := e.URL + "/api/v1"
	if r := gatewaytest.Do(t, "POST", api+"/tasks", `[{"task_id":"v","input":{},"mode":"val"},{"task_id":"t","input":{}}]`); r.Status != 200 {
		t.Fatalf("enqueue: %d %s", r.Status, r.Body)
	}
	for _, want := range []float64{0.6, 1.0} {
		r := gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w"}`)
		base := gjson.GetBytes(r.Body, "base_url").String()
		c := gatewaytest.Do(t, "POST", base+"/chat/completions", `{"model":"m","temperature":0.2,"max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
		if c.Status != 200 {
			t.Fatalf("call: %d %s", c.Status, c.Body)
		}
		if got := gjson.GetBytes(e.Mock.LastRequest(), "temperature").Float(); got != want {
			t.Fatalf("%s: temperature %v, want %v", gjson.GetBytes(r.Body, "mode").String(), got, want)
		}
	}
}
