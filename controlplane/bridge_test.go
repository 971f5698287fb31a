package controlplane_test

import (
	"context"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestBridgeOverHTTP: the gateway builds training samples from its own store
// (POST /api/v1/bridge/batches, selection by the task queue's completion
// cursor) and trainers pull them with leases and acks.
func TestBridgeOverHTTP(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		// As rollgate serve by default: the sampled tokens' logprobs are
		// asked for, so the batch can carry rollout_log_probs.
		e := gatewaytest.NewEnv(t, open(t), func(c *gateway.Config) { c.InjectLogprobs = true })
		withQueue(t, e, "")
		api := e.URL + "/api/v1"
		for i, reward := range []string{"1", "0"} {
			reg := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/rollouts", `{"task_id":"sum"}`).Body)
			ro, at := reg.Get("rollout_id").String(), reg.Get("attempt_id").String()
			if r := gatewaytest.Do(t, "POST", reg.Get("base_url").String()+"/chat/completions", gatewaytest.ChatBody); r.Status != 200 {
				t.Fatalf("call %d: %d %s", i, r.Status, r.Body)
			}
			if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro+"/rewards", `{"value":`+reward+`,"attempt_id":"`+at+`"}`); r.Status != 200 {
				t.Fatalf("reward: %d %s", r.Status, r.Body)
			}
			if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro+"/status", `{"status":"succeeded","attempt_id":"`+at+`"}`); r.Status != 200 {
				t.Fatalf("status: %d %s", r.Status, r.Body)
			}
		}
		b := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/bridge/batches", `{"after":0,"estimator":"grpo"}`).Body)
		if b.Get("samples").Int() != 2 || b.Get("groups").Int() != 1 || b.Get("next_after").Int() != 2 || b.Get("queue.pending").Int() != 2 {
			t.Fatalf("batches: %s", b.Raw)
		}
		if len(b.Get("report").Array()) != 0 {
			t.Fatalf("report without asking: %s", b.Raw)
		}
		if b := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/bridge/batches", `{"after":2}`).Body); b.Get("samples").Int() != 0 || b.Get("next_after").Int() != 2 {
			t.Fatalf("nothing completed after the cursor: %s", b.Raw)
		}
		l1 := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/bridge/lease", `{"n":1}`).Body)
		l2 := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/bridge/lease", `{"n":5}`).Body)
		if l1.Get("samples.#").Int() != 1 || l2.Get("samples.#").Int() != 1 {
			t.Fatalf("leases: %s / %s", l1.Raw, l2.Raw)
		}
		a1, a2 := l1.Get("samples.0.advantage").Float(), l2.Get("samples.0.advantage").Float()
		if a1 == 0 || a1 != -a2 || l1.Get("samples.0.uid").String() != "sum@v7" || l1.Get("samples.0.response_ids.#").Int() == 0 {
			t.Fatalf("samples: %s / %s", l1.Get("samples").Raw, l2.Get("samples").Raw)
		}
		if r := gatewaytest.Do(t, "POST", api+"/bridge/lease", `{"n":1}`); r.Status != 204 {
			t.Fatalf("empty queue: %d %s", r.Status, r.Body)
		}
		for _, l := range []gjson.Result{l1, l2} {
			if r := gatewaytest.Do(t, "POST", api+"/bridge/ack", `{"lease_id":"`+l.Get("lease_id").String()+`"}`); r.Status != 200 {
				t.Fatalf("ack: %d %s", r.Status, r.Body)
			}
		}
		if r := gatewaytest.Do(t, "POST", api+"/bridge/ack", `{"lease_id":"`+l1.Get("lease_id").String()+`"}`); r.Status != 404 {
			t.Fatalf("second ack: %d %s", r.Status, r.Body)
		}
		c := gjson.ParseBytes(gatewaytest.Do(t, "GET", api+"/bridge/counts", "").Body)
		if c.Get("acked").Int() != 2 || c.Get("pending").Int() != 0 || c.Get("leased").Int() != 0 {
			t.Fatalf("counts: %s", c.Raw)
		}
		// The AIR options the CLI has are accepted over HTTP too.
		if r := gatewaytest.Do(t, "POST", api+"/bridge/batches", `{"air_rules":["air_repeat=off","air_truncated=-2"],"air_min_repeats":3,"air_failure_patterns":["^Error"]}`); r.Status != 200 {
			t.Fatalf("AIR options: %d %s", r.Status, r.Body)
		}
		// The report explains every selected attempt: both included here.
		rep := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/bridge/batches", `{"estimator":"grpo","report":true}`).Body).Get("report")
		if rep.Get("#").Int() != 2 || rep.Get("0.group").String() != "sum@v7" || !rep.Get("0.items.0.included").Bool() || rep.Get("0.items.0.advantage").Float() == 0 {
			t.Fatalf("report: %s", rep.Raw)
		}
		for _, bad := range []string{`{"estimator":"ppo"}`, `{"agent":"("}`, `{"bogus":1}`, `{"missing_reward":"5"}`, `{"logprobs":"zeros"}`,
			`{"air_rules":["nope=1"]}`, `{"air_failure_patterns":["("]}`, `{"air_min_repeats":-1}`, `{"retokenize":"/etc"}`} {
			if r := gatewaytest.Do(t, "POST", api+"/bridge/batches", bad); r.Status != 400 {
				t.Errorf("%s: %d %s", bad, r.Status, r.Body)
			}
		}
	})
}

