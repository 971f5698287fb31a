package controlplane_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// withQueue mounts a task queue (a fresh SQLite file unless dsn is given) on
// the env's gateway, sweeping expired leases every 50 ms.
func withQueue(t *testing.T, e *gatewaytest.Env, dsn string) *tasks.Queue {
	t.Helper()
	if dsn == "" {
		dsn = filepath.Join(t.TempDir(), "queue.db")
	}
	q, err := tasks.Open(context.Background(), dsn, tasks.Options{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	e.CP.SetTaskQueue(q, 50*time.Millisecond)
	return q
}

// TestTrainingLoopAPI runs the loop over real HTTP: enqueue, publish
// resources, dequeue, call the model through the lease's base URL, reward,
// complete; a runner that stops heartbeating loses its lease and the task is
// retried as a new attempt; completed rollouts page by cursor with rewards
// and call summaries; the rollouts table mirrors every state.
func TestTrainingLoopAPI(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := gatewaytest.NewEnv(t, open(t), nil)
		withQueue(t, e, "")
		api := e.URL + "/api/v1"
		if r := gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w0"}`); r.Status != 204 {
			t.Fatalf("empty queue: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "GET", api+"/resources/latest", ""); r.Status != 404 {
			t.Fatalf("no resources yet: %d %s", r.Status, r.Body)
		}
		r := gatewaytest.Do(t, "POST", api+"/resources", `{"resources":{"llm":{"model":"mock-model"},"prompt":"Solve: {q}"}}`)
		if r.Status != 200 || gjson.GetBytes(r.Body, "version").Int() != 1 {
			t.Fatalf("publish resources: %d %s", r.Status, r.Body)
		}
		r = gatewaytest.Do(t, "POST", api+"/tasks", `[{"task_id":"math-1","input":{"q":"2+2"},"metadata":{"split":"a"}},
			{"task_id":"math-2","input":{"q":"3+3"},"max_attempts":2,"lease_s":0.5}]`)
		if r.Status != 200 || gjson.GetBytes(r.Body, "rollout_ids.#").Int() != 2 {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		ro1, ro2 := gjson.GetBytes(r.Body, "rollout_ids.0").String(), gjson.GetBytes(r.Body, "rollout_ids.1").String()

		// Runner A: the first task, one call, a reward, success.
		a := gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"runner-a"}`)
		la := gjson.ParseBytes(a.Body)
		if a.Status != 200 || la.Get("rollout_id").String() != ro1 || la.Get("task_id").String() != "math-1" ||
			la.Get("input.q").String() != "2+2" || la.Get("resources_version").Int() != 1 || la.Get("attempt_no").Int() != 1 ||
			la.Get("base_url").String() != fmt.Sprintf("%s/rollout/%s/attempt/%s/v1", e.URL, ro1, la.Get("attempt_id").String()) ||
			la.Get("lease_expires_unix_nano").Int() <= time.Now().UnixNano() {
			t.Fatalf("lease A: %d %s", a.Status, a.Body)
		}
		c := gatewaytest.Do(t, "POST", la.Get("base_url").String()+"/chat/completions", gatewaytest.ChatBody)
		if c.Status != 200 {
			t.Fatalf("call: %d %s", c.Status, c.Body)
		}
		row := e.WaitCalls(c.Header.Get("x-request-id"), 1)[0]
		if row.TaskID != "math-1" || row.RolloutID != ro1 || row.AttemptID != la.Get("attempt_id").String() || row.SequenceID != 1 {
			t.Fatalf("captured call not attributed to the lease: %+v", row)
		}
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro1+"/heartbeat", `{"attempt_id":"`+la.Get("attempt_id").String()+`","worker_id":"runner-a"}`); r.Status != 200 {
			t.Fatalf("heartbeat: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro1+"/rewards", `{"value":1}`); r.Status != 200 {
			t.Fatalf("reward: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro1+"/status", `{"status":"succeeded","attempt_id":"`+la.Get("attempt_id").String()+`","worker_id":"runner-a"}`); r.Status != 200 ||
			gjson.GetBytes(r.Body, "completion_seq").Int() != 1 {
			t.Fatalf("complete A: %d %s", r.Status, r.Body)
		}

		// Runner B takes the second task and hangs: its lease expires.
		b := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"runner-b"}`).Body)
		if b.Get("rollout_id").String() != ro2 {
			t.Fatalf("lease B: %s", b.Raw)
		}
		gatewaytest.WaitFor(t, "the hung runner's lease to expire", func() bool {
			g := gjson.ParseBytes(gatewaytest.Do(t, "GET", api+"/rollouts/"+ro2, "").Body)
			return g.Get("queue.status").String() == "queued" && g.Get("queue.attempts.0.status").String() == "expired"
		})
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro2+"/heartbeat", `{"attempt_id":"`+b.Get("attempt_id").String()+`","worker_id":"runner-b"}`); r.Status != 409 {
			t.Fatalf("heartbeat of an expired lease: %d %s", r.Status, r.Body)
		}
		cl := gjson.ParseBytes(gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"runner-c"}`).Body)
		if cl.Get("rollout_id").String() != ro2 || cl.Get("attempt_no").Int() != 2 || cl.Get("attempt_id").String() == b.Get("attempt_id").String() {
			t.Fatalf("retry lease: %s (first %s)", cl.Raw, b.Raw)
		}
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro2+"/status", `{"status":"succeeded","attempt_id":"`+b.Get("attempt_id").String()+`","worker_id":"runner-b"}`); r.Status != 409 {
			t.Fatalf("the expired attempt completed the rollout: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", api+"/rollouts/"+ro2+"/status", `{"status":"failed","reason":"tool crashed","attempt_id":"`+cl.Get("attempt_id").String()+`","worker_id":"runner-c"}`); r.Status != 200 ||
			gjson.GetBytes(r.Body, "status").String() != "failed" {
			t.Fatalf("fail the last attempt: %d %s", r.Status, r.Body)
		}
		if r := gatewaytest.Do(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w"}`); r.Status != 204 {
			t.Fatalf("queue should be empty: %d %s", r.Status, r.Body)
		}

		// Completed rollouts, in completion order, with rewards and call summaries.
		l := gjson.ParseBytes(gatewaytest.Do(t, "GET", api+"/rollouts?after=0&limit=10", "").Body)
		if l.Get("rollouts.#").Int() != 2 || l.Get("rollouts.0.rollout_id").String() != ro1 || l.Get("rollouts.0.status").String() != "succeeded" ||
			l.Get("rollouts.0.calls.calls").Int() != 1 || l.Get("rollouts.0.rewards.0.value").Float() != 1 ||
			l.Get("rollouts.1.rollout_id").String() != ro2 || l.Get("rollouts.1.last_error").String() != "tool crashed" ||
			l.Get("next_after").Int() != 2 {
			t.Fatalf("completed rollouts: %s", l.Raw)
		}
		if l := gjson.ParseBytes(gatewaytest.Do(t, "GET", api+"/rollouts?after=1&limit=10", "").Body); l.Get("rollouts.#").Int() != 1 || l.Get("rollouts.0.rollout_id").String() != ro2 {
			t.Fatalf("page after cursor 1: %s", l.Raw)
		}
		if l := gjson.ParseBytes(gatewaytest.Do(t, "GET", api+"/rollouts?after=2&wait_s=1", "").Body); l.Get("rollouts.#").Int() != 0 || l.Get("next_after").Int() != 2 {
			t.Fatalf("nothing after the last cursor: %s", l.Raw)
		}
		if r := gatewaytest.Do(t, "GET", api+"/rollouts?status=bogus", ""); r.Status != 400 {
			t.Fatalf("bad status filter: %d", r.Status)
		}

		// The rollouts table shows each attempt's outcome; the latest row wins.
		res, err := e.Store.Query(context.Background(), "SELECT rollout_id, attempt_id, status FROM rollouts WHERE rollout_id IN ('"+ro1+"','"+ro2+"') ORDER BY updated_unix_nano")
		if err != nil {
			t.Fatal(err)
		}
		latest, perAttempt := map[string]string{}, map[string]string{}
		for _, r := range res.Rows {
			latest[r[0]] = r[2]
			if r[1] != "" {
				perAttempt[r[1]] = r[2]
			}
		}
		if latest[ro1] != "succeeded" || latest[ro2] != "failed" || perAttempt[b.Get("attempt_id").String()] != "failed" {
			t.Fatalf("rollouts table: %v", res.Rows)
		}
		v1 := gjson.ParseBytes(gatewaytest.Do(t, "GET", api+"/resources/1", "").Body)
		if v1.Get("resources.prompt").String() != "Solve: {q}" {
			t.Fatalf("resources v1: %s", v1.Raw)
		}
		for _, bad := range []struct{ method, path, body string }{
			{"POST", "/tasks", `{"task_id":"x","mode":"exam"}`},
			{"POST", "/tasks", `[]`},
			{"POST", "/tasks", `{"task_id":"x","bogus":1}`},
			{"POST", "/rollouts/" + ro1 + "/heartbeat", `{}`},
			{"POST", "/resources", `[1,2]`},
			{"GET", "/resources/zero", ``},
		} {
			if r := gatewaytest.Do(t, bad.method, api+bad.path, bad.body); r.Status != 400 || gjson.GetBytes(r.Body, "error.message").String() == "" {
				t.Errorf("%s %s %s: %d %s", bad.method, bad.path, bad.body, r.Status, r.Body)
			}
		}
	})
}

