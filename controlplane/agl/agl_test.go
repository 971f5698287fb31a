package agl_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
	"github.com/rollgate/rollgate/testkit/testenv"
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

func newAGL(t *testing.T, store export.Store, queuePath string, mutate ...func(*agl.Config)) *aglEnv {
	t.Helper()
	return newAGLWith(t, store, queuePath, nil, mutate...)
}

// newAGLWith is newAGL with the gateway's config changed by gw.
func newAGLWith(t *testing.T, store export.Store, queuePath string, gw func(*gateway.Config), mutate ...func(*agl.Config)) *aglEnv {
	t.Helper()
	e := gatewaytest.NewEnv(t, store, gw)
	if queuePath == "" {
		queuePath = filepath.Join(t.TempDir(), "queue.db")
	}
	q, err := tasks.Open(context.Background(), queuePath, tasks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	e.CP.SetTaskQueue(q, 50*time.Millisecond)
	cfg := agl.Config{Enabled: true, Key: key, ModelName: "policy"}
	for _, f := range mutate {
		f(&cfg)
	}
	s, err := agl.New(cfg, e.GW,
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

const chatBody = `{"model":"auto","messages":[{"role":"user","content":"what is 2+2?"}],"temperature":0.2,"max_tokens":6}`

// events reads a rollout's events (raw or as triplets).
func (e *aglEnv) events(t *testing.T, rollout, query string) []gjson.Result {
	t.Helper()
	return gjson.ParseBytes(e.do(t, "GET", "/api/rollouts/"+rollout+"/events"+query, "", 200).Body).Array()
}

// TestAGLProxy plays AGL's agent and trainer against the proxy route with
// the mock engine behind it, on both stores: AGL's statuses, the per-mode
// overrides (and their record in llm_calls), capture with rollout, attempt
// and sequence ids, model_request events and triplets read right after the
// calls (read-your-writes), de-dup, rewards in the rewards table, and a
// streamed call whose triplet equals the same call not streamed.
func TestAGLProxy(t *testing.T) {
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newAGL(t, open(t), "")
		train := func(r string) string { return "/proxy/rollout/" + r + "/attempt/0/mode/train/openai/v1" }
		e.do(t, "POST", train("nope")+"/chat/completions", chatBody, 404)
		e.do(t, "POST", "/api/rollouts", `[{"input":{"data_id":"d7"},"rollout_id":"r1"},{"input":{},"rollout_id":"r2"},{"input":{},"rollout_id":"r3","is_train":false}]`, 201)
		if r := e.do(t, "POST", train("r1")+"/chat/completions", chatBody, 503); !strings.Contains(string(r.Body), "No servers available for model 'policy'") {
			t.Fatalf("503: %s", r.Body)
		}
		e.registerMock(t, 3)
		e.do(t, "POST", "/proxy/rollout/r1/attempt/0/mode/test/openai/v1/chat/completions", chatBody, 404)
		e.do(t, "POST", train("r1")+"/embeddings", `{}`, 404)
		e.do(t, "POST", train("r1")+"/chat/completions", `{"model":`, 400)
		e.do(t, "GET", train("r1")+"/chat/completions", "", 405)

		// The agent's calls: the same prompt twice, another prompt, a completion.
		r := e.do(t, "POST", train("r1")+"/chat/completions", chatBody, 200)
		resp := gjson.ParseBytes(r.Body)
		if resp.Get("model").String() != "policy" || !resp.Get("prompt_token_ids").IsArray() || !resp.Get("choices.0.token_ids").IsArray() ||
			!resp.Get("choices.0.logprobs.content").IsArray() || r.Header.Get("x-sequence-id") != "1" {
			t.Fatalf("train call: the agent sees AGL's body (forced model, token ids, logprobs): %v %s", r.Header, r.Body)
		}
		e.do(t, "POST", train("r1")+"/chat/completions", chatBody, 200)
		e.do(t, "POST", train("r1")+"/chat/completions", strings.Replace(chatBody, "2+2", "3+3", 1), 200)
		c := e.do(t, "POST", train("r1")+"/completions", `{"model":"auto","prompt":"hello there","max_tokens":4}`, 200)
		if !gjson.GetBytes(c.Body, "choices.0.logprobs.token_logprobs").IsArray() {
			t.Fatalf("train completions: logprobs forced: %s", c.Body)
		}
		e.do(t, "POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":1.0}}`, 200)
		e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"running","last_attempt_id":"0"}}`, 200)
		e.do(t, "PATCH", "/api/rollouts/r1", `{"status":{"state":"succeeded"}}`, 200)

		// Read at once, as AGL's trainer does on a terminal rollout.
		raw := e.events(t, "r1", "")
		if len(raw) != 5 || raw[4].Get("event_type").String() != "reward" {
			t.Fatalf("raw events: %v", raw)
		}
		mr := raw[0].Get("data")
		if raw[0].Get("event_type").String() != "model_request" || mr.Get("request.temperature").Float() != 1 || mr.Get("request.model").String() != "policy" ||
			mr.Get("request.messages.0.content").String() != "what is 2+2?" || mr.Get("model_version").Int() != 3 || mr.Get("server.version").Int() != 3 ||
			mr.Get("server.endpoint").String() != e.MockURL || mr.Get("http_status").Int() != 200 || mr.Get("status").String() != "ok" ||
			!mr.Get("response.choices.0.token_ids").IsArray() || mr.Get("adjusted_params.temperature").Float() != 1 || !mr.Get("usage.prompt_tokens").Exists() {
			t.Fatalf("model_request data: %s", mr.Raw)
		}
		trip := e.events(t, "r1", "?format=triplet")
		if len(trip) != 4 { // the first call's repeat keeps only the last of the two
			t.Fatalf("triplets (de-dup): %d %v", len(trip), trip)
		}
		rows := e.StoredCalls(export.CallFilter{RolloutID: "r1"})
		if len(rows) != 4 {
			t.Fatalf("llm_calls rows of r1: %d", len(rows))
		}
		for i, row := range rows {
			if row.AttemptID != "0" || row.SequenceID != uint64(i+1) || row.PolicyVersion != "3" || row.TaskID != "d7" || row.Model != "policy" ||
				!strings.Contains(row.Overrides, `"temperature":1`) || !strings.Contains(row.Overrides, `"return_token_ids":true`) ||
				(i < 3 && !strings.Contains(row.RequestBody, `"temperature":0.2`)) {
				t.Fatalf("row %d: %+v", i, row)
			}
		}
		second := trip[0].Get("data")
		if second.Get("prompt_token_ids").Raw != u32s(rows[1].PromptTokenIDs) || second.Get("response_token_ids").Raw != u32s(rows[1].ResponseTokenIDs) ||
			len(second.Get("response_log_probs").Array()) != len(rows[1].ResponseTokenIDs) || second.Get("server.version").Int() != 3 {
			t.Fatalf("triplet of the kept call: %s\nrow %+v", second.Raw, rows[1])
		}
		if n := len(trip[2].Get("data.response_log_probs").Array()); n == 0 || n != len(trip[2].Get("data.response_token_ids").Array()) {
			t.Fatalf("completions triplet logprobs: %s", trip[2].Raw)
		}
		if trip[3].Get("data").Raw != `{"value":1.0}` && trip[3].Get("data").Raw != `{"value":1}` {
			t.Fatalf("reward triplet: %s", trip[3].Raw)
		}
		d, err := e.Store.Rollout(context.Background(), "r1")
		if err != nil || len(d.Rewards) != 1 || d.Rewards[0].Value != 1 || d.Rewards[0].AttemptID != "0" {
			t.Fatalf("rewards table: %+v %v", d, err)
		}
		// rollgate's own API sees the AGL rollout: queue state, calls, rewards.
		v1 := gatewaytest.Do(t, "GET", e.URL+"/api/v1/rollouts?status=completed&ids=r1", "")
		if got := gjson.GetBytes(v1.Body, "rollouts.0"); v1.Status != 200 || got.Get("status").String() != "succeeded" || got.Get("task_id").String() != "d7" ||
			got.Get("calls.calls").Int() != 4 || got.Get("rewards.0.value").Float() != 1 {
			t.Fatalf("GET /api/v1/rollouts: %d %s", v1.Status, v1.Body)
		}

		// Streaming (beyond AGL): the triplet equals the same call not streamed.
		s := e.do(t, "POST", train("r2")+"/chat/completions", gatewaytest.WithStream(chatBody, `"stream":true`), 200)
		if !strings.Contains(string(s.Body), "data: [DONE]") {
			t.Fatalf("stream: %s", s.Body)
		}
		// GET rollout is not synced with capture (the trainer polls it): the
		// call's attempt shows once the call is stored.
		gatewaytest.WaitFor(t, "the attempt of r2's call listed", func() bool {
			return gjson.GetBytes(e.do(t, "GET", "/api/rollouts/r2", "", 200).Body, "attempts").Raw == `["0"]`
		})
		streamed := e.events(t, "r2", "?format=triplet")
		if len(streamed) != 1 || streamed[0].Get("data").Raw != trip[0].Get("data").Raw {
			t.Fatalf("streamed triplet differs from the non-streamed one:\n%v\n%s", streamed, trip[0].Get("data").Raw)
		}

		// Val mode: val temperature, no logprobs forced.
		e.do(t, "POST", "/proxy/rollout/r3/attempt/0/mode/val/openai/v1/chat/completions", chatBody, 200)
		v := e.events(t, "r3", "")
		if len(v) != 1 || v[0].Get("data.request.temperature").Float() != 0.7 || v[0].Get("data.request.logprobs").Exists() {
			t.Fatalf("val call: %v", v)
		}
		if tv := e.events(t, "r3", "?format=triplet"); tv[0].Get("data.response_log_probs").Type != gjson.Null {
			t.Fatalf("val triplet logprobs: %s", tv[0].Raw)
		}
	})
}

