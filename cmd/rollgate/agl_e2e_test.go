package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
)

// aglDo sends a request with AGL's key to the gateway and checks the status.
func aglDo(t *testing.T, method, url, body string, want int) gjson.Result {
	t.Helper()
	code, b := aglStatus(t, method, url, body)
	if code != want {
		t.Fatalf("%s %s: %d, want %d: %s", method, url, code, want, b)
	}
	return gjson.Parse(b)
}

// TestAGLRestart runs `rollgate serve --agl` as a process, plays AGL's
// trainer, controller and agent against it, kills it (SIGKILL) in the
// middle of a rollout and starts it again on the same files: the rollouts,
// their states and versions, the terminal log, the events (the answered
// model calls included, from the capture WAL) and the registered models are
// all there, and the rollout goes on.
func TestAGLRestart(t *testing.T) {
	ms, mockURL, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	addr, dir := freeAddr(t), t.TempDir()
	args := []string{"serve", "--listen", addr, "--db", filepath.Join(dir, "rollgate.db"), "--spool-dir", filepath.Join(dir, "spool"),
		"--upstream", mockURL, "--agl", "--agl-key", "agl-key", "--agl-model-name", "policy"}
	cmd, logs := start(t, addr, "/healthz", args...)
	base := "http://" + addr
	agent := base + "/proxy/rollout/r1/attempt/0/mode/train/openai/v1/chat/completions"
	chat := func(q string, stream bool) string {
		return `{"model":"auto","max_tokens":5,"stream":` + map[bool]string{true: "true", false: "false"}[stream] +
			`,"messages":[{"role":"user","content":"` + q + `"}]}`
	}

	aglDo(t, "POST", base+"/api/models", `[{"model":"policy","endpoint":"`+mockURL+`","version":4}]`, 201)
	aglDo(t, "POST", base+"/api/rollouts", `[{"input":{"data_id":"d1"},"rollout_id":"r1"},{"input":{"instance_id":"i2"},"rollout_id":"r2"}]`, 201)
	aglDo(t, "PATCH", base+"/api/rollouts/r1", `{"status":{"state":"running","last_attempt_id":"0"}}`, 200)
	aglDo(t, "PATCH", base+"/api/rollouts/r2", `{"status":{"state":"failed","error_message":"exit code 1"}}`, 200)
	aglDo(t, "POST", agent, chat("first", false), 200)
	aglDo(t, "POST", agent, chat("second", true), 200)
	aglDo(t, "POST", base+"/api/rollouts/r1/attempt/0/events", `{"event_type":"reward","data":{"value":0.25}}`, 200)

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	_, logs2 := start(t, addr, "/healthz", args...)
	_ = logs

	r := aglDo(t, "GET", base+"/api/rollouts/r1", "", 200)
	if r.Get("rollout.status.state").String() != "running" || r.Get("rollout.status.version").Int() != 2 || r.Get("attempts").Raw != `["0"]` {
		t.Fatalf("r1 after the restart: %s\n%s", r.Raw, logs2.String())
	}
	term := aglDo(t, "GET", base+"/api/rollouts/terminal", "", 200)
	if term.Get("total_terminal").Int() != 1 || term.Get("items.0.rollout_id").String() != "r2" || term.Get("items.0.data_id").String() != "i2" {
		t.Fatalf("terminal log after the restart: %s", term.Raw)
	}
	evs := aglDo(t, "GET", base+"/api/rollouts/r1/events?format=triplet", "", 200).Array()
	if len(evs) != 3 || evs[2].Get("data.value").Float() != 0.25 {
		t.Fatalf("events after the restart: %v\n%s", evs, logs2.String())
	}
	for _, e := range evs[:2] {
		if e.Get("event_type").String() != "model_request" || len(e.Get("data.response_token_ids").Array()) != 5 ||
			len(e.Get("data.prompt_token_ids").Array()) == 0 || e.Get("data.server.version").Int() != 4 {
			t.Fatalf("model_request after the restart: %s", e.Raw)
		}
	}
	// The models registered before the kill still route; the rollout finishes.
	aglDo(t, "POST", agent, chat("third", false), 200)
	aglDo(t, "PATCH", base+"/api/rollouts/r1", `{"status":{"state":"succeeded"}}`, 200)
	if n := len(aglDo(t, "GET", base+"/api/rollouts/r1/events?event_type=model_request", "", 200).Array()); n != 3 {
		t.Fatalf("model_request events: %d, want 3", n)
	}
	if term := aglDo(t, "GET", base+"/api/rollouts/terminal?after=1", "", 200); term.Get("items.0.rollout_id").String() != "r1" || term.Get("next_after").Int() != 2 {
		t.Fatalf("terminal log: %s", term.Raw)
	}
}

// TestAGLNeedsKeyWhenExposed: the AGL routes change the routing table and
// read every call, so on a non-loopback address (admin token set) serve
// refuses to mount them without a key, and names the flag.
func TestAGLNeedsKeyWhenExposed(t *testing.T) {
	cmd := exec.Command(binary, "serve", "--listen", "0.0.0.0:"+strings.Split(freeAddr(t), ":")[1], "--db", filepath.Join(t.TempDir(), "r.db"),
		"--upstream", "http://127.0.0.1:9/v1", "--agl", "--agl-model-name", "policy")
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN=admin-secret")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--agl-key") {
		t.Fatalf("serve --agl without a key on 0.0.0.0: %v\n%s", err, out)
	}
}
