package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
	"gopkg.in/yaml.v3"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rollgate-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "rollgate")
	out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "building rollgate: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// start runs the binary and waits until addr answers GET path with 200.
func start(t *testing.T, addr, path string, args ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var last error
	testenv.WaitFor(t, 20*time.Second, func() string {
		return fmt.Sprintf("%v to come up on %s: %v\n%s", args, addr, last, logs.String())
	}, func() bool {
		r, err := http.Get("http://" + addr + path)
		if err != nil {
			last = err
			return false
		}
		r.Body.Close()
		last = fmt.Errorf("status %d", r.StatusCode)
		return r.StatusCode == 200
	})
	return cmd, logs
}

// syncBuffer is a bytes.Buffer safe for the child's output goroutine and the test.
type syncBuffer = testenv.SyncBuffer

func post(t *testing.T, url, body string) (int, string, http.Header) {
	t.Helper()
	r, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b), r.Header
}

func runCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(binary, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rollgate %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestFirstRun is the README walk-through: serve with no upstream starts the
// built-in mock, a curl-like call goes through, SIGTERM flushes, and
// rollgate sql shows the captured row with its token ids.
func TestFirstRun(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "rollgate.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	if !strings.Contains(logs.String(), "built-in mock") {
		t.Fatalf("serve without --upstream must say it started the mock:\n%s", logs)
	}
	status, body, h := post(t, "http://"+addr+"/rollout/demo/attempt/1/v1/chat/completions",
		`{"model":"mock-model","messages":[{"role":"user","content":"Hello!"}]}`)
	if status != 200 || !strings.Contains(body, `"choices"`) || h.Get("x-sequence-id") != "1" {
		t.Fatalf("call through the gateway: %d %s %v", status, body, h)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve exited with %v after SIGTERM\n%s", err, logs)
	}
	out := runCmd(t, "sql", "--db", db, "SELECT rollout_id, sequence_id, token_source, finish_reason, length(response_token_ids) > 2 AS has_ids FROM llm_calls")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 || !strings.Contains(out, "demo") || !strings.Contains(out, "engine") || !strings.Contains(out, "(1 row") {
		t.Fatalf("rollgate sql output:\n%s", out)
	}
	if !strings.Contains(lines[0], "rollout_id") || !strings.Contains(lines[0], "token_source") {
		t.Fatalf("header line: %q", lines[0])
	}
}

