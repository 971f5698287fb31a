package ui

import (
	"strings"
	"testing"
)

// referenceRoute is Handle's routing as it was before the route table
// (frozen, for a GET of a path under /ui): the page reached, as "pattern
// ids...", or "invalid" or "404".
func referenceRoute(path string) string {
	rest := strings.TrimPrefix(path, "/ui")
	if rest == "" || rest == "/" || rest == "/rollouts" {
		return "list"
	}
	if rest == "/training" {
		return "/ui/training"
	}
	if strings.HasPrefix(rest, "/static/") {
		return "/ui/static/{file...} " + strings.TrimPrefix(rest, "/static/")
	}
	parts := splitPath(rest)
	if parts == nil {
		return "invalid"
	}
	if len(parts) >= 2 && parts[0] == "rollouts" && parts[1] == Unattributed {
		parts[1] = ""
	}
	switch {
	case len(parts) == 2 && parts[0] == "rollouts":
		return "/ui/rollouts/{rollout_id} " + parts[1]
	case len(parts) == 4 && parts[0] == "rollouts" && parts[2] == "calls":
		return "/ui/rollouts/{rollout_id}/calls/{sequence_id} " + parts[1] + " " + parts[3]
	case len(parts) == 5 && parts[0] == "rollouts" && parts[2] == "calls" && parts[4] == "raw":
		return "/ui/rollouts/{rollout_id}/calls/{sequence_id}/raw " + parts[1] + " " + parts[3]
	case len(parts) == 2 && parts[0] == "groups":
		return "/ui/groups/{group_id} " + parts[1]
	}
	return "404"
}

// tableRoute is what the route table matches, in referenceRoute's form.
func tableRoute(path string) string {
	if path == "/ui/" {
		path = "/ui"
	}
	m := routes.Match("GET", path, nil)
	switch {
	case m.Invalid:
		return "invalid"
	case m.Route == nil:
		return "404"
	case m.Route.Pattern == "/ui" || m.Route.Pattern == "/ui/rollouts":
		return "list"
	}
	ids := m.Params
	if strings.HasPrefix(m.Route.Pattern, "/ui/rollouts/") {
		ids = append([]string{rolloutParam(ids[0])}, ids[1:]...)
	}
	return strings.Join(append([]string{m.Route.Pattern}, ids...), " ")
}

var routeSeeds = []string{
	"/ui", "/ui/", "/ui//", "/ui/rollouts", "/ui/rollouts/", "/ui/training", "/ui/training/", "/ui/static/ui.css",
	"/ui/static/a/b", "/ui/static/", "/ui/static", "/ui/rollouts/ro-1", "/ui/rollouts/%28unattributed%29", "/ui//rollouts/ro-1",
	"/ui/rollouts//ro-1", "/ui/r%6Fllouts/ro-1", "/ui/rollouts/ro-1/calls/3", "/ui/rollouts/ro-1/calls/3/raw",
	"/ui/rollouts/ro-1/calls/3/raw/", "/ui/rollouts/ro%2F1/calls/3", "/ui/rollouts/%zz", "/ui/groups/g1", "/ui/groups/g1/x", "/ui/x",
}

// TestRouteTableMatchesSwitch: the viewer's table reaches the page the
// code it replaced reached, with the same ids (unescaped), on paths
// around every page.
func TestRouteTableMatchesSwitch(t *testing.T) {
	for _, p := range routeSeeds {
		if got, want := tableRoute(p), referenceRoute(p); got != want {
			t.Errorf("GET %s: table reaches %q, the code reached %q", p, got, want)
		}
	}
}

// FuzzRouteTable: the table and the frozen code agree on any path under /ui.
func FuzzRouteTable(f *testing.F) {
	for _, p := range routeSeeds {
		f.Add(strings.TrimPrefix(p, "/ui"))
	}
	f.Fuzz(func(t *testing.T, rest string) {
		p := "/ui/" + strings.TrimPrefix(rest, "/")
		if got, want := tableRoute(p), referenceRoute(p); got != want {
			t.Fatalf("GET %s: table reaches %q, the code reached %q", p, got, want)
		}
	})
}
