package gateway_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// TestForceOnOwnRoutes: the gateway's force: setting (sampling
// enforcement) applies to rollgate's own routes, streamed or not: the
// engine gets the forced values whatever the agent sent, request_body keeps
// the agent's, and the overrides column records what was forced.
func TestForceOnOwnRoutes(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.Force = map[string]any{"temperature": 1.0, "top_p": 1, "seed": nil}
	})
	body := `{"model":"mock-model","temperature":0.3,"temperature":0.4,"seed":7,"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`
	for i, b := range []string{body, strings.Replace(body, `"max_tokens":3`, `"max_tokens":3,"stream":true`, 1)} {
		r := do(t, "POST", e.url+"/rollout/rf/attempt/a"+string(rune('0'+i))+"/v1/chat/completions", b)
		if r.status != 200 {
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
		sent := e.mock.LastRequest()
		if gjson.GetBytes(sent, "temperature").Float() != 1 || gjson.GetBytes(sent, "top_p").Int() != 1 ||
			gjson.GetBytes(sent, "seed").Type != gjson.Null || strings.Count(string(sent), `"temperature"`) != 1 {
			t.Fatalf("call %d: the engine got %s", i, sent)
		}
	}
	rows := e.StoredCalls(export.CallFilter{RolloutID: "rf"})
	if len(rows) != 2 {
		t.Fatalf("rows: %d", len(rows))
	}
	for _, row := range rows {
		if row.Overrides != `{"seed":null,"temperature":1,"top_p":1}` || row.RequestBody[:len(`{"model":"mock-model","temperature":0.3`)] != `{"model":"mock-model","temperature":0.3` {
			t.Fatalf("row: overrides %q request %q", row.Overrides, row.RequestBody)
		}
	}
	// A body that is not a JSON object is refused before any forcing.
	if r := do(t, "POST", e.url+"/v1/chat/completions", `[1]`); r.status != 400 {
		t.Fatalf("array body: %d %s", r.status, r.body)
	}
}

// TestForceModes: per-mode forced fields (force_modes over force) on
// rollgate's own routes: the mode comes from x-rollout-mode (not sent on
// to the engine) or from the mode recorded for the rollout.
func TestForceModes(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.Force = map[string]any{"top_p": 1}
		c.ForceModes = map[string]map[string]any{"train": {"temperature": 1.0}, "val": {"temperature": 0.7, "top_p": 0.9}}
	})
	body := `{"model":"mock-model","temperature":0.3,"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	e.gw.SetRolloutMode("rt", "train")
	for _, tc := range []struct {
		path, mode  string
		temp, top_p float64
	}{
		{"/rollout/rv/attempt/a/v1/chat/completions", "val", 0.7, 0.9},
		{"/rollout/rt/attempt/a/v1/chat/completions", "", 1, 1},
		{"/rollout/rt/attempt/a/v1/chat/completions", "val", 0.7, 0.9}, // the header wins
		{"/rollout/rx/attempt/a/v1/chat/completions", "", 0.3, 1},      // no mode: force only
		{"/rollout/rx/attempt/a/v1/chat/completions", "other", 0.3, 1},
	} {
		var h []string
		if tc.mode != "" {
			h = []string{"x-rollout-mode", tc.mode}
		}
		if r := do(t, "POST", e.url+tc.path, body, h...); r.status != 200 {
			t.Fatalf("%+v: %d %s", tc, r.status, r.body)
		}
		sent := e.mock.LastRequest()
		if gjson.GetBytes(sent, "temperature").Float() != tc.temp || gjson.GetBytes(sent, "top_p").Float() != tc.top_p || e.mock.LastHeader("x-rollout-mode") != "" {
			t.Fatalf("%+v: the engine got %s (x-rollout-mode %q)", tc, sent, e.mock.LastHeader("x-rollout-mode"))
		}
	}
}
