package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
)

// browserDir holds the browser test's script and its npm packages
// (playwright-core; scripts/test runs npm ci there).
var browserDir = filepath.Join("..", "..", "ui", "browsertest")

// TestViewerInBrowser captures a GRPO group of three rollouts through the
// real gateway (built-in mock engine, embedded store, admin token) — one
// good, one whose last answer is cut at max_tokens, one whose last call
// fails — then drives Debian's headless Chromium through playwright-core
// over every view of /ui (ui/browsertest/views.mjs asserts what a person
// sees: the list and its live refresh, the group's advantages and
// exclusions, the conversation in order with hostile text shown as text,
// masked and shaded tokens with the cut point, a not-found page).
// Screenshots go to ROLLGATE_UI_SCREENSHOTS when set (the README's are made
// so: ROLLGATE_UI_SCREENSHOTS=$PWD/docs/ui scripts/test -run TestViewerInBrowser ./cmd/rollgate/).
func TestViewerInBrowser(t *testing.T) {
	g := startUIGateway(t)
	base := g.base
	admin := func(method, path, body string) gjson.Result {
		t.Helper()
		return g.admin(t, method, path, body)
	}
	const tools = `"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"q":{"type":"string"}},"required":["q"]}}}]`
	user := `{"role":"system","content":"Answer with the lookup tool."},{"role":"user","content":"What is <img src=x onerror=alert(1)>?"}`
	ids := map[string]string{"good": "ro-good", "cut": "ro-cut", "bad": "ro-bad"}
	for kind, ro := range ids {
		at := admin("POST", "/api/v1/rollouts", `{"rollout_id":"`+ro+`","task_id":"task-ui","group_id":"g-ui"}`).Get("attempt_id").Str
		url := base + "/rollout/" + ro + "/attempt/" + at + "/v1/chat/completions"
		code, body, _ := post(t, url, `{"model":"m","messages":[`+user+`],`+tools+`}`)
		if code != 200 {
			t.Fatalf("%s call 1: %d %s", ro, code, body)
		}
		reply := asSampled(t, gjson.Get(body, "choices.0.message").Raw) // so the second prompt extends the first
		callID := gjson.Get(body, "choices.0.message.tool_calls.0.id").Str
		msgs := user + `,` + reply + `,{"role":"tool","tool_call_id":"` + callID + `","content":"a picture"}`
		second := `{"model":"m","messages":[` + msgs + `],` + tools + `}`
		req, _ := http.NewRequest("POST", url, strings.NewReader(second))
		req.Header.Set("Content-Type", "application/json")
		switch kind {
		case "cut":
			req, _ = http.NewRequest("POST", url, strings.NewReader(`{"model":"m","max_tokens":3,"messages":[`+msgs+`],`+tools+`}`))
		case "bad":
			req.Header.Set("x-mock-fail", "status=500")
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		status, reward := "succeeded", "1"
		switch kind {
		case "cut":
			status, reward = "succeeded", "0"
		case "bad":
			status, reward = "failed", "0"
		}
		admin("POST", "/api/v1/rollouts/"+ro+"/rewards", `{"value":`+reward+`,"attempt_id":"`+at+`"}`)
		admin("POST", "/api/v1/rollouts/"+ro+"/status", `{"status":"`+status+`","attempt_id":"`+at+`"}`)
	}
	for _, ro := range ids {
		waitUntil(t, ro+"'s two calls to be stored", 20*time.Second, func() bool {
			return len(admin("GET", "/api/v1/rollouts/"+ro, "").Get("calls").Array()) == 2
		})
	}
	out := g.runScript(t, "views.mjs", "GROUP=g-ui", "GOOD="+ids["good"], "CUT="+ids["cut"], "BAD="+ids["bad"])
	for _, f := range []string{"list.png", "group.png", "rollout.png", "tokens.png"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() < 5000 {
			t.Errorf("screenshot %s missing or empty: %v", f, err)
		}
	}
}
