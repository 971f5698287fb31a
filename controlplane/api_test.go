package controlplane_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestRolloutAPI registers a rollout, makes calls through its base_url,
// posts rewards and a status, and reads it all back, in both stores.
func TestRolloutAPI(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := gatewaytest.NewEnv(t, open(t), nil)
		r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts", `{"task_id":"task-42","metadata":{"split":"train"}}`)
		if r.Status != 200 {
			t.Fatalf("register: %d %s", r.Status, r.Body)
		}
		ro, at := gjson.GetBytes(r.Body, "rollout_id").String(), gjson.GetBytes(r.Body, "attempt_id").String()
		base := gjson.GetBytes(r.Body, "base_url").String()
		if ro == "" || at == "" || base != fmt.Sprintf("%s/rollout/%s/attempt/%s/v1", e.URL, ro, at) {
			t.Fatalf("register answer: %s", r.Body)
		}
		c := gatewaytest.Do(t, "POST", base+"/chat/completions", gatewaytest.ChatBody)
		if c.Status != 200 {
			t.Fatalf("call via base_url: %d %s", c.Status, c.Body)
		}
		row := e.WaitCalls(c.Header.Get("x-request-id"), 1)[0]
		if row.TaskID != "task-42" || row.RolloutID != ro || row.AttemptID != at {
			t.Fatalf("task id from the registered rollout not recorded: %+v", row)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/rewards", `{"value":0.5,"sequence_id":1,"name":"format"}`); r.Status != 200 {
			t.Fatalf("reward: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/rewards", `{"value":1}`); r.Status != 200 {
			t.Fatalf("reward: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/rewards", `{"name":"x"}`); r.Status != 400 {
			t.Fatalf("reward without value: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/rewards", `{"value":"high"}`); r.Status != 400 {
			t.Fatalf("reward with a string value: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/status", `{"status":"succeeded"}`); r.Status != 200 {
			t.Fatalf("status: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/status", `{"status":"great"}`); r.Status != 400 {
			t.Fatalf("bad status accepted: %d", r.Status)
		}
		g := gatewaytest.Do(t, "GET", e.URL+"/api/v1/rollouts/"+ro, "")
		if g.Status != 200 {
			t.Fatalf("get: %d %s", g.Status, g.Body)
		}
		j := gjson.ParseBytes(g.Body)
		if j.Get("status").String() != "succeeded" || j.Get("task_id").String() != "task-42" ||
			j.Get("calls.#").Int() != 1 || j.Get("calls.0.sequence_id").Int() != 1 || j.Get("rewards.#").Int() != 2 ||
			j.Get("attempts.0.metadata.split").String() != "train" {
			t.Fatalf("GET rollout: %s", g.Body)
		}
		var epi, step bool
		j.Get("rewards").ForEach(func(_, v gjson.Result) bool {
			epi = epi || (v.Get("sequence_id").Int() == 0 && v.Get("name").String() == "primary" && v.Get("value").Float() == 1 && v.Get("source").String() == "api")
			step = step || (v.Get("sequence_id").Int() == 1 && v.Get("name").String() == "format" && v.Get("value").Float() == 0.5)
			return true
		})
		if !epi || !step {
			t.Fatalf("rewards: %s", j.Get("rewards").Raw)
		}
		if r := gatewaytest.Do(t, "GET", e.URL+"/api/v1/rollouts/nope", ""); r.Status != 404 {
			t.Fatalf("unknown rollout: %d", r.Status)
		}
		// SQL over the tables the API wrote.
		res, err := e.Store.Query(context.Background(), "SELECT status FROM rollouts WHERE rollout_id = '"+ro+"' ORDER BY updated_unix_nano DESC LIMIT 1")
		if err != nil || len(res.Rows) != 1 || res.Rows[0][0] != "succeeded" {
			t.Fatalf("rollouts table: %+v %v", res, err)
		}
	})
}

// TestBackendsSwap replaces the routing table while a slow stream is in
// flight: the stream completes on the old replica, new calls use the new one
// and record its policy version.
func TestBackendsSwap(t *testing.T) {
	s, _ := gatewaytest.OpenSQLite(t)
	e := gatewaytest.NewEnv(t, s, nil)
	done := make(chan gatewaytest.Resp, 1)
	go func() {
		done <- gatewaytest.Do(t, "POST", e.URL+"/v1/chat/completions", gatewaytest.WithStream(gatewaytest.ChatBody, `"stream":true`), "x-mock-itl-ms", "40")
	}()
	gatewaytest.WaitFor(t, "the slow stream to be in flight on mock-1", func() bool { return e.Mock.ActiveStreams() == 1 })
	put := `{"backends":[{"model":"*","replicas":[{"name":"mock-2","url":"` + e.MockURL + `","kind":"vllm","policy_version":"v8"}]}]}`
	r := gatewaytest.Do(t, "PUT", e.URL+"/api/v1/backends", put)
	if r.Status != 200 || gjson.GetBytes(r.Body, "backends.0.replicas.0.policy_version").String() != "v8" {
		t.Fatalf("PUT backends: %d %s", r.Status, r.Body)
	}
	if r := gatewaytest.Do(t, "PUT", e.URL+"/api/v1/backends", `{"backends":[{"model":"x","replicas":[{"url":"ftp://nope"}]}]}`); r.Status != 400 {
		t.Fatalf("invalid table accepted: %d %s", r.Status, r.Body)
	}
	slow := <-done
	if slow.Status != 200 || !strings.Contains(string(slow.Body), "[DONE]") {
		t.Fatalf("in-flight stream broken by the swap: %d %s", slow.Status, slow.Body)
	}
	old := e.WaitCalls(slow.Header.Get("x-request-id"), 1)[0]
	if old.PolicyVersion != "v7" || old.Backend != "mock-1" || old.Error != "" {
		t.Fatalf("in-flight call row: %+v", old)
	}
	nr := gatewaytest.Do(t, "POST", e.URL+"/v1/chat/completions", gatewaytest.ChatBody)
	row := e.WaitCalls(nr.Header.Get("x-request-id"), 1)[0]
	if row.PolicyVersion != "v8" || row.Backend != "mock-2" {
		t.Fatalf("new call row: %+v", row)
	}
	g := gatewaytest.Do(t, "GET", e.URL+"/api/v1/backends", "")
	if gjson.GetBytes(g.Body, "backends.0.replicas.0.name").String() != "mock-2" {
		t.Fatalf("GET backends: %s", g.Body)
	}
}

var _ = context.Background

// TestAPIBodiesStrict: /api/v1 decodes bodies strictly (docs/contract.md
// section 2): an unknown field is a 400 naming it, and so is a second
// JSON value after the body's (it was taken as the first alone).
func TestAPIBodiesStrict(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := gatewaytest.NewEnv(t, store, nil)
	f := func(body, want string) {
		t.Helper()
		r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts", body)
		if r.Status != 400 || !strings.Contains(gjson.GetBytes(r.Body, "error.message").String(), want) {
			t.Errorf("POST /api/v1/rollouts %s: %d %s, want 400 naming %q", body, r.Status, r.Body, want)
		}
	}
	f(`{"task_id":"t","colour":1}`, `unknown field "colour"`)
	f(`{"task_id":"t"} {"task_id":"u"}`, "trailing data after the JSON value")
	if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts", "{\"task_id\":\"t\"}\n"); r.Status != 200 {
		t.Errorf("a body and a newline: %d %s", r.Status, r.Body)
	}
}
