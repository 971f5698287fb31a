package agl

import (
	"strings"
	"testing"
)

// referenceRoute is Handle's switch as it was before the route table
// (frozen, after the key and the path ids): the route a method and a path
// reach, as "METHOD pattern ids...", or "405" or "404".
func referenceRoute(method, sub string) string {
	if strings.HasPrefix(sub, "/proxy/rollout/") {
		return " /proxy/rollout/{path...} " + sub[len("/proxy/rollout/"):]
	}
	parts := strings.Split(strings.Trim(sub, "/"), "/")
	switch {
	case sub == "/proxy/pause" && method == "POST":
		return "POST /proxy/pause"
	case sub == "/proxy/resume" && method == "POST":
		return "POST /proxy/resume"
	case sub == "/proxy/state" && method == "GET":
		return "GET /proxy/state"
	case sub == "/api/models" && method == "POST":
		return "POST /api/models"
	case sub == "/api/models" && method == "DELETE":
		return "DELETE /api/models"
	case sub == "/api/rollouts" && method == "POST":
		return "POST /api/rollouts"
	case sub == "/api/rollouts" && method == "GET":
		return "GET /api/rollouts"
	case sub == "/api/rollouts/terminal" && method == "GET":
		return "GET /api/rollouts/terminal"
	case len(parts) == 3 && parts[0] == "api" && parts[1] == "rollouts" && method == "GET":
		return "GET /api/rollouts/{rollout_id} " + parts[2]
	case len(parts) == 3 && parts[0] == "api" && parts[1] == "rollouts" && method == "PATCH":
		return "PATCH /api/rollouts/{rollout_id} " + parts[2]
	case len(parts) == 3 && parts[0] == "api" && parts[1] == "rollouts" && method == "DELETE":
		return "DELETE /api/rollouts/{rollout_id} " + parts[2]
	case len(parts) == 4 && parts[0] == "api" && parts[1] == "rollouts" && parts[3] == "events" && method == "GET":
		return "GET /api/rollouts/{rollout_id}/events " + parts[2]
	case len(parts) == 6 && parts[0] == "api" && parts[1] == "rollouts" && parts[3] == "attempt" && parts[5] == "events" && method == "POST":
		return "POST /api/rollouts/{rollout_id}/attempt/{attempt_id}/events " + parts[2] + " " + parts[4]
	}
	p := strings.Join(parts, "/")
	switch {
	case p == "proxy/pause", p == "proxy/resume", p == "proxy/state", p == "api/models", p == "api/rollouts",
		len(parts) == 3 && parts[0] == "api" && parts[1] == "rollouts",
		len(parts) == 4 && parts[0] == "api" && parts[1] == "rollouts" && parts[3] == "events",
		len(parts) == 6 && parts[0] == "api" && parts[1] == "rollouts" && parts[3] == "attempt" && parts[5] == "events":
		return "405"
	}
	return "404"
}

// tableRoute is what the route table matches, in referenceRoute's form.
func tableRoute(method, sub string) string {
	return routes.Match(method, sub, nil).String()
}

var routeSeeds = []string{
	"/proxy/pause", "/proxy/pause/", "//proxy/pause", "/proxy/resume", "/proxy/state", "/proxy/state/", "/proxy/x",
	"/proxy/rollout/r/attempt/a/mode/train/openai/v1/chat/completions", "/proxy/rollout/", "/proxy/rollout",
	"/api/models", "/api/models/", "/api/rollouts", "/api/rollouts/", "/api/rollouts/terminal", "/api/rollouts/terminal/",
	"/api/rollouts/ro-1", "/api/rollouts/ro-1/", "//api//rollouts", "/api/rollouts/ro-1/events", "/api/rollouts/ro-1/events/",
	"/api/rollouts/ro-1/attempt/at-1/events", "/api/rollouts/ro-1/attempt/at-1/x", "/api/rollouts//events", "/api/x", "/api/", "/api",
}

var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// TestRouteTableMatchesSwitch: the surface's table reaches the route the
// switch it replaced reached (or the same 405 or 404), with the same ids,
// for every method on paths around every route.
func TestRouteTableMatchesSwitch(t *testing.T) {
	for _, p := range routeSeeds {
		for _, m := range httpMethods {
			if got, want := tableRoute(m, p), referenceRoute(m, p); got != want {
				t.Errorf("%s %s: table reaches %q, the switch reached %q", m, p, got, want)
			}
		}
	}
}

// FuzzRouteTable: the table and the frozen switch agree on any path.
func FuzzRouteTable(f *testing.F) {
	for i, p := range routeSeeds {
		f.Add(uint8(i), p)
	}
	f.Fuzz(func(t *testing.T, mi uint8, p string) {
		m := httpMethods[int(mi)%len(httpMethods)]
		if got, want := tableRoute(m, p), referenceRoute(m, p); got != want {
			t.Fatalf("%s %s: table reaches %q, the switch reached %q", m, p, got, want)
		}
	})
}
