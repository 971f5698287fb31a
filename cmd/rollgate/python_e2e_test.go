package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPythonPackage runs python/tests (the rollgate Python package) with
// Debian's /usr/bin/python3 against the real binary:
//
//  1. test_client against a live `rollgate serve` with an admin token: resources,
//     enqueue, dequeue, heartbeat, self-reported calls, rewards, statuses, the
//     completed-rollouts cursor, then POST /api/v1/bridge/batches and the lease
//     API (take, ack, counts) padded into verl tensors and checked against GRPO;
//  2. test_batch on `rollgate bridge --out batch.safetensors` (and the same batch
//     as JSONL) written from that store plus a group of one: shapes, dtypes, one
//     uid per row, advantages recomputed in Python from the scores per uid.
//
// python3 and numpy are required (scripts/test installs python3-torch, which
// brings numpy): the test fails, not skips, without them.
func TestPythonPackage(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("Debian's python3 is missing (apt-get install python3 python3-numpy python3-torch; scripts/test does): %v", err)
	}
	if out, err := exec.Command(py, "-c", "import numpy").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import numpy (apt-get install python3-numpy; scripts/test installs python3-torch, which brings it): %v\n%s", py, err, out)
	}
	pkg, err := filepath.Abs(filepath.Join("..", "..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	tests := filepath.Join(pkg, "tests")
	pyTest := func(module string, env ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, py, "-m", "unittest", "-v", module)
		cmd.Dir = tests
		cmd.Env = append(os.Environ(), append([]string{"PYTHONPATH=" + pkg, "PYTHONDONTWRITEBYTECODE=1", "ROLLGATE_TEST_REQUIRE=1"}, env...)...)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "\nOK") {
			t.Fatalf("python -m unittest %s: %v\n%s", module, err, out)
		}
		t.Logf("python -m unittest %s:\n%s", module, out)
		return string(out)
	}

	// 1. A live gateway with an admin token (the Python client sends it).
	const token = "py-admin-token"
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "rollgate.db")
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", db)
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN="+token)
	logs := startCmd(t, cmd, addr) // waits for /readyz
	base := "http://" + addr
	out := pyTest("test_client", "ROLLGATE_TEST_GATEWAY="+base, "ROLLGATE_TEST_TOKEN="+token)
	if !strings.Contains(out, "test_loop (test_client.GatewayE2ETest") {
		t.Fatalf("the gateway test did not run:\n%s", out)
	}

	// A group of one (task go-C): GRPO gives it mean 0, std 1 when kept.
	authPost := func(path, body string) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		b.ReadFrom(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("POST %s: %d %s", path, r.StatusCode, b.String())
		}
	}
	authPost("/api/v1/rollouts", `{"task_id":"go-C","rollout_id":"go-solo","attempt_id":"a"}`)
	authPost("/api/v1/rollouts/go-solo/calls", `{"attempt_id":"a","calls":[{"messages":[{"role":"user","content":"hi"}],"response":"yo",`+
		`"prompt_token_ids":[11,12,13,14],"response_token_ids":[21,22,23,24,25],"response_logprobs":[-0.5,-0.5,-0.5,-0.5,-0.5],"token_source":"engine","finish_reason":"stop"}]}`)
	authPost("/api/v1/rollouts/go-solo/rewards", `{"value":0.9,"attempt_id":"a"}`)
	authPost("/api/v1/rollouts/go-solo/status", `{"status":"succeeded","attempt_id":"a"}`)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve: %v\n%s", err, logs)
	}

	// 2. The bridge's files: 3 + 2 rollouts from test_client, 1 here.
	dir := t.TempDir()
	st, jl := filepath.Join(dir, "batch.safetensors"), filepath.Join(dir, "batch.jsonl")
	for _, o := range []string{st, jl} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"bridge", "--db", db, "--out", o, "--estimator", "grpo", "--air=false", "--min-group-size", "1"}, &stdout, &stderr); code != 0 {
			t.Fatalf("bridge --out %s: exit %d\n%s", o, code, stderr.String())
		}
	}
	expect := fmt.Sprintf(`{"samples":6,"groups":3,"advantages":{"go-solo":%v}}`, 0.9/(1+1e-6))
	out = pyTest("test_batch", "ROLLGATE_TEST_BATCH="+st, "ROLLGATE_TEST_JSONL="+jl, "ROLLGATE_TEST_BATCH_EXPECT="+expect)
	for _, name := range []string{"test_bridge_safetensors", "test_jsonl_pads_like_the_go_writer"} {
		if !strings.Contains(out, name+" (test_batch.BridgeFileTest."+name+") ... ok") {
			t.Fatalf("%s did not pass:\n%s", name, out)
		}
	}
}