// TestConfigFileAndMockCommand runs "rollgate mock" and a gateway configured
// by a YAML file with two models, one per replica.
func TestConfigFileAndMockCommand(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr)
	addr := freeAddr(t)
	cfg := map[string]any{
		"listen": addr,
		"db":     filepath.Join(t.TempDir(), "r.db"),
		"backends": []map[string]any{
			{"model": "alpha", "replicas": []map[string]any{{"name": "m1", "url": "http://" + mockAddr + "/v1", "kind": "vllm", "policy_version": "p1"}}},
			{"model": "beta", "replicas": []map[string]any{{"name": "m2", "url": "http://" + mockAddr + "/v1", "kind": "auto"}}},
		},
	}
	b, _ := yaml.Marshal(cfg)
	path := filepath.Join(t.TempDir(), "rollgate.yaml")
	os.WriteFile(path, b, 0o600)
	_, logs := start(t, addr, "/readyz", "serve", "--config", path)
	for _, model := range []string{"alpha", "beta"} {
		status, body, _ := post(t, "http://"+addr+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`)
		if status != 200 || !strings.Contains(body, `"model":"`+model+`"`) {
			t.Fatalf("model %s: %d %s\n%s", model, status, body, logs)
		}
	}
	status, body, _ := post(t, "http://"+addr+"/v1/chat/completions", `{"model":"gamma","messages":[]}`)
	if status != 404 || !strings.Contains(body, "gamma") {
		t.Fatalf("unrouted model: %d %s", status, body)
	}
	r, err := http.Get("http://" + addr + "/api/v1/backends")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	got, _ := io.ReadAll(r.Body)
	if !strings.Contains(string(got), `"resolved_kind":"vllm"`) || !strings.Contains(string(got), `"policy_version":"p1"`) {
		t.Fatalf("auto kind not resolved to vllm or policy version missing: %s", got)
	}
}

// TestHelp checks that --help documents every command and serve's flags.
func TestHelp(t *testing.T) {
	out := runCmd(t, "--help")
	for _, w := range []string{"serve", "sql", "mock", "ROLLGATE_"} {
		if !strings.Contains(out, w) {
			t.Fatalf("--help lacks %q:\n%s", w, out)
		}
	}
	out = runCmd(t, "serve", "--help")
	for _, w := range []string{"--listen", "--upstream", "--upstream-kind", "--clickhouse", "--db", "--config", "--inject-logprobs"} {
		if !strings.Contains(out, strings.TrimPrefix(w, "-")) {
			t.Fatalf("serve --help lacks %s:\n%s", w, out)
		}
	}
	if c := exec.Command(binary, "frobnicate"); c.Run() == nil {
		t.Fatal("an unknown command must fail")
	}
	sc := bufio.NewScanner(strings.NewReader(runCmd(t, "mock", "--help")))
	n := 0
	for sc.Scan() {
		n++
	}
	if n < 5 {
		t.Fatal("mock --help too short")
	}
}

// TestLogprobsCapturedByDefault: serve asks the engine for the sampled
// tokens' logprobs by default, stores them, and the client's copy is what a
// direct call without logprobs returns; --inject-logprobs=false stops it.
func TestLogprobsCapturedByDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--inject-logprobs=false"}, false}} {
		addr := freeAddr(t)
		db := filepath.Join(t.TempDir(), "r.db")
		cmd, logs := start(t, addr, "/readyz", append([]string{"serve", "--listen", addr, "--db", db}, tc.args...)...)
		for _, stream := range []string{"false", "true"} {
			status, body, _ := post(t, "http://"+addr+"/rollout/lp/attempt/1/v1/chat/completions",
				`{"model":"mock-model","stream":`+stream+`,"messages":[{"role":"user","content":"Hello!"}]}`)
			if status != 200 || strings.Contains(body, `"logprob"`) {
				t.Fatalf("%v stream=%s: the client's copy has logprobs it did not ask for: %d %s", tc.args, stream, status, body)
			}
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("serve: %v\n%s", err, logs)
		}
		out := runCmd(t, "sql", "--db", db, "SELECT count(*) AS n FROM llm_calls WHERE length(response_logprobs) > 2")
		n := strings.TrimSpace(strings.Split(strings.TrimSpace(out), "\n")[2])
		if got := n == "2"; got != tc.want || (!tc.want && n != "0") {
			t.Fatalf("%v: %s rows with logprobs of 2, want logprobs stored: %v\n%s", tc.args, n, tc.want, out)
		}
	}
}

// asSampled returns an assistant message with each tool call's arguments
// in the compact form the engine sampled them: vLLM's hermes parser (and
// the mock, as it) re-writes a whole answer's arguments with json.dumps
// (", ", ": "), and an agent echoing that message back makes a prompt the
// template renders differently from the sampled ids, so a trajectory
// breaks there (the retokenisation token-in avoids). Tests about what the
// bridge and the viewer do with extending prompts send the sampled text.
func asSampled(t *testing.T, msg string) string {
	t.Helper()
	for i, c := range gjson.Get(msg, "tool_calls").Array() {
		var b bytes.Buffer
		if err := json.Compact(&b, []byte(c.Get("function.arguments").Str)); err != nil {
			t.Fatalf("tool call %d's arguments: %v", i, err)
		}
		var err error
		if msg, err = sjson.Set(msg, "tool_calls."+strconv.Itoa(i)+".function.arguments", b.String()); err != nil {
			t.Fatal(err)
		}
	}
	return msg
}
