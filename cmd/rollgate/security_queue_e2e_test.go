package main

// Security drills on the training loop's routes against the real gateway
// process (issue 36, items 4, 9, 10, 11): numbers out of range, a task that
// cannot be served, duplicate and finished rollouts, ids on every route,
// and leases that belong to the worker they were handed to. The queue's
// drills run on the default SQLite queue and on PostgreSQL (--queue).

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// queueGateway is a serve process and a handle on its task queue's database
// (for planting rows a release before this one could store).
type queueGateway struct {
	base string  // http://addr
	db   *sql.DB // the queue's database
	q    func(query string) string
}

// eachQueue runs f against `rollgate serve` on the default SQLite queue and
// on a PostgreSQL queue (--queue), each fresh; extra are more serve flags.
func eachQueue(t *testing.T, f func(t *testing.T, g *queueGateway), extra ...string) {
	pg, stopPG, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopPG)
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			addr := freeAddr(t)
			dbPath := filepath.Join(t.TempDir(), "r.db")
			args := append([]string{"serve", "--listen", addr, "--db", dbPath}, extra...)
			g := &queueGateway{base: "http://" + addr, q: func(s string) string { return s }}
			if kind == "postgres" {
				dsn, err := testenv.FreshPostgresDatabase(pg, t.Name())
				if err != nil {
					t.Fatal(err)
				}
				args = append(args, "--queue", dsn)
				if g.db, err = sql.Open("pgx", dsn); err != nil {
					t.Fatal(err)
				}
				g.q = func(s string) string { // ? placeholders, in order
					for i := 1; strings.Contains(s, "?"); i++ {
						s = strings.Replace(s, "?", fmt.Sprint("$", i), 1)
					}
					return s
				}
			}
			start(t, addr, "/readyz", args...)
			if kind == "sqlite" {
				var err error
				if g.db, err = sql.Open("sqlite", "file:"+dbPath+"?_busy_timeout=10000"); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() { g.db.Close() })
			f(t, g)
		})
	}
}

// qDo sends a JSON request (Content-Type: application/json) and returns the
// status and body.
func qDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// qExpect sends a request and reports (t.Errorf) an answer whose status is
// not want or whose body lacks any of the texts; it returns the body.
func qExpect(t *testing.T, method, url, body string, want int, texts ...string) string {
	t.Helper()
	got, b := qDo(t, method, url, body)
	if got != want {
		t.Errorf("%s %s %s: %d, want %d: %s", method, url, truncateForLog(body), got, want, truncateForLog(b))
		return b
	}
	for _, s := range texts {
		if !strings.Contains(b, s) {
			t.Errorf("%s %s %s: the answer does not name %q: %s", method, url, truncateForLog(body), s, b)
		}
	}
	return b
}

