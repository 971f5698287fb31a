package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

func openSQLite(t *testing.T) (export.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rollgate.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

// TestRolloutAPI registers a rollout, makes calls through its base_url,
// posts rewards and a status, and reads it all back, in both stores.
func TestRolloutAPI(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		r := do(t, "POST", e.url+"/api/v1/rollouts", `{"task_id":"task-42","metadata":{"split":"train"}}`)
		if r.status != 200 {
			t.Fatalf("register: %d %s", r.status, r.body)
		}
		ro, at := gjson.GetBytes(r.body, "rollout_id").String(), gjson.GetBytes(r.body, "attempt_id").String()
		base := gjson.GetBytes(r.body, "base_url").String()
		if ro == "" || at == "" || base != fmt.Sprintf("%s/rollout/%s/attempt/%s/v1", e.url, ro, at) {
			t.Fatalf("register answer: %s", r.body)
		}
		c := do(t, "POST", base+"/chat/completions", chatBody)
		if c.status != 200 {
			t.Fatalf("call via base_url: %d %s", c.status, c.body)
		}
		row := e.waitCalls(c.header.Get("x-request-id"), 1)[0]
		if row.TaskID != "task-42" || row.RolloutID != ro || row.AttemptID != at {
			t.Fatalf("task id from the registered rollout not recorded: %+v", row)
		}
		if r := do(t, "POST", e.url+"/api/v1/rollouts/"+ro+"/rewards", `{"value":0.5,"sequence_id":1,"name":"format"}`); r.status != 200 {
			t.Fatalf("reward: %d %s", r.status, r.body)
		}
		if r := do(t, "POST", e.url+"/api/v1/rollouts/"+ro+"/rewards", `{"value":1}`); r.status != 200 {
			t.Fatalf("reward: %d %s", r.status, r.body)
		}
		if r := do(t, "POST", e.url+"/api/v1/rollouts/"+ro+"/rewards", `{"name":"x"}`); r.status != 400 {
			t.Fatalf("reward without value: %d %s", r.status, r.body)
		}
		if r := do(t, "POST", e.url+"/api/v1/rollouts/"+ro+"/rewards", `{"value":"high"}`); r.status != 400 {
			t.Fatalf("reward with a string value: %d %s", r.status, r.body)
		}
		if r := do(t, "POST", e.url+"/api/v1/rollouts/"+ro+"/status", `{"status":"succeeded"}`); r.status != 200 {
			t.Fatalf("status: %d %s", r.status, r.body)
		}
		if r := do(t, "POST", e.url+"/api/v1/rollouts/"+ro+"/status", `{"status":"great"}`); r.status != 400 {
			t.Fatalf("bad status accepted: %d", r.status)
		}
		g := do(t, "GET", e.url+"/api/v1/rollouts/"+ro, "")
		if g.status != 200 {
			t.Fatalf("get: %d %s", g.status, g.body)
		}
		j := gjson.ParseBytes(g.body)
		if j.Get("status").String() != "succeeded" || j.Get("task_id").String() != "task-42" ||
			j.Get("calls.#").Int() != 1 || j.Get("calls.0.sequence_id").Int() != 1 || j.Get("rewards.#").Int() != 2 ||
			j.Get("attempts.0.metadata.split").String() != "train" {
			t.Fatalf("GET rollout: %s", g.body)
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
		if r := do(t, "GET", e.url+"/api/v1/rollouts/nope", ""); r.status != 404 {
			t.Fatalf("unknown rollout: %d", r.status)
		}
		// SQL over the tables the API wrote.
		res, err := e.store.Query(context.Background(), "SELECT status FROM rollouts WHERE rollout_id = '"+ro+"' ORDER BY updated_unix_nano DESC LIMIT 1")
		if err != nil || len(res.Rows) != 1 || res.Rows[0][0] != "succeeded" {
			t.Fatalf("rollouts table: %+v %v", res, err)
		}
	})
}

// TestBackendsSwap replaces the routing table while a slow stream is in
// flight: the stream completes on the old replica, new calls use the new one
// and record its policy version.
func TestBackendsSwap(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	done := make(chan resp, 1)
	go func() {
		done <- do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "40")
	}()
	waitFor(t, "the slow stream to be in flight on mock-1", func() bool { return e.mock.ActiveStreams() == 1 })
	put := `{"backends":[{"model":"*","replicas":[{"name":"mock-2","url":"` + e.mockURL + `","kind":"vllm","policy_version":"v8"}]}]}`
	r := do(t, "PUT", e.url+"/api/v1/backends", put)
	if r.status != 200 || gjson.GetBytes(r.body, "backends.0.replicas.0.policy_version").String() != "v8" {
		t.Fatalf("PUT backends: %d %s", r.status, r.body)
	}
	if r := do(t, "PUT", e.url+"/api/v1/backends", `{"backends":[{"model":"x","replicas":[{"url":"ftp://nope"}]}]}`); r.status != 400 {
		t.Fatalf("invalid table accepted: %d %s", r.status, r.body)
	}
	slow := <-done
	if slow.status != 200 || !strings.Contains(string(slow.body), "[DONE]") {
		t.Fatalf("in-flight stream broken by the swap: %d %s", slow.status, slow.body)
	}
	old := e.waitCalls(slow.header.Get("x-request-id"), 1)[0]
	if old.PolicyVersion != "v7" || old.Backend != "mock-1" || old.Error != "" {
		t.Fatalf("in-flight call row: %+v", old)
	}
	nr := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
	row := e.waitCalls(nr.header.Get("x-request-id"), 1)[0]
	if row.PolicyVersion != "v8" || row.Backend != "mock-2" {
		t.Fatalf("new call row: %+v", row)
	}
	g := do(t, "GET", e.url+"/api/v1/backends", "")
	if gjson.GetBytes(g.body, "backends.0.replicas.0.name").String() != "mock-2" {
		t.Fatalf("GET backends: %s", g.body)
	}
}

// TestClientDisconnectMidStream hangs up during a slow stream: the backend
// request is cancelled and the row says the client disconnected.
func TestClientDisconnectMidStream(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		body := withStream(chatBody, `"stream":true`)
		fmt.Fprintf(conn, "POST /rollout/dc/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-mock-itl-ms: 100\r\nx-mock-tokens: 200\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		br := bufio.NewReader(conn)
		var span string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("reading response: %v", err)
			}
			if strings.HasPrefix(strings.ToLower(line), "x-request-id:") {
				span = strings.TrimSpace(line[len("x-request-id:"):])
			}
			if strings.Contains(line, "data: ") {
				break // first event arrived: hang up
			}
		}
		conn.Close()
		row := e.waitCalls(span, 1)[0]
		if !strings.Contains(row.Error, "client disconnected") {
			t.Fatalf("row error %q, want client disconnected", row.Error)
		}
		if row.CompletionTokens >= 200 {
			t.Fatalf("backend was not cancelled: %d tokens", row.CompletionTokens)
		}
		// The engine saw the cancellation: its open streams drain to zero.
		deadline := time.Now().Add(5 * time.Second)
		for e.mock.ActiveStreams() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("mock still streaming %d responses after the client left", e.mock.ActiveStreams())
			}
			time.Sleep(20 * time.Millisecond) // polling interval of this wait on ActiveStreams
		}
	})
}

var _ = context.Background
