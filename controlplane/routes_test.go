package controlplane

import (
	"strings"
	"testing"
)

// referenceAPIRoute is ServeAPI's switch as it was before the route table
// (frozen): the route a method and a path below /api/v1 reach, as "METHOD
// pattern params...", or "404".
func referenceAPIRoute(method, sub string) string {
	parts := strings.Split(strings.Trim(sub, "/"), "/")
	switch {
	case strings.HasPrefix(sub, "/bridge/"):
		if sub[len("/bridge"):] == "/batches" && method == "POST" {
			return "POST /bridge/batches"
		}
		return " /bridge/{path...} " + sub[len("/bridge/"):]
	case sub == "/pause" && method == "POST":
		return "POST /pause"
	case sub == "/resume" && method == "POST":
		return "POST /resume"
	case sub == "/backends" && method == "GET":
		return "GET /backends"
	case sub == "/backends" && method == "PUT":
		return "PUT /backends"
	case sub == "/rollouts" && method == "POST":
		return "POST /rollouts"
	case sub == "/rollouts" && method == "GET":
		return "GET /rollouts"
	case sub == "/tasks" && method == "POST":
		return "POST /tasks"
	case sub == "/tasks/dequeue" && method == "POST":
		return "POST /tasks/dequeue"
	case len(parts) == 2 && parts[0] == "tasks" && method == "DELETE":
		return "DELETE /tasks/{rollout_id} " + parts[1]
	case sub == "/resources" && method == "POST":
		return "POST /resources"
	case len(parts) == 2 && parts[0] == "resources" && method == "GET":
		return "GET /resources/{version} " + parts[1]
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "heartbeat" && method == "POST":
		return "POST /rollouts/{rollout_id}/heartbeat " + parts[1]
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "calls" && method == "POST":
		return "POST /rollouts/{rollout_id}/calls " + parts[1]
	case len(parts) == 2 && parts[0] == "rollouts" && method == "GET":
		return "GET /rollouts/{rollout_id} " + parts[1]
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "rewards" && method == "POST":
		return "POST /rollouts/{rollout_id}/rewards " + parts[1]
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "status" && method == "POST":
		return "POST /rollouts/{rollout_id}/status " + parts[1]
	}
	return "404"
}

// tableAPIRoute is what apiRoutes matches, in referenceAPIRoute's form.
func tableAPIRoute(method, sub string) string {
	if r := apiRoutes.Match(method, sub, nil).String(); r != "405" {
		return r
	}
	return "404" // no 405 on /api/v1
}

var apiRouteSeeds = []string{
	"/pause", "/pause/", "//pause", "/resume", "/backends", "/backends/", "/rollouts", "/rollouts/", "/rollouts/ro-1",
	"/rollouts/ro-1/", "//rollouts//ro-1", "/rollouts/ro-1/rewards", "/rollouts/ro-1/rewards/", "/rollouts/ro-1/status",
	"/rollouts/ro-1/heartbeat", "/rollouts/ro-1/calls", "/rollouts/ro-1/x", "/rollouts//rewards", "/tasks", "/tasks/",
	"/tasks/dequeue", "/tasks/dequeue/", "/tasks/ro-1", "/tasks/ro-1/x", "/resources", "/resources/latest", "/resources/3/",
	"/resources//", "/bridge/batches", "/bridge/batches/", "/bridge/lease", "/bridge/", "/bridge", "/bridge//x", "", "/", "/x",
}

var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// TestAPIRouteTableMatchesSwitch: the /api/v1 table reaches the route the
// switch it replaced reached, with the same ids, for every method on
// paths around every route (trailing and doubled slashes included).
func TestAPIRouteTableMatchesSwitch(t *testing.T) {
	for _, p := range apiRouteSeeds {
		for _, m := range httpMethods {
			if got, want := tableAPIRoute(m, p), referenceAPIRoute(m, p); got != want {
				t.Errorf("%s /api/v1%s: table reaches %q, the switch reached %q", m, p, got, want)
			}
		}
	}
}

// FuzzAPIRouteTable: the table and the frozen switch agree on any path.
func FuzzAPIRouteTable(f *testing.F) {
	for i, p := range apiRouteSeeds {
		f.Add(uint8(i), p)
	}
	f.Fuzz(func(t *testing.T, mi uint8, p string) {
		m := httpMethods[int(mi)%len(httpMethods)]
		if got, want := tableAPIRoute(m, p), referenceAPIRoute(m, p); got != want {
			t.Fatalf("%s /api/v1%s: table reaches %q, the switch reached %q", m, p, got, want)
		}
	})
}
