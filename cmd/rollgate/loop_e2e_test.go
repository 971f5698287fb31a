package main

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// runnerDir is the example runner (Node.js, OpenAI Agents SDK).
var runnerDir = filepath.Join("..", "..", "examples", "runner")

// needRunner fails the test unless node and the runner's npm packages are
// there (scripts/test runs npm ci in examples/runner).
func needRunner(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: apt-get install nodejs npm (scripts/test does)")
	}
	if _, err := os.Stat(filepath.Join(runnerDir, "node_modules", "@openai", "agents")); err != nil {
		t.Fatalf("the example runner's packages are missing: (cd examples/runner && npm ci) — scripts/test does it: %v", err)
	}
	return node
}

// startNode runs a script of the example runner and returns it with its output.
func startNode(t *testing.T, node string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(node, args...)
	cmd.Dir = runnerDir
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGCONT); cmd.Process.Kill(); cmd.Wait() })
	return cmd, out
}

func getJSON(t *testing.T, url string) gjson.Result {
	t.Helper()
	r, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(r.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
	}
	return gjson.Parse(b.String())
}

func waitUntil(t testing.TB, what string, limit time.Duration, f func() bool) {
	t.Helper()
	testenv.WaitFor(t, limit, func() string { return what }, f)
}

// TestTrainingLoopWithRunners closes the loop with the real binary, the
// example runner (an unmodified OpenAI Agents SDK agent with a tool) and the
// embedded store: enqueue → runners (two at once) → rewards → bridge output;
// then a runner killed mid-rollout and a hung runner: their leases expire and
// another runner completes the task as a new attempt.
func TestTrainingLoopWithRunners(t *testing.T) {
	node := needRunner(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "rg.db")
	addr := freeAddr(t)
	gw := "http://" + addr
	start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--log-level", "warn")

	t.Run("loop", func(t *testing.T) {
		_, r1 := startNode(t, node, "runner.mjs", "--gateway", gw, "--worker", "runner-1", "--idle-exit-s", "3")
		_, r2 := startNode(t, node, "runner.mjs", "--gateway", gw, "--worker", "runner-2", "--idle-exit-s", "3")
		out := filepath.Join(dir, "batch.jsonl")
		alg := exec.Command(node, "algorithm.mjs", "--gateway", gw, "--group", "3", "--after", "0",
			"--bridge", binary+" bridge --db "+db+" --estimator grpo", "--out", out, "--timeout-s", "60")
		alg.Dir = runnerDir
		b, err := alg.CombinedOutput()
		if err != nil {
			t.Fatalf("algorithm: %v\n%s\nrunner-1:\n%s\nrunner-2:\n%s", err, b, r1.String(), r2.String())
		}
		if !strings.Contains(string(b), `all rollouts done: {"succeeded":6}`) || !strings.Contains(string(b), "cursor 6") {
			t.Fatalf("algorithm output:\n%s", b)
		}
		// Two runners at once never got the same rollout.
		leased := map[string]string{}
		for _, log := range []struct{ name, out string }{{"runner-1", r1.String()}, {"runner-2", r2.String()}} {
			for _, line := range strings.Split(log.out, "\n") {
				if f := strings.Fields(line); len(f) > 2 && f[1] == "leased" {
					if prev, dup := leased[f[2]]; dup {
						t.Errorf("%s leased by %s and %s", f[2], prev, log.name)
					}
					leased[f[2]] = log.name
				}
			}
		}
		if len(leased) != 6 {
			t.Fatalf("%d rollouts leased, want 6:\n%s\n%s", len(leased), r1.String(), r2.String())
		}
		// The batch: two calls per rollout (the tool call, then the answer), engine ids, rewards, GRPO groups.
		f, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		n, groups := 0, map[string]int{}
		for sc.Scan() {
			var s map[string]any
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatal(err)
			}
			j := gjson.ParseBytes(sc.Bytes())
			if j.Get("prompt_ids.#").Int() == 0 || j.Get("response_ids.#").Int() == 0 || !j.Get("advantage").Exists() {
				t.Fatalf("sample without ids or advantage: %.300s", sc.Text())
			}
			if _, ok := leased[j.Get("rollout_id").String()]; !ok {
				t.Fatalf("sample of a rollout no runner leased: %s", j.Get("rollout_id"))
			}
			groups[j.Get("uid").String()]++
			n++
		}
		if n != 12 || len(groups) != 2 {
			t.Fatalf("%d samples in groups %v, want 12 in 2", n, groups)
		}
	})

	t.Run("loop on ClickHouse", func(t *testing.T) {
		// Captured calls in ClickHouse, the queue in the embedded SQLite file.
		chDSN := os.Getenv("ROLLGATE_TEST_CLICKHOUSE_DSN")
		if chDSN == "" {
			t.Fatal("ROLLGATE_TEST_CLICKHOUSE_DSN is not set (scripts/test starts a ClickHouse server)")
		}
		chDSN = testenv.FreshDatabase(chDSN, "loop_e2e_"+strconv.FormatInt(time.Now().UnixNano(), 10))
		qdb := filepath.Join(dir, "queue-ch.db")
		addr := freeAddr(t)
		gw := "http://" + addr
		start(t, addr, "/readyz", "serve", "--listen", addr, "--clickhouse", chDSN, "--db", qdb, "--log-level", "warn")
		_, r1 := startNode(t, node, "runner.mjs", "--gateway", gw, "--worker", "ch-runner", "--idle-exit-s", "3")
		out := filepath.Join(dir, "batch-ch.jsonl")
		alg := exec.Command(node, "algorithm.mjs", "--gateway", gw, "--group", "2", "--after", "0",
			"--bridge", binary+" bridge --clickhouse "+chDSN+" --db "+qdb+" --estimator grpo", "--out", out, "--timeout-s", "60")
		alg.Dir = runnerDir
		b, err := alg.CombinedOutput()
		if err != nil || !strings.Contains(string(b), `all rollouts done: {"succeeded":4}`) || !strings.Contains(string(b), "8 samples in 2 groups") {
			t.Fatalf("algorithm on ClickHouse: %v\n%s\nrunner:\n%s", err, b, r1.String())
		}
	})

	// slowTask enqueues one task whose tool takes 4 s, with a 1 s lease.
	slowTask := func(t *testing.T, taskID string) string {
		t.Helper()
		status, body, _ := post(t, gw+"/api/v1/tasks", `{"task_id":"`+taskID+`","input":{"a":1,"b":2,"tool_delay_ms":4000},"lease_s":1,"max_attempts":2}`)
		if status != 200 {
			t.Fatalf("enqueue: %d %s", status, body)
		}
		return gjson.Get(body, "rollout_ids.0").String()
	}
	// interrupted runs the first runner until its first model call is
	// stored, applies sig to it, and lets a second runner finish the task.
	interrupted := func(t *testing.T, taskID string, sig syscall.Signal) (*exec.Cmd, *syncBuffer) {
		ro := slowTask(t, taskID)
		first, firstOut := startNode(t, node, "runner.mjs", "--gateway", gw, "--worker", "first", "--max-tasks", "1")
		waitUntil(t, "the first runner's model call", 30*time.Second, func() bool {
			return getJSON(t, gw+"/api/v1/rollouts/"+ro).Get("calls.#").Int() >= 1
		})
		if err := first.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		_, secondOut := startNode(t, node, "runner.mjs", "--gateway", gw, "--worker", "second", "--max-tasks", "1")
		var r gjson.Result
		waitUntil(t, "the second runner to complete the task", 40*time.Second, func() bool {
			r = getJSON(t, gw+"/api/v1/rollouts/"+ro)
			return r.Get("queue.status").String() == "succeeded"
		})
		if r.Get("queue.attempt_no").Int() != 2 || r.Get("queue.attempts.0.status").String() != "expired" ||
			r.Get("queue.attempts.0.worker_id").String() != "first" || r.Get("queue.attempts.1.status").String() != "succeeded" ||
			r.Get("queue.attempts.1.worker_id").String() != "second" {
			t.Fatalf("attempts: %s\nfirst:\n%s\nsecond:\n%s", r.Get("queue").Raw, firstOut.String(), secondOut.String())
		}
		// Each attempt's calls are its own, sequence ids from 1.
		a1, a2 := r.Get("queue.attempts.0.attempt_id").String(), r.Get("queue.attempts.1.attempt_id").String()
		for _, a := range []string{a1, a2} {
			if n := r.Get(`calls.#(attempt_id=="` + a + `")#.sequence_id`); !strings.HasPrefix(n.Raw, "[1") {
				t.Fatalf("calls of attempt %s: %s", a, r.Get("calls").Raw)
			}
		}
		return first, firstOut
	}

	t.Run("killed runner is retried", func(t *testing.T) {
		interrupted(t, "killed", syscall.SIGKILL)
	})

	t.Run("hung runner loses its lease", func(t *testing.T) {
		first, firstOut := interrupted(t, "hung", syscall.SIGSTOP)
		if err := first.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		// Woken up, the hung runner learns it lost the lease and reports nothing.
		waitUntil(t, "the woken runner to notice", 20*time.Second, func() bool {
			return strings.Contains(firstOut.String(), "lost (409)")
		})
	})
}
