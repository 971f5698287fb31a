package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/controlplane"
	"github.com/rollgate/rollgate/controlplane/agl"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/route"
	"github.com/rollgate/rollgate/ui"
)

// TestRouteTablesOverHTTP reads every surface's route table and asks the
// binary for each route with no credential and with a method the row does
// not serve: the Auth column holds (the admin token guards every /api/v1
// route, the lease API's and the viewer's pages; AGL's key its surface),
// and each surface refuses a wrong method in its own style (405
// OpenAI-style on the agent routes, with Allow on the GET ones; 404 on
// /api/v1; 405 {"detail"} on AGL's; 405 on the viewer's).
func TestRouteTablesOverHTTP(t *testing.T) {
	t.Setenv("ROLLGATE_ADMIN_TOKEN", "rt-admin")
	addr := freeAddr(t)
	start(t, addr, "/readyz", "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"),
		"--agl", "--agl-key", "rt-agl", "--agl-model-name", "policy")
	base := "http://" + addr
	fill := strings.NewReplacer("{rollout_id}", "ro-rt", "{attempt_id}", "at-1", "{mode}", "train", "{version}", "latest",
		"{sequence_id}", "1", "{group_id}", "g", "{file...}", "ui.css", "{path...}", "x")
	do := func(method, path string, header ...string) (int, http.Header, string) {
		t.Helper()
		req, err := http.NewRequest(method, base+fill.Replace(path), strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, r.Header, string(b)
	}
	// A method no row of these tables serves.
	const wrong = "OPTIONS"

	f := func(rows []route.Info, auth route.Auth, credential []string, refused int, wrongStatus int, wrongBody string) {
		t.Helper()
		if len(rows) == 0 {
			t.Fatalf("no routes of %s", auth)
		}
		for _, r := range rows {
			if r.Auth != auth {
				t.Errorf("%s: auth %q, want %q", r, r.Auth, auth)
			}
			m := r.Method
			if m == "" {
				m = "GET"
			}
			if code, _, body := do(m, r.Pattern); code != refused {
				t.Errorf("%s without a credential: %d %.200s, want %d", r, code, body, refused)
			}
			if strings.HasPrefix(r.Pattern, "/api/v1/bridge/") {
				continue // the lease API below answers other methods as net/http's ServeMux does (its own tests)
			}
			if code, _, body := do(wrong, r.Pattern, credential...); code != wrongStatus || !strings.Contains(body, wrongBody) {
				t.Errorf("%s %s: %d %.200s, want %d with %q", wrong, r.Pattern, code, body, wrongStatus, wrongBody)
			}
		}
	}
	admin := []string{"Authorization", "Bearer rt-admin"}
	f(controlplane.Routes(), route.Admin, admin, 401, 404, `"unknown route OPTIONS /api/v1/`)
	f(ui.Routes(), route.Admin, admin, 401, 405, "The viewer is read-only")
	f(agl.Routes(), route.AGLKey, []string{"x-api-key", "rt-agl"}, 401, 405, `{"detail":"Method Not Allowed"}`)

	for _, r := range gateway.Routes() {
		switch {
		case r.Auth == route.Open:
			if code, _, body := do(r.Method, r.Pattern); code != 200 {
				t.Errorf("%s, open: %d %.200s", r, code, body)
			}
			code, h, body := do("POST", r.Pattern)
			if code != 405 || h.Get("Allow") != "GET, HEAD" || !strings.Contains(body, `"type":"invalid_request_error"`) {
				t.Errorf("POST %s: %d Allow %q %.200s", r.Pattern, code, h.Get("Allow"), body)
			}
		case r.Method == "POST":
			code, _, body := do("GET", "/rollout/ro-rt/attempt/at-1"+r.Pattern)
			if code != 405 || !strings.Contains(body, "method GET not allowed on "+r.Pattern+": use POST") {
				t.Errorf("GET %s under the rollout prefix: %d %.200s", r.Pattern, code, body)
			}
		}
	}
	if code, _, body := do("GET", "/v2/nothing"); code != 404 || !strings.Contains(body, `"unknown route GET /v2/nothing"`) {
		t.Errorf("unknown route: %d %.200s", code, body)
	}
}
