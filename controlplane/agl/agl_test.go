package agl_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/gatewaytest"
	"github.com/rollgate/rollgate/trainer-bridge/tasks"
)

func TestMain(m *testing.M) { gatewaytest.Main(m) }

const key = "agl-secret"

// aglEnv is a mock engine, a gateway with its control plane and task
// queue, and the Agent Lightning surface mounted, on loopback.
type aglEnv struct {
	*gatewaytest.Env
	Q   *tasks.Queue
	AGL *agl.Server
}

func newAGL(t *testing.T, store export.Store, queuePath string) *aglEnv {
	t.Helper()
	e := gatewaytest.NewEnv(t, store, nil)
	if queuePath == "" {
		queuePath = filepath.Join(t.TempDir(), "queue.db")
	}
	q, err := tasks.Open(context.Background(), queuePath, tasks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	e.CP.SetTaskQueue(q, 50*time.Millisecond)
	s, err := agl.New(agl.Config{Enabled: true, Key: key, ModelName: "policy"}, e.GW,
		agl.Deps{Queue: q, Store: store, Capture: e.Pipe, Mirror: e.CP.MirrorChanges})
	if err != nil {
		t.Fatal(err)
	}
	s.Mount()
	return &aglEnv{Env: e, Q: q, AGL: s}
}

// do sends an authenticated request (Bearer) and checks the status.
func (e *aglEnv) do(t *testing.T, method, path, body string, want int, headers ...string) gatewaytest.Resp {
	t.Helper()
	r := gatewaytest.Do(t, method, e.URL+path, body, append([]string{"Authorization", "Bearer " + key}, headers...)...)
	if r.Status != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.Status, want, r.Body)
	}
	return r
}