// TestGroupPerEnqueue: POST /api/v1/tasks mints one group per task per call
// (two training steps of one task are two groups), a caller may name one,
// POST /api/v1/rollouts accepts one, and the bridge's uid is that group.
func TestGroupPerEnqueue(t *testing.T) {
	s, _ := gatewaytest.OpenSQLite(t)
	e := gatewaytest.NewEnv(t, s, func(c *gateway.Config) { c.InjectLogprobs = true })
	withQueue(t, e, "")
	api := e.URL + "/api/v1"
	step1 := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/tasks", `[{"task_id":"q","input":{}},{"task_id":"q","input":{}},{"task_id":"r","input":{},"metadata":{"k":1}}]`).Body)
	step2 := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/tasks", `[{"task_id":"q","input":{}},{"task_id":"q","input":{},"group_id":"mine"}]`).Body)
	var ids []string
	for _, r := range append(step1.Get("rollout_ids").Array(), step2.Get("rollout_ids").Array()...) {
		ids = append(ids, r.String())
	}
	if len(ids) != 5 {
		t.Fatalf("enqueued: %s %s", step1.Raw, step2.Raw)
	}
	for range ids {
		d := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w"}`).Body)
		ro, at := d.Get("rollout_id").String(), d.Get("attempt_id").String()
		if r := gatewaytest.Do(t, "POST", d.Get("base_url").String()+"/chat/completions", gatewaytest.ChatBody); r.Status != 200 {
			t.Fatalf("call: %d %s", r.Status, r.Body)
		}
		gatewaytest.Do(t, "POST", api+"/rollouts/"+ro+"/rewards", `{"value":1,"attempt_id":"`+at+`"}`)
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro+"/status", `{"status":"succeeded","attempt_id":"`+at+`","worker_id":"w"}`); r.Status != 200 {
			t.Fatalf("status: %d %s", r.Status, r.Body)
		}
	}
	b := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/bridge/batches", `{"estimator":"none","report":true}`).Body)
	group := map[string]string{}
	for _, a := range b.Get("report").Array() {
		group[a.Get("rollout_id").String()] = a.Get("group").String()
	}
	g := func(i int) string { return group[ids[i]] }
	if g(0) == "" || g(0) != g(1) || g(2) == g(0) || g(3) == g(0) || g(3) == "" || g(4) != "mine" {
		t.Fatalf("groups of step 1 (q, q, r) and step 2 (q, mine): %q %q %q %q %q\n%s", g(0), g(1), g(2), g(3), g(4), b.Raw)
	}
	// Registered rollouts may name their group; a group that is not a string is a 400.
	if r := gatewaytest.Do(t, "POST", api+"/rollouts", `{"task_id":"q","group_id":{"x":1}}`); r.Status != 400 {
		t.Fatalf("group_id object: %d %s", r.Status, r.Body)
	}
	if r := gatewaytest.Do(t, "POST", api+"/rollouts", `{"task_id":"q","group_id":"g-reg","metadata":{"a":1}}`); r.Status != 200 {
		t.Fatalf("register with a group: %d %s", r.Status, r.Body)
	}
	// The group is the rollouts table's group_id on every row (queued,
	// running, final) and is still mirrored in metadata for older readers.
	res, err := s.Query(context.Background(), "SELECT rollout_id, attempt_id, status, group_id, metadata FROM rollouts ORDER BY rollout_id, attempt_id")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for i, id := range ids {
		want[id] = g(i)
	}
	seen := map[string]bool{}
	for _, row := range res.Rows {
		w, ok := want[row[0]]
		if !ok {
			w = "g-reg"
		}
		if row[3] != w || gjson.Get(row[4], "group_id").String() != w {
			t.Errorf("row %q: group_id %q, metadata %s; want group %q", row[:3], row[3], row[4], w)
		}
		seen[row[0]] = true
	}
	if len(seen) != len(ids)+1 {
		t.Fatalf("rollouts rows of %d rollouts, want %d: %q", len(seen), len(ids)+1, res.Rows)
	}
}

// TestGroupIDOnStatusRows: POST /api/v1/rollouts/{id}/status without a task
// queue writes a row that keeps the rollout's group_id (the latest row wins):
// from the registration, from the store's row, or from the metadata of a row
// written before the group_id column existed.
func TestGroupIDOnStatusRows(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		s := open(t)
		e := gatewaytest.NewEnv(t, s, nil)
		api := e.URL + "/api/v1"
		ctx := context.Background()
		reg := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/rollouts", `{"task_id":"q","group_id":"g-reg"}`).Body)
		ro := reg.Get("rollout_id").String()
		// Rows this gateway never registered: one with the column, one as
		// an older release wrote it (the group only in metadata).
		if err := s.Write(ctx, &export.Batch{Rollouts: []export.Rollout{
			{RolloutID: "ro-col", AttemptID: "a1", TaskID: "q", GroupID: "g-col", Status: "running", Metadata: `{"group_id":"g-col"}`, CreatedUnixNano: 1, UpdatedUnixNano: 1},
			{RolloutID: "ro-old", AttemptID: "a1", TaskID: "q", Status: "running", Metadata: `{"group_id":"g-old"}`, CreatedUnixNano: 1, UpdatedUnixNano: 1},
		}}); err != nil {
			t.Fatal(err)
		}
		for id, group := range map[string]string{ro: "g-reg", "ro-col": "g-col", "ro-old": "g-old"} {
			r := gatewaytest.Do(t, "POST", api+"/rollouts/"+id+"/status", `{"status":"succeeded"}`)
			if r.Status != 200 || gjson.GetBytes(r.Body, "group_id").String() != group {
				t.Fatalf("status of %s: %d %s; want group_id %q", id, r.Status, r.Body, group)
			}
			d, err := s.Rollout(ctx, id)
			if err != nil || len(d.Attempts) != 1 || d.Attempts[0].Status != "succeeded" || d.Attempts[0].GroupID != group {
				t.Fatalf("rollout %s after its status: %+v %v; want group_id %q", id, d, err, group)
			}
		}
	})
}
