package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// uiGateway is a gateway started for a browser test: the built binary with
// its built-in mock engine, an embedded store and an admin token.
type uiGateway struct {
	base, token, db string
	node, chromium  string
	logs            *syncBuffer
}

// startUIGateway checks the browser test's tools (node, Debian's chromium,
// playwright-core) and starts the gateway.
func startUIGateway(t *testing.T) *uiGateway {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: apt-get install nodejs npm (scripts/test does)")
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("Debian's chromium is not installed: apt-get install chromium (scripts/test does)")
	}
	if _, err := os.Stat(filepath.Join(browserDir, "node_modules", "playwright-core")); err != nil {
		t.Fatalf("playwright-core is missing: (cd ui/browsertest && npm ci) — scripts/test does it: %v", err)
	}
	g := &uiGateway{token: "ui-test-token", node: node, chromium: chromium, logs: &syncBuffer{}}
	addr := freeAddr(t)
	g.base = "http://" + addr
	g.db = filepath.Join(t.TempDir(), "r.db")
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", g.db)
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN="+g.token)
	cmd.Stdout, cmd.Stderr = g.logs, g.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitUntil(t, "the gateway to answer /healthz", 20*time.Second, func() bool {
		r, err := http.Get(g.base + "/healthz")
		if err == nil {
			r.Body.Close()
		}
		return err == nil && r.StatusCode == 200
	})
	return g
}

// admin calls an /api/v1 route with the admin token and fails the test
// unless it answers 2xx.
func (g *uiGateway) admin(t *testing.T, method, path, body string) gjson.Result {
	t.Helper()
	req, _ := http.NewRequest(method, g.base+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+g.token)
	req.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil || r.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s %v", method, path, r.StatusCode, b, err)
	}
	return gjson.ParseBytes(b)
}

// runScript runs a script of ui/browsertest with env, screenshots to
// ROLLGATE_UI_SCREENSHOTS when set, and returns the screenshot folder.
func (g *uiGateway) runScript(t *testing.T, script string, env ...string) string {
	t.Helper()
	out := os.Getenv("ROLLGATE_UI_SCREENSHOTS")
	if out == "" {
		out = t.TempDir()
	}
	cmd := exec.Command(g.node, script)
	cmd.Dir = browserDir
	cmd.Env = append(append(os.Environ(), "BASE="+g.base, "TOKEN="+g.token, "OUT="+out, "CHROMIUM="+g.chromium), env...)
	res, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the browser test failed: %v\n%s\ngateway log:\n%s", err, res, g.logs.String())
	}
	t.Logf("%s", res)
	return out
}

// TestTrainingViewInBrowser runs three training steps through the real
// gateway: before each, the routing table's policy version is raised (PUT
// /api/v1/backends, as a trainer does after a weight update), then a group
// of three rollouts of one task is registered, called and rewarded — step
// 1 rewards 0, 0, 1; step 2 rewards 0, 1, 1 with a second, failing call on
// its last rollout; step 3 rewards 1, 1 and leaves its third rollout
// running without a reward. ui/browsertest/training.mjs then asserts what
// /ui/training draws in Debian's Chromium (points, bars and their values,
// the table, the search box, the group link, the copy button's clipboard)
// and shoots docs/ui/training.png and training-groups.png (made so:
// ROLLGATE_UI_SCREENSHOTS=$PWD/docs/ui go test -run TestTrainingViewInBrowser ./cmd/rollgate/).
func TestTrainingViewInBrowser(t *testing.T) {
	g := startUIGateway(t)
	backends := g.admin(t, "GET", "/api/v1/backends", "").Get("backends").Raw
	if backends == "" || !strings.Contains(backends, `"replicas"`) {
		t.Fatalf("GET /api/v1/backends: no routing table: %s", backends)
	}
	rewards := [][]float64{{0, 0, 1}, {0, 1, 1}, {1, 1, -1}} // -1: no reward, left running
	var last string
	for step, rs := range rewards {
		pv := fmt.Sprint(step + 1)
		// The table as read, with only the fields a PUT takes (GET adds
		// what the gateway resolved) and the new version on every replica.
		var bs []string
		for _, b := range gjson.Parse(backends).Array() {
			raw, _ := sjson.Set(`{"replicas":[]}`, "model", b.Get("model").Str)
			for j, r := range b.Get("replicas").Array() {
				rep := map[string]string{"name": r.Get("name").Str, "url": r.Get("url").Str, "kind": r.Get("kind").Str, "policy_version": pv}
				var err error
				if raw, err = sjson.Set(raw, fmt.Sprintf("replicas.%d", j), rep); err != nil {
					t.Fatal(err)
				}
			}
			bs = append(bs, raw)
		}
		g.admin(t, "PUT", "/api/v1/backends", `{"backends":[`+strings.Join(bs, ",")+`]}`)
		group := "g-step" + pv
		for i, reward := range rs {
			ro := fmt.Sprintf("train-%s-%d", pv, i)
			at := g.admin(t, "POST", "/api/v1/rollouts", `{"rollout_id":"`+ro+`","task_id":"task-train","group_id":"`+group+`"}`).Get("attempt_id").Str
			url := g.base + "/rollout/" + ro + "/attempt/" + at + "/v1/chat/completions"
			if code, body, _ := post(t, url, `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"step `+pv+`"}]}`); code != 200 {
				t.Fatalf("%s: %d %s", ro, code, body)
			}
			if step == 1 && i == 2 {
				req, _ := http.NewRequest("POST", url, strings.NewReader(`{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"again"}]}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("x-mock-fail", "status=500")
				r, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				r.Body.Close()
			}
			if reward < 0 {
				g.admin(t, "POST", "/api/v1/rollouts/"+ro+"/status", `{"status":"running","attempt_id":"`+at+`"}`)
				continue
			}
			g.admin(t, "POST", "/api/v1/rollouts/"+ro+"/rewards", fmt.Sprintf(`{"value":%v,"attempt_id":"%s"}`, reward, at))
			g.admin(t, "POST", "/api/v1/rollouts/"+ro+"/status", `{"status":"succeeded","attempt_id":"`+at+`"}`)
			last = ro
		}
	}
	waitUntil(t, "the ten calls to be stored", 20*time.Second, func() bool {
		n := 0
		for step := 1; step <= 3; step++ {
			for i := 0; i < 3; i++ {
				n += len(g.admin(t, "GET", fmt.Sprintf("/api/v1/rollouts/train-%d-%d", step, i), "").Get("calls").Array())
			}
		}
		return n == 10
	})
	out := g.runScript(t, "training.mjs", "DB="+g.db, "SEARCH="+last)
	for _, f := range []string{"training.png", "training-groups.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() < 5000 {
			t.Errorf("screenshot %s missing or empty: %v", f, err)
		}
	}
}
