package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

const mathCall = `{"model":"mock-model","messages":[{"role":"user","content":"What is 2+2?"}]}`

// callWith posts a chat completion to url with the given headers.
func callWith(t *testing.T, url string, headers ...string) (int, string) {
	t.Helper()
	r := gatewaytest.Do(t, "POST", url, mathCall, headers...)
	return r.Status, string(r.Body)
}

// getPage fetches url and returns its status and body.
func getPage(t *testing.T, url string) (int, string) {
	t.Helper()
	r := gatewaytest.Do(t, "GET", url, "")
	return r.Status, string(r.Body)
}

// TestFirstHourNaturalPath (issue 30, item 2): four rollouts of one task
// called on the per-rollout base URL with x-task-id, one reward each posted
// as the README shows it (no attempt_id), and `rollgate bridge --db DB --out
// batch.safetensors` with no other flag: every call of the four is in the
// batch, in one group (the task's). What is left out is named with what
// changes it: a rollout without x-task-id (a group of one: small_group,
// naming x-task-id), an unregistered rollout without a reward (unfinished),
// a call without a rollout (unattributed, shown in the viewer as
// "(unattributed)" with a working link). A reward for a misspelt rollout is
// 404 naming it, and the README's reward shows in the viewer. The batch is
// written 0666 less the umask.
func TestFirstHourNaturalPath(t *testing.T) {
	addr := freeAddr(t)
	dir := t.TempDir()
	db := filepath.Join(dir, "rollgate.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	base := "http://" + addr
	for i, ro := range []string{"n1", "n2", "n3", "n4", "solo", "n5"} {
		headers := []string{"x-task-id", "math-1"}
		if ro == "solo" {
			headers = nil
		}
		for turn := 0; turn < 2; turn++ {
			if st, body := callWith(t, base+"/rollout/"+ro+"/attempt/1/v1/chat/completions", headers...); st != 200 {
				t.Fatalf("call %s: %d %s", ro, st, body)
			}
		}
		if ro == "n5" {
			continue // still running: no reward yet
		}
		// Right after the calls, as a runner would: the rollout is known.
		if st, body, _ := post(t, base+"/api/v1/rollouts/"+ro+"/rewards", fmt.Sprintf(`{"value": %d}`, i)); st != 200 {
			t.Fatalf("reward %s: %d %s", ro, st, body)
		}
	}
	if st, body := callWith(t, base+"/v1/chat/completions"); st != 200 {
		t.Fatalf("unattributed call (captured by default): %d %s", st, body)
	}
	st, body, _ := post(t, base+"/api/v1/rollouts/n1-typo/rewards", `{"value": 1}`)
	if st != 404 || !strings.Contains(body, "rollout n1-typo not found") {
		t.Errorf("reward for a misspelt rollout: %d %s, want 404 naming it", st, body)
	}
	waitUntil(t, "the unattributed call in the viewer", 10*time.Second, func() bool {
		_, page := getPage(t, base+"/ui")
		return strings.Contains(page, ">(unattributed)</a>")
	})
	_, page := getPage(t, base+"/ui")
	if !strings.Contains(page, `href="/ui/rollouts/%28unattributed%29"`) {
		t.Errorf("the (unattributed) row links elsewhere: %.3000s", page)
	}
	if st, page := getPage(t, base+"/ui/rollouts/%28unattributed%29"); st != 200 || !strings.Contains(page, "What is 2") {
		t.Errorf("the unattributed calls' page: %d %.500s", st, page)
	}
	_, page = getPage(t, base+"/ui/rollouts/n2")
	if i := strings.Index(page, `id="episode-rewards"`); i < 0 || !strings.Contains(page[i:i+200], "primary = 1") {
		t.Errorf("n2's reward posted without attempt_id is not shown: %.300s", page[max(i, 0):])
	}
	if !strings.Contains(logs.String(), "a call named no rollout") {
		t.Errorf("the first unattributed call was not logged:\n%s", logs)
	}
	stop(t, cmd, logs)

	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	out := filepath.Join(dir, "batch.safetensors")
	bridge := exec.Command(binary, "bridge", "--db", db, "--out", out)
	summary, err := bridge.CombinedOutput()
	if err != nil {
		t.Fatalf("rollgate bridge: %v\n%s", err, summary)
	}
	s := string(summary)
	for _, want := range []string{
		"8 samples in 1 groups from 6 attempts",
		"excluded: small_group=2 (groups of fewer than 2 rollouts: send the same x-task-id header",
		"excluded: unfinished=1 (rollouts never registered and without an episode reward",
		"not selected: unattributed_calls=1 (calls without a rollout",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("bridge summary lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "excluded: none") {
		t.Errorf("bridge summary says excluded: none:\n%s", s)
	}
	_, _, meta := readBatch(t, out)
	uids := gjson.Parse(meta["uid"]).Array()
	if len(uids) != 8 {
		t.Fatalf("batch uids %s, want 8 rows", meta["uid"])
	}
	for _, u := range uids {
		if !strings.HasPrefix(u.String(), "math-1") {
			t.Errorf("a sample's group is %q, want the task math-1's", u.String())
		}
	}
	fi, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("batch mode %v, want 0644 (0666 less the umask 022)", fi.Mode().Perm())
	}

	// Nothing captured: the summary says where calls should come from.
	empty := exec.Command(binary, "bridge", "--db", filepath.Join(dir, "empty.db"), "--out", filepath.Join(dir, "e.jsonl"))
	summary, err = empty.CombinedOutput()
	if err != nil || !strings.Contains(string(summary), "no sample: the store holds no call of any rollout") || strings.Contains(string(summary), "excluded: none") {
		t.Errorf("bridge on an empty store: %v\n%s", err, summary)
	}
	help, _ := exec.Command(binary, "bridge", "--help").CombinedOutput()
	if !strings.Contains(string(help), `(default "succeeded,failed,unregistered")`) || strings.Contains(string(help), "latest succeeded by default") {
		t.Errorf("bridge --help does not state the default statuses:\n%s", help)
	}
}

// TestFirstHourUpstreamsAndUnattributed (issue 30, item 3): serve checks
// each upstream at start and logs what it serves; an unreachable one is
// named by /readyz (status unchanged) and in the log; a URL without /v1
// gets a hint, and the engine's bare 404 to a call is logged and named in
// the row's error. --unattributed refuse answers a call without a rollout
// 400 showing the URL form; an unknown policy stops serve with exit 2.
func TestFirstHourUpstreamsAndUnattributed(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr)

	// The engine's real base URL: its models are logged.
	addr := freeAddr(t)
	_, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "a.db"),
		"--upstream", "http://"+mockAddr+"/v1", "--unattributed", "refuse")
	waitUntil(t, "the upstream check in the log", 10*time.Second, func() bool { return strings.Contains(logs.String(), "upstream answered") })
	if !strings.Contains(logs.String(), "mock-model") {
		t.Errorf("the start check does not log the models served:\n%s", logs)
	}
	st, body := callWith(t, "http://"+addr+"/v1/chat/completions")
	if st != 400 || !strings.Contains(body, "/rollout/{rollout_id}/attempt/{attempt_id}/v1") || !strings.Contains(body, `"type":"invalid_request_error"`) {
		t.Errorf("--unattributed refuse: %d %s, want an OpenAI-style 400 showing the URL form", st, body)
	}
	if st, body := callWith(t, "http://"+addr+"/rollout/r1/attempt/1/v1/chat/completions"); st != 200 {
		t.Errorf("--unattributed refuse: an attributed call %d %s", st, body)
	}

	// Unreachable: ready (the status code is the contract's), but named.
	dead := freeAddr(t)
	addr = freeAddr(t)
	_, logs = start(t, addr, "/readyz", "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "b.db"),
		"--upstream", "http://"+dead+"/v1", "--health-interval", "-1s")
	waitUntil(t, "/readyz to name the unreachable upstream", 10*time.Second, func() bool {
		st, b := readyzBody(t, addr)
		return st == 200 && b.Get("upstreams_unreachable.0").String() == "http://"+dead+"/v1"
	})
	// The start check marks the replica (what /readyz reads) before it logs
	// its results: the line may follow /readyz by a moment.
	waitUntil(t, "the unreachable upstream in the log", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "upstream unreachable")
	})

	// No /v1: a hint at start, and the engine's bare 404 is logged.
	addr = freeAddr(t)
	db := filepath.Join(t.TempDir(), "c.db")
	_, logs = start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--upstream", "http://"+mockAddr)
	waitUntil(t, "the /v1 hint in the log", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "does not end in /v1")
	})
	st, body = callWith(t, "http://"+addr+"/rollout/r1/attempt/1/v1/chat/completions")
	if st != 404 {
		t.Fatalf("a call to an upstream without /v1: %d %s, want the engine's 404", st, body)
	}
	waitUntil(t, "the bare 404 in the log", 10*time.Second, func() bool {
		return strings.Contains(logs.String(), "answered a call 404 Not Found (no such route)")
	})

	// A policy that is not one: refused, exit 2, naming the setting.
	out, err := exec.Command(binary, "serve", "--listen", freeAddr(t), "--db", filepath.Join(t.TempDir(), "d.db"), "--unattributed", "drop").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--unattributed") {
		t.Errorf("serve --unattributed drop: %v\n%s", err, out)
	}
}
