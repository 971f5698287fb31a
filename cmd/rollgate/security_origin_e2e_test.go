package main

// Cross-origin requests and DNS rebinding against the real gateway process
// on its default loopback listener without ROLLGATE_ADMIN_TOKEN: a web page
// the operator opens must not drive the admin API, AGL's API or the viewer,
// and a foreign Host (a rebound name) must not be served on them. Agent
// routes, monitoring, CLI and SDK calls, and the viewer's own pages keep
// working; with the admin token set nothing changes.

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// exchange sends one request to url with the headers hdr (name, value
// pairs, as gatewaytest.Do: a body is JSON unless they say otherwise,
// "Host" sets the Host header) and returns status, body and headers.
func exchange(t *testing.T, method, url, body string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	r := gatewaytest.Do(t, method, url, body, hdr...)
	return r.Status, string(r.Body), r.Header
}

// crossSiteDrill is one request a web page (or a rebound name) could make.
type crossSiteDrill struct {
	name, method, path, body string
	hdr                      []string
	style                    string // what the surface's error looks like
	reason                   string // rollgate_calls_rejected_total's reason
}

// TestCrossSiteRefusedWithoutToken drives every surface that answers
// without a credential as a hostile page would (foreign Origin, Origin
// null, Sec-Fetch-Site cross-site, CORS-safelisted or missing content
// types that need no preflight, a rebound Host): each is refused with 403
// in its surface's error style, naming the fix, counted, and changes
// nothing. The ordinary callers keep working.
func TestCrossSiteRefusedWithoutToken(t *testing.T) {
	addr, dir := freeAddr(t), t.TempDir()
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(dir, "r.db"), "--agl", "--agl-model-name", "policy")
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN=")
	logs := startCmd(t, cmd, addr)
	base := "http://" + addr
	_, port, _ := strings.Cut(addr, ":")
	evil := []string{"Origin", "http://evil.example"}
	rebound := []string{"Host", "rebind.attacker.example:" + port}
	with := func(a ...[]string) []string {
		var out []string
		for _, x := range a {
			out = append(out, x...)
		}
		return out
	}
	const apiErr, aglErr, uiErr = `"error":{"message":`, `{"detail":`, `id="error-message"`
	drills := []crossSiteDrill{
		{"pause from a foreign origin as text/plain", "POST", "/api/v1/pause", "", with(evil, []string{"Content-Type", "text/plain"}), apiErr, "cross_site"},
		{"AGL models from a foreign origin", "POST", "/api/models", `[{"model":"evil","endpoint":"http://127.0.0.1:9/v1"}]`,
			with(evil, []string{"Content-Type", "text/plain"}), aglErr, "cross_site"},
		{"AGL pause from a foreign origin", "POST", "/proxy/pause", `{}`, with(evil, []string{"Content-Type", "application/json"}), aglErr, "cross_site"},
		{"AGL list from a foreign origin", "GET", "/api/rollouts", "", evil, aglErr, "cross_site"},
		{"form-encoded tasks", "POST", "/api/v1/tasks", `[{"task_id":"csrf","input":1}]`,
			[]string{"Content-Type", "application/x-www-form-urlencoded"}, apiErr, "content_type"},
		{"multipart reward", "POST", "/api/v1/rollouts/r1/rewards", "--x\r\n\r\n{\"value\":1}\r\n--x--\r\n",
			[]string{"Content-Type", "multipart/form-data; boundary=x"}, apiErr, "content_type"},
		{"a JSON body without a content type", "POST", "/api/v1/resources", `{"resources":{"p":1}}`, []string{"Content-Type", ""}, apiErr, "content_type"},
		{"a huge text/plain body", "POST", "/api/v1/rollouts", `{"task_id":` + strings.Repeat("[", 4<<20),
			[]string{"Content-Type", "text/plain;charset=UTF-8"}, apiErr, "content_type"},
		{"AGL rollouts as text/plain", "POST", "/api/rollouts", `[{"input":{}}]`, []string{"Content-Type", "text/plain"}, aglErr, "content_type"},
		{"Origin null", "POST", "/api/v1/resume", "", []string{"Origin", "null"}, apiErr, "cross_site"},
		{"an origin that only starts like localhost", "POST", "/api/v1/bridge/lease", `{"n":1}`,
			[]string{"Origin", "http://localhost.evil.example:" + port, "Content-Type", "application/json"}, apiErr, "cross_site"},
		{"Sec-Fetch-Site cross-site", "GET", "/api/v1/backends", "", []string{"Sec-Fetch-Site", "cross-site"}, apiErr, "cross_site"},
		{"rebound Host on the admin API", "GET", "/api/v1/backends", "", rebound, apiErr, "host"},
		{"rebound Host on the viewer", "GET", "/ui", "", rebound, uiErr, "host"},
		{"rebound Host on AGL", "POST", "/proxy/pause", `{}`, with(rebound, []string{"Content-Type", "application/json"}), aglErr, "host"},
		{"the viewer fetched from a foreign origin", "GET", "/ui/rollouts", "", with(evil, []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "cors"}), uiErr, "cross_site"},
	}
	want := map[string]float64{}
	for _, d := range drills {
		status, body, _ := exchange(t, d.method, base+d.path, d.body, d.hdr...)
		credential := "ROLLGATE_ADMIN_TOKEN"
		if d.style == aglErr {
			credential = "--agl-key"
		}
		if status != 403 || !strings.Contains(body, d.style) || !strings.Contains(body, "--allowed-hosts") || !strings.Contains(body, credential) {
			t.Errorf("%s: %s %s answered %d %s; want 403 in the surface's error style naming --allowed-hosts and %s",
				d.name, d.method, d.path, status, truncateForLog(body), credential)
		}
		want[d.reason]++
	}
	for reason, n := range want {
		if got := metricSum(t, addr, `rollgate_calls_rejected_total{reason="`+reason+`"}`); got != n {
			t.Errorf("rollgate_calls_rejected_total{reason=%q} = %v, want %v", reason, got, n)
		}
	}
	// Nothing the drills asked for happened.
	if status, body, _ := exchange(t, "GET", base+"/api/v1/backends", ""); status != 200 || !strings.Contains(body, `"paused":false`) || strings.Contains(body, `"evil"`) {
		t.Errorf("after the drills the gateway is paused or routes the page's model: %d %s", status, body)
	}
	if status, body, _ := exchange(t, "POST", base+"/api/v1/tasks/dequeue", `{"worker_id":"w"}`, "Content-Type", "application/json"); status != 204 {
		t.Errorf("the form-encoded task was queued: dequeue answered %d %s", status, body)
	}

	// What keeps working: CLI and SDK calls (no Origin; JSON or no body),
	// same-origin pages, loopback names, agent routes from anywhere,
	// monitoring, and links to the viewer from other sites.
	ok := []crossSiteDrill{
		{name: "curl -XPOST pause", method: "POST", path: "/api/v1/pause"},
		{name: "resume with an empty JSON request", method: "POST", path: "/api/v1/resume", hdr: []string{"Content-Type", "application/json"}},
		{name: "tasks as JSON", method: "POST", path: "/api/v1/tasks", body: `[{"task_id":"t1","input":1}]`, hdr: []string{"Content-Type", "application/json; charset=utf-8"}},
		{name: "a +json type", method: "POST", path: "/api/v1/resources", body: `{"resources":{"p":1}}`, hdr: []string{"Content-Type", "application/vnd.rollgate+json"}},
		{name: "the gateway's own origin", method: "POST", path: "/api/v1/rollouts", body: `{"rollout_id":"own"}`,
			hdr: []string{"Origin", base, "Sec-Fetch-Site", "same-origin", "Content-Type", "application/json"}},
		{name: "localhost with a port", method: "GET", path: "/api/v1/backends", hdr: []string{"Host", "localhost:" + port, "Origin", "http://localhost:" + port}},
		{name: "LOCALHOST.", method: "GET", path: "/api/v1/backends", hdr: []string{"Host", "LOCALHOST.:" + port}},
		{name: "[::1]", method: "GET", path: "/api/v1/rollouts/own", hdr: []string{"Host", "[::1]:" + port}},
		{name: "127.0.0.2", method: "GET", path: "/api/v1/backends", hdr: []string{"Host", "127.0.0.2"}},
		{name: "same-site page", method: "GET", path: "/api/v1/backends", hdr: []string{"Origin", "http://127.0.0.1:3000", "Sec-Fetch-Site", "same-site"}},
		{name: "the viewer", method: "GET", path: "/ui", hdr: []string{"Sec-Fetch-Site", "none", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}},
		{name: "the viewer's script", method: "GET", path: "/ui/rollouts", hdr: []string{"Sec-Fetch-Site", "same-origin", "Sec-Fetch-Mode", "cors", "Referer", base + "/ui"}},
		{name: "a link to the viewer from another site", method: "GET", path: "/ui/rollouts/own",
			hdr: []string{"Sec-Fetch-Site", "cross-site", "Sec-Fetch-Mode", "navigate", "Sec-Fetch-Dest", "document"}},
		{name: "AGL as its SDK calls it", method: "POST", path: "/api/rollouts", body: `[{"input":{"q":1},"rollout_id":"agl1"}]`, hdr: []string{"Content-Type", "application/json"}},
		{name: "an agent from a rebound name, any content type", method: "POST", path: "/rollout/a/attempt/1/v1/chat/completions",
			body: `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`, hdr: with(rebound, evil, []string{"Content-Type", "text/plain"})},
		{name: "an agent on /v1 from any Host", method: "POST", path: "/v1/chat/completions",
			body: `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`, hdr: with(rebound, []string{"Content-Type", "application/json"})},
		{name: "metrics from any Host", method: "GET", path: "/metrics", hdr: with(rebound, evil)},
		{name: "healthz from any Host", method: "GET", path: "/healthz", hdr: with(rebound, evil)},
		{name: "readyz from any Host", method: "HEAD", path: "/readyz", hdr: rebound},
	}
	for _, d := range ok {
		status, body, _ := exchange(t, d.method, base+d.path, d.body, d.hdr...)
		if status < 200 || status > 299 {
			t.Errorf("%s: %s %s answered %d %s; want it served", d.name, d.method, d.path, status, truncateForLog(body))
		}
	}
	// AGL's agent route is agent traffic: any Host, as /v1 (it answers
	// whatever the proxy answers, never the cross-site refusal).
	status, body, _ := exchange(t, "POST", base+"/proxy/rollout/agl1/attempt/0/mode/train/openai/v1/chat/completions",
		`{"model":"auto","messages":[{"role":"user","content":"hi"}]}`, with(rebound, []string{"Content-Type", "application/json"})...)
	if status == 403 || strings.Contains(body, "allowed-hosts") {
		t.Errorf("AGL's agent route refused a rebound Host: %d %s", status, body)
	}
	// Monitoring stays open but read-only.
	if status, body, _ := exchange(t, "POST", base+"/metrics", "x", "Content-Type", "text/plain"); status != 405 {
		t.Errorf("POST /metrics answered %d %s, want 405", status, truncateForLog(body))
	}
	stop(t, cmd, logs)
}