// TestSelfReportedCalls stores triplets from an agent that cannot be proxied,
// with sequence ids continuing the proxied calls of the same attempt.
func TestSelfReportedCalls(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := gatewaytest.NewEnv(t, open(t), nil)
		withQueue(t, e, "")
		reg := gjson.ParseBytes(gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts", `{"task_id":"t-self"}`).Body)
		ro, at := reg.Get("rollout_id").String(), reg.Get("attempt_id").String()
		c := gatewaytest.Do(t, "POST", reg.Get("base_url").String()+"/chat/completions", gatewaytest.ChatBody)
		e.WaitCalls(c.Header.Get("x-request-id"), 1)
		r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/calls", `{"calls":[
			{"messages":[{"role":"user","content":"hi"}],"response":"hello","model":"in-process",
			 "prompt_token_ids":[1,2,3],"response_token_ids":[7,8],"response_logprobs":[-0.5,-0.25],"token_source":"engine","reward":0.5},
			{"prompt":"2+2=","response":{"role":"assistant","content":"4"}}]}`)
		if r.Status != 200 {
			t.Fatalf("report: %d %s", r.Status, r.Body)
		}
		j := gjson.ParseBytes(r.Body)
		if j.Get("calls.0.sequence_id").Int() != 2 || j.Get("calls.1.sequence_id").Int() != 3 || j.Get("calls.0.attempt_id").String() != at ||
			j.Get("calls.1.token_source").String() != "none" {
			t.Fatalf("report answer: %s", r.Body)
		}
		rows := e.WaitCalls(j.Get("calls.0.span_id").String(), 1)
		got := rows[0]
		if got.RolloutID != ro || got.AttemptID != at || got.TaskID != "t-self" || got.TokenSource != "engine" ||
			fmt.Sprint(got.PromptTokenIDs) != "[1 2 3]" || fmt.Sprint(got.ResponseTokenIDs) != "[7 8]" ||
			fmt.Sprint(got.ResponseLogprobs) != "[-0.5 -0.25]" || got.Model != "in-process" || got.Backend != "reported" ||
			gjson.Get(got.ResponseMessage, "content").String() != "hello" || gjson.Get(got.RequestBody, "messages.0.content").String() != "hi" {
			t.Fatalf("stored reported call: %+v", got)
		}
		second := e.WaitCalls(j.Get("calls.1.span_id").String(), 1)[0]
		if second.Endpoint != "/v1/completions" || second.TokenSource != "none" || gjson.Get(second.RequestBody, "prompt").String() != "2+2=" {
			t.Fatalf("second reported call: %+v", second)
		}
		d, err := e.Store.Rollout(context.Background(), ro)
		if err != nil {
			t.Fatal(err)
		}
		var rewarded bool
		for _, rw := range d.Rewards {
			rewarded = rewarded || (rw.SequenceID == 2 && rw.Value == 0.5 && rw.Source == "reported")
		}
		if !rewarded {
			t.Fatalf("reward of the reported call: %+v", d.Rewards)
		}
		for _, bad := range []string{
			`{"calls":[]}`,
			`{"response":"x"}`,
			`{"messages":[],"response":42}`,
			`{"messages":[],"response":"x","token_source":"guess","response_token_ids":[1]}`,
			`{"messages":[],"response":"x","token_source":"engine"}`,
			`{"messages":[],"response":"x","response_token_ids":[1,2],"response_logprobs":[-1]}`,
			`{"messages":[],"response":"x"`,
		} {
			if r := gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/calls", bad); r.Status != 400 {
				t.Errorf("bad report %s: %d %s", bad, r.Status, r.Body)
			}
		}
		// Refused bodies took no sequence ids.
		r = gatewaytest.Do(t, "POST", e.URL+"/api/v1/rollouts/"+ro+"/calls", `{"messages":[],"response":"late"}`)
		if gjson.GetBytes(r.Body, "calls.0.sequence_id").Int() != 4 {
			t.Fatalf("sequence after refused reports: %s", r.Body)
		}
	})
}

// TestTwoGatewaysShareOnePostgresQueue: runners dequeue concurrently through
// two gateways sharing one PostgreSQL queue; every task goes to exactly one
// attempt.
func TestTwoGatewaysShareOnePostgresQueue(t *testing.T) {
	dsn, stop, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	store, _ := gatewaytest.OpenSQLite(t)
	e1, e2 := gatewaytest.NewEnv(t, store, nil), gatewaytest.NewEnv(t, store, nil)
	withQueue(t, e1, dsn)
	withQueue(t, e2, dsn)
	const n = 40
	body := "["
	for i := 0; i < n; i++ {
		if i > 0 {
			body += ","
		}
		body += fmt.Sprintf(`{"task_id":"t%d","input":%d}`, i%4, i)
	}
	if r := gatewaytest.Do(t, "POST", e1.URL+"/api/v1/tasks", body+"]"); r.Status != 200 {
		t.Fatalf("enqueue: %d %s", r.Status, r.Body)
	}
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			gw := []*gatewaytest.Env{e1, e2}[w%2]
			for {
				r := gatewaytest.Do(t, "POST", gw.URL+"/api/v1/tasks/dequeue", fmt.Sprintf(`{"worker_id":"w%d"}`, w))
				if r.Status == 204 {
					return
				}
				l := gjson.ParseBytes(r.Body)
				if r.Status != 200 {
					t.Errorf("dequeue: %d %s", r.Status, r.Body)
					return
				}
				mu.Lock()
				if prev, dup := seen[l.Get("rollout_id").String()]; dup {
					t.Errorf("%s handed out twice (%s, w%d)", l.Get("rollout_id").String(), prev, w)
				}
				seen[l.Get("rollout_id").String()] = fmt.Sprint("w", w)
				mu.Unlock()
				other := []*gatewaytest.Env{e2, e1}[w%2] // complete through the other gateway
				if r := gatewaytest.Do(t, "POST", other.URL+"/api/v1/rollouts/"+l.Get("rollout_id").String()+"/status",
					fmt.Sprintf(`{"status":"succeeded","attempt_id":%q,"worker_id":"w%d"}`, l.Get("attempt_id").String(), w)); r.Status != 200 {
					t.Errorf("complete: %d %s", r.Status, r.Body)
				}
			}
		}(w)
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d of %d tasks handed out", len(seen), n)
	}
	l := gjson.ParseBytes(gatewaytest.Do(t, "GET", e2.URL+"/api/v1/rollouts?after=0&limit=1000&summary=0", "").Body)
	if l.Get("rollouts.#").Int() != n || l.Get("next_after").Int() != n {
		t.Fatalf("completed through both gateways: %d rollouts, next_after %d", l.Get("rollouts.#").Int(), l.Get("next_after").Int())
	}
}