// TestQueueOneTaskNeverBlocksTheQueue: numbers out of range are refused
// with a 400 naming the field and its range (a lease of 8e9 s overflowed
// the lease's expiry, 1e10 s wrapped to a negative lease); a queued row that
// cannot be leased (as an older release stored for lease_s 8e9) is moved
// aside and the next task is served, not a 503 on every dequeue for ever.
func TestQueueOneTaskNeverBlocksTheQueue(t *testing.T) {
	eachQueue(t, func(t *testing.T, g *queueGateway) {
		api := g.base + "/api/v1"
		for _, c := range []struct{ body, field string }{
			{`{"task_id":"x","input":1,"lease_s":8e9}`, "lease_s 8e+09 is out of range"},
			{`{"task_id":"x","input":1,"lease_s":1e10}`, "lease_s 1e+10 is out of range"},
			{`{"task_id":"x","input":1,"lease_s":-1}`, "lease_s -1 is out of range"},
			{`{"task_id":"x","input":1,"timeout_s":8e9}`, "timeout_s 8e+09 is out of range"},
			{`{"task_id":"x","input":1,"max_attempts":-1}`, "max_attempts -1 is out of range"},
			{`{"task_id":"x","input":1,"max_attempts":1000000}`, "max_attempts 1000000 is out of range"},
		} {
			qExpect(t, "POST", api+"/tasks", c.body, 400, c.field)
		}
		qExpect(t, "GET", api+"/rollouts?limit=10001", "", 400, "limit 10001 is out of range")
		qExpect(t, "GET", api+"/rollouts?wait_s=601", "", 400, "wait_s 601 is out of range")
		qExpect(t, "POST", api+"/rollouts/ro-x/rewards", `{"value":1,"sequence_id":18446744073709551615}`, 400, "sequence_id")

		// A row as lease_s 8e9 left it: leasing it overflows.
		qExpect(t, "POST", api+"/tasks", `{"task_id":"legacy","rollout_id":"legacy-1","input":1}`, 200)
		if _, err := g.db.Exec(g.q(`UPDATE rg_tasks SET lease_ns = 8000000000000000000 WHERE rollout_id = ?`), "legacy-1"); err != nil {
			t.Fatal(err)
		}
		qExpect(t, "POST", api+"/tasks", `{"task_id":"good","rollout_id":"good-1","input":2}`, 200)
		for i := 0; i < 2; i++ { // the bad row does not come back
			status, b := qDo(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w1"}`)
			want := 200
			if i == 1 {
				want = 204
			}
			if status != want || (i == 0 && gjson.Get(b, "rollout_id").String() != "good-1") {
				t.Fatalf("dequeue %d after an unservable row: %d %s, want %d (good-1 first)", i, status, b, want)
			}
		}
		var n int
		if err := g.db.QueryRow(g.q(`SELECT COUNT(*) FROM rg_tasks_aside WHERE rollout_id = ?`), "legacy-1").Scan(&n); err != nil || n != 1 {
			t.Fatalf("the unservable row in rg_tasks_aside: %d %v", n, err)
		}
	})
}

// TestDeleteQueuedTask: DELETE /api/v1/tasks/{id} removes a task still in
// the queue; 409 for a leased one, 404 for an unknown one.
func TestDeleteQueuedTask(t *testing.T) {
	eachQueue(t, func(t *testing.T, g *queueGateway) {
		api := g.base + "/api/v1"
		qExpect(t, "POST", api+"/tasks", `[{"task_id":"a","rollout_id":"del-a","input":1},{"task_id":"b","rollout_id":"del-b","input":2}]`, 200)
		qExpect(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w1"}`, 200, `"del-a"`)
		qExpect(t, "DELETE", api+"/tasks/del-a", "", 409, "is running")
		qExpect(t, "DELETE", api+"/tasks/del-b", "", 200, `"deleted":true`)
		qExpect(t, "DELETE", api+"/tasks/del-b", "", 404)
		qExpect(t, "DELETE", api+"/tasks/nope", "", 404)
		qExpect(t, "DELETE", api+"/tasks/bad%00id", "", 400, "invalid rollout id")
		qExpect(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w1"}`, 204)
		qExpect(t, "GET", api+"/rollouts/del-b", "", 200, `"status":"cancelled"`)
	})
}

// TestFinishedRolloutsStayFinished: a duplicate task rollout id is 409 (was
// 503); registering an existing rollout is 409 unless it repeats the
// registration of a running one (a finished rollout was resurrected, and
// AGL's terminal log listed it twice); a status out of a final one is 409
// naming it (a "running" dropped the rollout from training).
func TestFinishedRolloutsStayFinished(t *testing.T) {
	eachQueue(t, func(t *testing.T, g *queueGateway) {
		api := g.base + "/api/v1"
		qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"dup-1","input":1}`, 200)
		qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"dup-1","input":1}`, 409, "dup-1", "exists")
		qExpect(t, "POST", api+"/tasks", `[{"task_id":"t","rollout_id":"dup-2"},{"task_id":"t","rollout_id":"dup-2"}]`, 409, "task 1")
		qExpect(t, "POST", api+"/rollouts", `{"task_id":"dup-1","rollout_id":"dup-1","attempt_id":"a1"}`, 409, "queued")

		reg := `{"task_id":"t","rollout_id":"reg-1","attempt_id":"a1"}`
		qExpect(t, "POST", api+"/rollouts", reg, 200)
		qExpect(t, "POST", api+"/rollouts", reg, 200) // an identical retry
		qExpect(t, "POST", api+"/rollouts", `{"task_id":"t","rollout_id":"reg-1","attempt_id":"a2"}`, 409, "running")
		qExpect(t, "POST", api+"/rollouts/reg-1/status", `{"status":"succeeded","attempt_id":"a1"}`, 200)
		qExpect(t, "POST", api+"/rollouts", reg, 409, "succeeded")
		qExpect(t, "POST", api+"/rollouts", `{"task_id":"t","rollout_id":"reg-1","attempt_id":"a2"}`, 409, "succeeded")
		qExpect(t, "POST", api+"/rollouts/reg-1/status", `{"status":"running","attempt_id":"a1"}`, 409, "is succeeded")
		qExpect(t, "POST", api+"/rollouts/reg-1/status", `{"status":"running"}`, 409, "is succeeded")
		qExpect(t, "POST", api+"/rollouts/reg-1/status", `{"status":"failed","attempt_id":"a2"}`, 409, "is succeeded")
		qExpect(t, "GET", api+"/rollouts/reg-1", "", 200, `"status":"succeeded"`)
		page := qExpect(t, "GET", g.base+"/api/rollouts/terminal?after=0&limit=100", "", 200)
		if n := strings.Count(page, `"rollout_id":"reg-1"`); n != 1 {
			t.Errorf("AGL's terminal log lists reg-1 %d times, want once: %s", n, page)
		}
		done := qExpect(t, "GET", api+"/rollouts?status=completed", "", 200)
		if n := strings.Count(done, `"rollout_id":"reg-1"`); n != 1 || gjson.Get(done, `rollouts.#(rollout_id=="reg-1").status`).String() != "succeeded" {
			t.Errorf("completed rollouts: reg-1 %d times: %s", n, done)
		}
		// A rollout that is not the queue's (calls attributed by path only)
		// keeps a final status too.
		qExpect(t, "POST", api+"/rollouts/loose-1/status", `{"status":"failed","attempt_id":"a"}`, 200)
		qExpect(t, "POST", api+"/rollouts/loose-1/status", `{"status":"running","attempt_id":"a"}`, 409, "is failed")
	}, "--agl", "--agl-model-name", "m")
}

// TestIDsFollowTheContractOnEveryRoute: a rollout, attempt, task or worker
// id outside contract section 1.1 is refused on every route of /api/v1 and
// AGL's /api (a NUL in a task's rollout_id made GET /ui answer 503 on
// SQLite while that rollout was among the newest).
func TestIDsFollowTheContractOnEveryRoute(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "r.db")
	start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--agl", "--agl-model-name", "m")
	base := "http://" + addr
	api := base + "/api/v1"
	idMsg := "A-Z a-z 0-9"
	qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"nul\u0000id","input":1}`, 400, "task 0: rollout_id", idMsg)
	qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"sp ace","input":1}`, 400, "rollout_id")
	qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"`+strings.Repeat("r", 129)+`","input":1}`, 400, "rollout_id")
	qExpect(t, "POST", api+"/tasks", `{"task_id":"line\nbreak","input":1}`, 400, "task_id")
	qExpect(t, "GET", base+"/ui", "", 200)
	qExpect(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w\u0000"}`, 400, "worker_id", idMsg)

	qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"ok-1","input":1}`, 200)
	lease := qExpect(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w1"}`, 200)
	at := gjson.Get(lease, "attempt_id").String()
	qExpect(t, "POST", api+"/rollouts/ok-1/heartbeat", `{"attempt_id":"a\u0000b","worker_id":"w1"}`, 400, "attempt_id")
	qExpect(t, "POST", api+"/rollouts/ok-1/heartbeat", `{"attempt_id":"`+at+`","worker_id":"w 1"}`, 400, "worker_id")
	qExpect(t, "POST", api+"/rollouts/ok-1/status", `{"status":"succeeded","attempt_id":"`+at+`","worker_id":"w\r\n1"}`, 400, "worker_id")
	qExpect(t, "POST", api+"/rollouts/ok-1/calls", `{"attempt_id":"a\u0000","calls":[{"messages":[],"response":"x"}]}`, 400, "attempt_id")
	qExpect(t, "POST", api+"/rollouts/ok-1/calls", `[{"attempt_id":"a/b","messages":[],"response":"x"}]`, 400, "call 0: attempt_id")
	qExpect(t, "POST", api+"/rollouts/ok-1/rewards", `{"value":1,"name":"a\u0000"}`, 400, "name")
	qExpect(t, "GET", api+"/rollouts?ids=ok-1,bad%00id", "", 400, "ids")
	qExpect(t, "GET", api+"/rollouts/bad%00id", "", 400, "invalid rollout id")

	// Agent Lightning's surface: ids in paths and last_attempt_id.
	qExpect(t, "POST", base+"/api/rollouts", `[{"input":{"q":1},"rollout_id":"agl-1"}]`, 201)
	qExpect(t, "POST", base+"/api/rollouts/agl-1/attempt/a%00b/events", `{"event_type":"note","data":{}}`, 422, "attempt_id")
	qExpect(t, "POST", base+"/api/rollouts/agl-1/attempt/a%0Ab/events", `{"event_type":"note","data":{}}`, 422, "attempt_id")
	qExpect(t, "GET", base+"/api/rollouts/bad%00id", "", 422, "rollout_id")
	qExpect(t, "PATCH", base+"/api/rollouts/agl-1", `{"status":{"state":"running","last_attempt_id":"a\u0000"}}`, 422, "last_attempt_id")
	qExpect(t, "PATCH", base+"/api/rollouts/agl-1", `{"status":{"state":"running","last_attempt_id":"0"}}`, 200)
	qExpect(t, "POST", base+"/api/rollouts/agl-1/attempt/0/events", `{"event_type":"reward","data":{"value":1e999}}`, 422, "finite")
	qExpect(t, "POST", base+"/api/rollouts/agl-1/attempt/0/events", `{"event_type":"reward","data":{"value":0.5}}`, 200)
	qExpect(t, "POST", base+"/proxy/pause", `{"retry_after_seconds":100000000000}`, 422, "retry_after_seconds")
	qExpect(t, "POST", base+"/proxy/pause", `{"retry_after_seconds":-5}`, 422, "retry_after_seconds")
	if n := sqlCount(t, db, `SELECT count(*) FROM rg_events WHERE attempt_id <> '0'`); n != 0 {
		t.Errorf("%d events stored under a malformed attempt id", n)
	}
	qExpect(t, "GET", base+"/ui", "", 200)
}