// TestAllowedHostsAndAdminToken: --allowed-hosts adds names the admin
// surfaces are served to (flag over ROLLGATE_ALLOWED_HOSTS over the file's
// allowed_hosts), a bad entry stops serve naming the setting, and with
// ROLLGATE_ADMIN_TOKEN set (AGL's routes: agl.key) no Origin, Host or
// content-type check applies.
func TestAllowedHostsAndAdminToken(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "rollgate.yaml")
	if err := os.WriteFile(cfgPath, []byte("allowed_hosts: [file.example, env.example]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(dir, "r.db"), "--config", cfgPath,
		"--allowed-hosts", "gw.example, trainer.internal")
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN=", "ROLLGATE_ALLOWED_HOSTS=env.example")
	logs := startCmd(t, cmd, addr)
	base := "http://" + addr
	for host, want := range map[string]int{"gw.example:8000": 200, "GW.EXAMPLE": 200, "trainer.internal": 200, "env.example": 403, "file.example": 403, "example": 403} {
		if status, body, _ := exchange(t, "GET", base+"/api/v1/backends", "", "Host", host, "Origin", "https://"+strings.Split(host, ":")[0]); status != want {
			t.Errorf("Host %s with --allowed-hosts gw.example,trainer.internal: %d %s, want %d", host, status, truncateForLog(body), want)
		}
	}
	stop(t, cmd, logs)

	out, err := exec.Command(binary, "serve", "--listen", freeAddr(t), "--db", filepath.Join(dir, "r2.db"), "--allowed-hosts", "http://gw.example/").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "allowed_hosts") || !strings.Contains(string(out), "http://gw.example/") {
		t.Errorf("serve --allowed-hosts http://gw.example/: %v\n%s\nwant it refused, naming the setting and the value", err, out)
	}

	addr = freeAddr(t)
	cmd = exec.Command(binary, "serve", "--listen", addr, "--db", filepath.Join(dir, "r3.db"), "--agl", "--agl-model-name", "policy", "--agl-key", "agl-secret")
	cmd.Env = append(os.Environ(), "ROLLGATE_ADMIN_TOKEN=admin-secret")
	logs = startCmd(t, cmd, addr)
	base = "http://" + addr
	hostile := []string{"Authorization", "Bearer admin-secret", "Origin", "http://evil.example", "Host", "rebind.attacker.example", "Content-Type", "text/plain"}
	for _, d := range []crossSiteDrill{
		{method: "POST", path: "/api/v1/pause", body: ""},
		{method: "POST", path: "/api/v1/tasks", body: `[{"task_id":"t","input":1}]`},
		{method: "GET", path: "/api/v1/backends"},
		{method: "GET", path: "/ui"},
	} {
		if status, body, _ := exchange(t, d.method, base+d.path, d.body, hostile...); status != 200 {
			t.Errorf("with the admin token, %s %s from a foreign origin and Host as text/plain: %d %s, want 200 as before", d.method, d.path, status, truncateForLog(body))
		}
	}
	// AGL's routes with its key: as before too.
	if status, body, _ := exchange(t, "POST", base+"/api/rollouts", `[{"input":{}}]`, append([]string{"x-api-key", "agl-secret"}, hostile[2:]...)...); status != 201 {
		t.Errorf("with AGL's key, POST /api/rollouts from a foreign origin and Host as text/plain: %d %s, want 201 as before", status, truncateForLog(body))
	}
	if status, body, _ := exchange(t, "POST", base+"/api/v1/resume", ""); status != 401 {
		t.Errorf("with the admin token, POST /api/v1/resume without it: %d %s, want 401", status, body)
	}
	stop(t, cmd, logs)
}