// TestAGLRoutes plays AGL's controller and trainer over real HTTP: every
// route of its surface that does not reach the model, with its status codes
// and error shapes (AGL.md §3, §5, §6).
func TestAGLRoutes(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := newAGL(t, store, "")

	// Auth: no key / wrong key 401 with FastAPI's detail; x-api-key works; /healthz needs none.
	for _, h := range [][]string{nil, {"Authorization", "Bearer nope"}, {"x-api-key", "nope"}} {
		r := gatewaytest.Do(t, "GET", e.URL+"/proxy/state", "", h...)
		if r.Status != 401 || gjson.GetBytes(r.Body, "detail").String() != "Invalid or missing API key" {
			t.Fatalf("no key %v: %d %s", h, r.Status, r.Body)
		}
	}
	if r := gatewaytest.Do(t, "GET", e.URL+"/proxy/state", "", "x-api-key", key); r.Status != 200 {
		t.Fatalf("x-api-key: %d %s", r.Status, r.Body)
	}
	if r := gatewaytest.Do(t, "GET", e.URL+"/healthz", ""); r.Status != 200 || gjson.GetBytes(r.Body, "status").String() != "ok" {
		t.Fatalf("healthz: %d %s", r.Status, r.Body)
	}
	// rollgate's own routes keep OpenAI-style errors.
	if r := gatewaytest.Do(t, "GET", e.URL+"/api/v1/nope", ""); r.Status != 404 || !gjson.GetBytes(r.Body, "error.message").Exists() {
		t.Fatalf("rollgate 404: %d %s", r.Status, r.Body)
	}
	e.do(t, "GET", "/api/nope", "", 404)
	e.do(t, "PUT", "/api/rollouts", "[]", 405)

	// Create: 201, same order, defaults; idempotent by id; 422 shapes.
	r := e.do(t, "POST", "/api/rollouts", `[{"input":{"data_id":"d1","q":"2+2"},"rollout_id":"r1","metadata":{"batch_idx":3,"x":"y"}},
		{"input":"plain","is_train":false,"config":{"timeout_seconds":60,"local":{"agent_class":"m:C"}}}]`, 201)
	if n := gjson.GetBytes(r.Body, "#").Int(); n != 2 {
		t.Fatalf("create: %s", r.Body)
	}
	r1 := gjson.GetBytes(r.Body, "0")
	if r1.Get("rollout_id").String() != "r1" || r1.Get("status.state").String() != "queuing" || r1.Get("status.version").Int() != 1 ||
		r1.Get("is_train").Bool() != true || r1.Get("config.timeout_seconds").Int() != 3600 || r1.Get("metadata.batch_idx").Int() != 3 ||
		r1.Get("metadata.x").String() != "y" || !r1.Get("metadata.sample_idx_in_batch").Exists() || r1.Get("status.last_attempt_id").Type != gjson.Null ||
		r1.Get("status.created_at").Float() < 1.7e9 {
		t.Fatalf("rollout r1: %s", r1.Raw)
	}
	r2 := gjson.GetBytes(r.Body, "1")
	r2id := r2.Get("rollout_id").String()
	if len(r2id) != 32 || r2.Get("is_train").Bool() || r2.Get("config.timeout_seconds").Int() != 60 ||
		r2.Get("config.local.agent_class").String() != "m:C" || r2.Get("config.local.env_map").Raw != "{}" {
		t.Fatalf("rollout 2: %s", r2.Raw)
	}
	again := e.do(t, "POST", "/api/rollouts", `[{"input":"other","rollout_id":"r1"}]`, 201)
	if gjson.GetBytes(again.Body, "0.input.q").String() != "2+2" {
		t.Fatalf("idempotent create changed r1: %s", again.Body)
	}
	for _, bad := range []string{`{}`, `[{"is_train":true}]`, `[{"input":1,"is_train":"maybe"}]`, `[{"input":1,"rollout_id":"a b"}]`, `[1]`, `not json`} {
		r := e.do(t, "POST", "/api/rollouts", bad, 422)
		if !gjson.GetBytes(r.Body, "detail.0.loc").IsArray() || gjson.GetBytes(r.Body, "detail.0.msg").String() == "" {
			t.Fatalf("422 shape for %s: %s", bad, r.Body)
		}
	}

	// List by state_in, creation order, limit; 422 without or with a bad state.
	r = e.do(t, "GET", "/api/rollouts?state_in=queuing&state_in=running&limit=50", "", 200)
	if gjson.GetBytes(r.Body, "#").Int() != 2 || gjson.GetBytes(r.Body, "0.rollout_id").String() != "r1" {
		t.Fatalf("list: %s", r.Body)
	}
	if r := e.do(t, "GET", "/api/rollouts?state_in=queuing&limit=1", "", 200); gjson.GetBytes(r.Body, "#").Int() != 1 {
		t.Fatalf("limit: %s", r.Body)
	}
	e.do(t, "GET", "/api/rollouts", "", 422)
	e.do(t, "GET", "/api/rollouts?state_in=done", "", 422)
	e.do(t, "GET", "/api/rollouts?state_in=queuing&limit=x", "", 422)

	// Get: 404; attempts empty until events.
	e.do(t, "GET", "/api/rollouts/nope", "", 404)
	if r := e.do(t, "GET", "/api/rollouts/r1", "", 200); gjson.GetBytes(r.Body, "rollout.rollout_id").String() != "r1" || gjson.GetBytes(r.Body, "attempts").Raw != "[]" {
		t.Fatalf("get: %s", r.Body)
	}

	// The state machine: 409 on forbidden moves, 422 on unknown state or field, version counts patches.
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"succeeded"}}`, 409)
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"done"}}`, 422)
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"color":"red"}}`, 422)
	e.do(t, "PATCH", "/api/rollouts/nope", `{"status":{"state":"running"}}`, 404)
	if r := e.do(t, "PATCH", "/api/rollouts/r1", `{}`, 200); gjson.GetBytes(r.Body, "status.version").Int() != 1 {
		t.Fatalf("empty patch: %s", r.Body)
	}
	r = e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"running","last_attempt_id":"0","k8s_job_name":"job-1"},"ignored":1}`, 200)
	if s := gjson.GetBytes(r.Body, "status"); s.Get("state").String() != "running" || s.Get("version").Int() != 2 ||
		s.Get("last_attempt_id").String() != "0" || s.Get("k8s_job_name").String() != "job-1" || s.Get("updated_at").Float() < s.Get("created_at").Float() {
		t.Fatalf("running: %s", r.Body)
	}
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"running"}}`, 409)
	if r := e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"error_message":"note"}}`, 200); gjson.GetBytes(r.Body, "status.version").Int() != 3 {
		t.Fatalf("field-only patch: %s", r.Body)
	}
	e.do(t, "PATCH", "/api/rollouts/"+r2id, `{"status":{"state":"failed","error_message":"spawn failed"}}`, 200)
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"succeeded"}}`, 200)
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"failed"}}`, 409)
	e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":null}}`, 409)

	// The rollouts table mirrors AGL's states (rollgate's own API sees them).
	gatewaytest.WaitFor(t, "r1 succeeded in the rollouts table", func() bool {
		d, err := store.Rollout(context.Background(), "r1")
		if err != nil || len(d.Attempts) == 0 {
			return false
		}
		for _, a := range d.Attempts {
			if a.Status == "succeeded" && a.AttemptID == "0" {
				return true
			}
		}
		return false
	})

	// Events: 404 on an unknown rollout, 422 without event_type, filter by type, only the last attempt's.
	e.do(t, "POST", "/api/rollouts/nope/attempt/0/events", `{"event_type":"x"}`, 404)
	e.do(t, "POST", "/api/rollouts/r1/attempt/0/events", `{"data":{}}`, 422)
	e.do(t, "POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"x","data":[1]}`, 422)
	ev := e.do(t, "POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"hook","data":{"k":1}}`, 200)
	if gjson.GetBytes(ev.Body, "attempt_id").String() != "0" || gjson.GetBytes(ev.Body, "data.k").Int() != 1 || gjson.GetBytes(ev.Body, "timestamp").Float() < 1.7e9 {
		t.Fatalf("event: %s", ev.Body)
	}
	e.do(t, "POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":0.5,"message":"m","source":"agent"}}`, 200)
	e.do(t, "POST", "/api/rollouts/r1/attempt/other/events", `{"event_type":"hook"}`, 200)
	r = e.do(t, "GET", "/api/rollouts/r1/events", "", 200)
	if gjson.GetBytes(r.Body, "#").Int() != 2 {
		t.Fatalf("events of attempt 0: %s", r.Body)
	}
	r = e.do(t, "GET", "/api/rollouts/r1/events?event_type=reward&format=triplet", "", 200)
	if gjson.GetBytes(r.Body, "#").Int() != 1 || gjson.GetBytes(r.Body, "0.data").Raw != `{"source":"agent","value":0.5}` {
		t.Fatalf("reward triplet: %s", r.Body)
	}
	if r := e.do(t, "GET", "/api/rollouts/r1", "", 200); gjson.GetBytes(r.Body, "attempts").Raw != `["0","other"]` {
		t.Fatalf("attempts: %s", r.Body)
	}
	e.do(t, "GET", "/api/rollouts/nope/events", "", 404)

	// Terminal cursor: completion order; deleted rollouts skipped but counted.
	r = e.do(t, "GET", "/api/rollouts/terminal", "", 200)
	if gjson.GetBytes(r.Body, "total_terminal").Int() != 2 || gjson.GetBytes(r.Body, "next_after").Int() != 2 ||
		gjson.GetBytes(r.Body, "items.0.rollout_id").String() != r2id || gjson.GetBytes(r.Body, "items.0.state").String() != "failed" ||
		gjson.GetBytes(r.Body, "items.0.is_train").Bool() || gjson.GetBytes(r.Body, "items.1.data_id").String() != "d1" {
		t.Fatalf("terminal: %s", r.Body)
	}
	if r := e.do(t, "GET", "/api/rollouts/terminal?after=1&limit=0", "", 200); gjson.GetBytes(r.Body, "items.#").Int() != 1 || gjson.GetBytes(r.Body, "next_after").Int() != 2 {
		t.Fatalf("terminal after=1: %s", r.Body)
	}
	e.do(t, "DELETE", "/api/rollouts/"+r2id, "", 204)
	e.do(t, "DELETE", "/api/rollouts/"+r2id, "", 204)
	r = e.do(t, "GET", "/api/rollouts/terminal?after=-5", "", 200)
	if gjson.GetBytes(r.Body, "items.#").Int() != 1 || gjson.GetBytes(r.Body, "next_after").Int() != 2 || gjson.GetBytes(r.Body, "total_terminal").Int() != 2 {
		t.Fatalf("terminal after delete: %s", r.Body)
	}
	e.do(t, "GET", "/api/rollouts/"+r2id, "", 404)
	// A rollout created again under a deleted id starts empty.
	e.do(t, "DELETE", "/api/rollouts/r1", "", 204)
	e.do(t, "POST", "/api/rollouts", `[{"input":null,"rollout_id":"r1"}]`, 201)
	if r := e.do(t, "GET", "/api/rollouts/r1/events", "", 200); r.Body == nil || string(r.Body) != "[]" {
		t.Fatalf("events of a re-created rollout: %s", r.Body)
	}

	// Models: 201 upsert, 422, DELETE 200; pause needs a body.
	e.do(t, "POST", "/api/models", `[{"model":"policy"}]`, 422)
	e.do(t, "POST", "/api/models", `{"model":"policy","endpoint":"x"}`, 422)
	if r := e.do(t, "DELETE", "/api/models", "", 200); gjson.GetBytes(r.Body, "status").String() != "ok" {
		t.Fatalf("delete models: %s", r.Body)
	}
	e.do(t, "POST", "/proxy/pause", "", 422)
	e.do(t, "POST", "/proxy/pause", `{"retry_after_seconds":"soon"}`, 422)
}

// registerMock registers the env's mock engine as AGL's model "policy"
// at version v, as AGL's trainer does each step.
func (e *aglEnv) registerMock(t *testing.T, v int) {
	t.Helper()
	e.do(t, "DELETE", "/api/models", "", 200)
	e.do(t, "POST", "/api/models", `[{"model":"policy","endpoint":"`+e.MockURL+`","version":`+strconv.Itoa(v)+`}]`, 201)
}