func u32s(ids []uint32) string {
	parts := make([]string, len(ids))
	for i, v := range ids {
		parts[i] = strconv.FormatUint(uint64(v), 10)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// TestAGLPauseDrain plays AGL's trainer in async mode: pause while a slow
// call is in flight; new calls get 429 at once (Retry-After, X-Agl-Paused,
// not captured), the in-flight call finishes, the trainer polls
// /proxy/state until inflight is 0, resumes, and calls go through again.
// A stream counts as in flight until its last byte.
func TestAGLPauseDrain(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := newAGL(t, store, "")
	e.registerMock(t, 1)
	e.do(t, "POST", "/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	url := e.URL + "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
	inflight := func() int64 { return gjson.GetBytes(e.do(t, "GET", "/proxy/state", "", 200).Body, "inflight").Int() }

	slow := make(chan gatewaytest.Resp, 1)
	go func() { slow <- gatewaytest.Do(t, "POST", url, chatBody, "x-api-key", key, "x-mock-ttft-ms", "1500") }()
	gatewaytest.WaitFor(t, "the slow call in flight", func() bool { return inflight() == 1 })
	p := e.do(t, "POST", "/proxy/pause", `{"reason":"rollout_done step=1"}`, 200)
	if gjson.GetBytes(p.Body, "paused").Bool() != true || gjson.GetBytes(p.Body, "retry_after_seconds").Int() != 5 ||
		gjson.GetBytes(p.Body, "reason").String() != "rollout_done step=1" || gjson.GetBytes(p.Body, "inflight").Int() != 1 {
		t.Fatalf("pause: %s", p.Body)
	}
	start := time.Now()
	r := gatewaytest.Do(t, "POST", url, chatBody, "x-api-key", key)
	if r.Status != 429 || r.Header.Get("Retry-After") != "5" || r.Header.Get("X-Agl-Paused") != "true" ||
		gjson.GetBytes(r.Body, "error").String() != "gateway paused" || gjson.GetBytes(r.Body, "reason").String() != "rollout_done step=1" {
		t.Fatalf("paused call: %d %v %s", r.Status, r.Header, r.Body)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("a paused call was held %v; AGL answers 429 at once", time.Since(start))
	}
	e.do(t, "GET", "/api/rollouts/r1", "", 200) // /api keeps working while paused
	gatewaytest.WaitFor(t, "drained", func() bool { return inflight() == 0 })
	if s := <-slow; s.Status != 200 {
		t.Fatalf("the in-flight call did not finish: %d %s", s.Status, s.Body)
	}
	res := e.do(t, "POST", "/proxy/resume", "", 200)
	if gjson.GetBytes(res.Body, "paused").Bool() || gjson.GetBytes(res.Body, "reason").Type != gjson.Null || gjson.GetBytes(res.Body, "retry_after_seconds").Int() != 5 {
		t.Fatalf("resume: %s", res.Body)
	}

	// A stream is in flight from its headers to its last byte.
	req, _ := http.NewRequest("POST", url, strings.NewReader(gatewaytest.WithStream(chatBody, `"stream":true`)))
	req.Header.Set("x-api-key", key)
	req.Header.Set("x-mock-itl-ms", "300")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if n := inflight(); n != 1 {
		t.Fatalf("in flight while the stream is open: %d", n)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "[DONE]") {
		t.Fatalf("stream: %s", body)
	}
	gatewaytest.WaitFor(t, "the stream's end counted", func() bool { return inflight() == 0 })
	if rows := e.StoredCalls(export.CallFilter{RolloutID: "r1"}); len(rows) != 2 {
		t.Fatalf("captured calls: %d, want 2 (the 429 is not captured)", len(rows))
	}
}

// TestAGLRetries: AGL's retry policy towards engines on the proxy route:
// 408/409/429/5xx answers are retried (six attempts in all), then passed
// through and captured once as an error; other statuses are not retried.
func TestAGLRetries(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := newAGL(t, store, "", func(c *agl.Config) { c.RetryBackoff = 5 * time.Millisecond })
	e.registerMock(t, 1)
	e.do(t, "POST", "/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	url := "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
	before := e.Mock.RequestsTo(mock.PathChat)
	r := e.do(t, "POST", url, chatBody, 503, "x-mock-fail", "status=503")
	if n := e.Mock.RequestsTo(mock.PathChat) - before; n != 6 {
		t.Fatalf("attempts on 503: %d, want 6", n)
	}
	if !strings.Contains(string(r.Body), "mock failure") {
		t.Fatalf("the engine's answer is passed through: %s", r.Body)
	}
	before = e.Mock.RequestsTo(mock.PathChat)
	e.do(t, "POST", url, gatewaytest.WithStream(chatBody, `"stream":true`), 429, "x-mock-fail", "status=429")
	if n := e.Mock.RequestsTo(mock.PathChat) - before; n != 6 {
		t.Fatalf("attempts on a streamed call answered 429: %d, want 6", n)
	}
	before = e.Mock.RequestsTo(mock.PathChat)
	e.do(t, "POST", url, chatBody, 400, "x-mock-fail", "status=400")
	if n := e.Mock.RequestsTo(mock.PathChat) - before; n != 1 {
		t.Fatalf("attempts on 400: %d, want 1", n)
	}
	trip := e.events(t, "r1", "?format=triplet")
	if len(trip) != 1 { // errors have no prompt ids: de-dup keeps the last
		t.Fatalf("triplets: %v", trip)
	}
	if d := trip[0].Get("data"); d.Get("status").String() != "error" || d.Get("http_status").Int() != 400 || !d.Get("error").Exists() ||
		d.Get("prompt_token_ids").Raw != "[]" || d.Get("response_token_ids").Raw != "[]" {
		t.Fatalf("error triplet: %s", d.Raw)
	}
	if rows := e.StoredCalls(export.CallFilter{RolloutID: "r1"}); len(rows) != 3 || rows[0].HTTPStatus != 503 || rows[1].HTTPStatus != 429 || !rows[1].Stream ||
		rows[0].BackendAttempts != 6 || rows[1].BackendAttempts != 6 || rows[2].BackendAttempts != 1 {
		t.Fatalf("rows: %+v", rows)
	}
	// The raw events carry AGL's retry_count: the attempts after the first.
	var counts []int64
	for _, ev := range e.events(t, "r1", "?event_type=model_request") {
		counts = append(counts, ev.Get("data.retry_count").Int())
	}
	if fmt.Sprint(counts) != "[5 5 0]" {
		t.Fatalf("retry_count of the model_request events: %v, want [5 5 0]", counts)
	}
}

// TestAGLHostileInput: junk on every AGL route gets a 4xx (FastAPI-style
// where AGL answers itself), never a 5xx, and the gateway stays up.
func TestAGLHostileInput(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := newAGL(t, store, "")
	e.registerMock(t, 1)
	e.do(t, "POST", "/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	proxy := "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/api/rollouts", deep},
		{"POST", "/api/rollouts", `[{"input":1,"config":{"timeout_seconds":"x"}}]`},
		{"POST", "/api/rollouts", `[{"input":1,"metadata":{"batch_idx":1.5}}]`},
		{"POST", "/api/rollouts", `[{"input":1,"rollout_id":"` + strings.Repeat("a", 200) + `"}]`},
		{"POST", "/api/rollouts", "[{\"input\":\"\xff\xfe\"}]"},
		{"PATCH", "/api/rollouts/r1", deep},
		{"PATCH", "/api/rollouts/r1", `{"status":[1]}`},
		{"PATCH", "/api/rollouts/r1", `{"status":{"last_attempt_id":5}}`},
		{"GET", "/api/rollouts?state_in=" + strings.Repeat("queuing&state_in=", 300) + "running", ""},
		{"GET", "/api/rollouts/terminal?after=99999999999999999999", ""},
		{"GET", "/api/rollouts/" + strings.Repeat("x", 4000), ""},
		{"GET", "/api/rollouts/%00/events", ""},
		{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":"NaN"}}`},
		{"POST", "/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":1e999}}`},
		{"POST", "/api/models", `[{"model":"policy","endpoint":"not a url"}]`},
		{"POST", "/api/models", `[{"model":"policy","endpoint":"http://x/v1","version":1.5}]`},
		{"POST", "/proxy/pause", `{"retry_after_seconds":1e30}`},
		{"POST", "/proxy/pause", `[]`},
		{"POST", proxy, `null`},
		{"POST", proxy, `[]`},
		{"POST", proxy, deep},
		{"POST", proxy, `{"messages":"hi","n":100000000}`},
		{"POST", "/proxy/rollout/r1/attempt/" + strings.Repeat("a", 200) + "/mode/train/openai/v1/chat/completions", `{}`},
		{"POST", "/proxy/rollout//attempt/0/mode/train/openai/v1/completions", `{}`},
		{"DELETE", "/proxy/state", ""},
	} {
		r := gatewaytest.Do(t, tc.method, e.URL+tc.path, tc.body, "x-api-key", key)
		if r.Status < 400 && !(r.Status == 200 && strings.HasPrefix(tc.path, "/api/rollouts?")) && !(r.Status == 200 && strings.Contains(tc.path, "/terminal")) &&
			!(r.Status == 200 && strings.HasSuffix(tc.path, "/events")) {
			t.Errorf("%s %.80s %.60q: %d %.200s", tc.method, tc.path, tc.body, r.Status, r.Body)
		}
		if r.Status >= 500 {
			t.Errorf("%s %.80s %.60q: %d (a client mistake) %.300s", tc.method, tc.path, tc.body, r.Status, r.Body)
		}
	}
	if r := gatewaytest.Do(t, "GET", e.URL+"/healthz", ""); r.Status != 200 {
		t.Fatalf("gateway down after hostile input: %d", r.Status)
	}
	// The model registered before still routes.
	e.do(t, "POST", proxy, chatBody, 200)
}

// TestAGLUpstreamFailures: the proxy route's 502 (engine unreachable, after
// AGL's six attempts) and 504 (engine silent past the upstream timeout),
// FastAPI-style, each captured once as an error.
func TestAGLUpstreamFailures(t *testing.T) {
	store, _ := gatewaytest.OpenSQLite(t)
	e := newAGLWith(t, store, "", func(c *gateway.Config) { c.UpstreamTimeout = time.Second },
		func(c *agl.Config) { c.RetryBackoff = 5 * time.Millisecond })
	e.do(t, "POST", "/api/rollouts", `[{"input":{},"rollout_id":"r1"}]`, 201)
	url := "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"

	e.registerMock(t, 1)
	r := e.do(t, "POST", url, chatBody, 504, "x-mock-fail", "hang")
	if !gjson.GetBytes(r.Body, "detail").Exists() {
		t.Fatalf("504 body: %s", r.Body)
	}
	// An endpoint nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() + "/v1"
	ln.Close()
	e.do(t, "DELETE", "/api/models", "", 200)
	e.do(t, "POST", "/api/models", `[{"model":"policy","endpoint":"`+dead+`","version":2}]`, 201)
	r = e.do(t, "POST", url, chatBody, 502)
	if msg := gjson.GetBytes(r.Body, "detail").String(); !strings.Contains(msg, "after 6 attempts") {
		t.Fatalf("502 body: %s", r.Body)
	}
	trip := e.events(t, "r1", "?format=triplet")
	if len(trip) != 1 || trip[0].Get("data.http_status").Int() != 502 || trip[0].Get("data.status").String() != "error" {
		t.Fatalf("error triplets (de-dup keeps the last): %v", trip)
	}
	if raw := e.events(t, "r1", ""); len(raw) != 2 || raw[0].Get("data.http_status").Int() != 504 {
		t.Fatalf("raw events: %v", raw)
	}
}

// TestAGLOnPostgres: the trainer/controller/agent sequence with the queue
// on a real PostgreSQL (several gateways' shared queue) and the calls in
// either store.
func TestAGLOnPostgres(t *testing.T) {
	dsn, stop, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	gatewaytest.StoreKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		db, err := testenv.FreshPostgresDatabase(dsn, t.Name())
		if err != nil {
			t.Fatal(err)
		}
		e := newAGL(t, open(t), db)
		e.registerMock(t, 2)
		e.do(t, "POST", "/api/rollouts", `[{"input":{"data_id":"d"},"rollout_id":"p1"},{"input":{},"rollout_id":"p2"}]`, 201)
		e.do(t, "POST", "/api/rollouts", `[{"input":{},"rollout_id":"p1"}]`, 201)
		if r := e.do(t, "GET", "/api/rollouts?state_in=queuing", "", 200); gjson.GetBytes(r.Body, "#").Int() != 2 {
			t.Fatalf("list: %s", r.Body)
		}
		e.do(t, "PATCH", "/api/rollouts/p1", `{"status":{"state":"running","last_attempt_id":"0"}}`, 200)
		e.do(t, "PATCH", "/api/rollouts/p1", `{"status":{"state":"queuing"}}`, 409)
		e.do(t, "POST", "/proxy/rollout/p1/attempt/0/mode/train/openai/v1/chat/completions", chatBody, 200)
		e.do(t, "POST", "/api/rollouts/p1/attempt/0/events", `{"event_type":"reward","data":{"value":0.5}}`, 200)
		e.do(t, "PATCH", "/api/rollouts/p1", `{"status":{"state":"succeeded"}}`, 200)
		e.do(t, "PATCH", "/api/rollouts/p2", `{"status":{"state":"failed"}}`, 200)
		trip := e.events(t, "p1", "?format=triplet")
		if len(trip) != 2 || trip[0].Get("data.server.version").Int() != 2 || trip[1].Get("data.value").Float() != 0.5 {
			t.Fatalf("triplets: %v", trip)
		}
		e.do(t, "DELETE", "/api/rollouts/p2", "", 204)
		if r := e.do(t, "GET", "/api/rollouts/terminal", "", 200); gjson.GetBytes(r.Body, "total_terminal").Int() != 2 || gjson.GetBytes(r.Body, "items.#").Int() != 1 {
			t.Fatalf("terminal: %s", r.Body)
		}
	})
}