// TestLeasesBelongToTheirWorker: heartbeats and status reports on a leased
// attempt name the attempt and the worker it was leased to (403 naming both
// workers, 409 for another attempt, 400 without the attempt); a registered
// rollout, which holds no lease, still takes a status without them.
func TestLeasesBelongToTheirWorker(t *testing.T) {
	eachQueue(t, func(t *testing.T, g *queueGateway) {
		api := g.base + "/api/v1"
		qExpect(t, "POST", api+"/tasks", `{"task_id":"t","rollout_id":"own-1","input":1,"max_attempts":2}`, 200)
		at := gjson.Get(qExpect(t, "POST", api+"/tasks/dequeue", `{"worker_id":"w1"}`, 200), "attempt_id").String()
		hb := func(body string) string { return strings.ReplaceAll(body, "AT", at) }
		qExpect(t, "POST", api+"/rollouts/own-1/heartbeat", hb(`{"attempt_id":"AT"}`), 403, `worker_id \"w1\"`)
		qExpect(t, "POST", api+"/rollouts/own-1/heartbeat", hb(`{"attempt_id":"AT","worker_id":"w2"}`), 403, `worker_id \"w1\"`, `names \"w2\"`)
		qExpect(t, "POST", api+"/rollouts/own-1/heartbeat", `{"attempt_id":"at-other","worker_id":"w1"}`, 409, "at-other")
		qExpect(t, "POST", api+"/rollouts/own-1/heartbeat", `{"worker_id":"w1"}`, 400, "attempt_id")
		qExpect(t, "POST", api+"/rollouts/own-1/heartbeat", hb(`{"attempt_id":"AT","worker_id":"w1"}`), 200, "lease_expires_unix_nano")

		qExpect(t, "POST", api+"/rollouts/own-1/status", `{"status":"failed"}`, 400, "attempt_id")
		qExpect(t, "POST", api+"/rollouts/own-1/status", `{"status":"succeeded","worker_id":"w1"}`, 400, "attempt_id")
		qExpect(t, "POST", api+"/rollouts/own-1/status", hb(`{"status":"succeeded","attempt_id":"AT"}`), 403, `worker_id \"w1\"`)
		qExpect(t, "POST", api+"/rollouts/own-1/status", hb(`{"status":"succeeded","attempt_id":"AT","worker_id":"w2"}`), 403, `names \"w2\"`)
		qExpect(t, "POST", api+"/rollouts/own-1/status", hb(`{"status":"running","attempt_id":"AT","worker_id":"w2"}`), 403, `names \"w2\"`)
		qExpect(t, "GET", api+"/rollouts/own-1", "", 200, `"status":"running"`, `"attempt_no":1`)
		qExpect(t, "POST", api+"/rollouts/own-1/status", hb(`{"status":"succeeded","attempt_id":"AT","worker_id":"w1"}`), 200, `"status":"succeeded"`)

		// A registered rollout holds no lease: its runner may leave the ids out.
		qExpect(t, "POST", api+"/rollouts", `{"task_id":"t","rollout_id":"reg-own","attempt_id":"a1"}`, 200)
		qExpect(t, "POST", api+"/rollouts/reg-own/status", `{"status":"succeeded"}`, 200, `"status":"succeeded"`)
	})
}
