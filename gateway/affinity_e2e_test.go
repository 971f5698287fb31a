package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/gateway"
)

// affineEnv is a gateway in front of four mock engines serving model "*".
type affineEnv struct {
	*env
	mocks []*mock.Server
}

func newAffineEnv(t *testing.T, mutate func(*gateway.Backend)) *affineEnv {
	t.Helper()
	s, _ := openSQLite(t)
	a := &affineEnv{}
	a.env = newEnv(t, s, func(c *gateway.Config) {
		b := gateway.Backend{Model: "*"}
		for i := range 4 {
			ms, base, err := mock.Start(mock.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ms.Shutdown() })
			a.mocks = append(a.mocks, ms)
			b.Replicas = append(b.Replicas, gateway.Replica{Name: fmt.Sprintf("m%d", i), URL: base, Kind: "vllm"})
		}
		if mutate != nil {
			mutate(&b)
		}
		c.Backends = []gateway.Backend{b}
	})
	return a
}

// call sends one chat call of rollout and returns the index of the mock
// that served it.
func (a *affineEnv) call(rollout string) int {
	a.t.Helper()
	before := make([]int64, len(a.mocks))
	for i, m := range a.mocks {
		before[i] = m.RequestsTo(mock.PathChat)
	}
	r := do(a.t, "POST", a.url+"/rollout/"+rollout+"/attempt/1/v1/chat/completions", chatBody)
	if r.status != 200 {
		a.t.Fatalf("rollout %s: %d %s", rollout, r.status, r.body)
	}
	served := -1
	for i, m := range a.mocks {
		if m.RequestsTo(mock.PathChat) > before[i] {
			served = i
		}
	}
	return served
}

// TestAffineRoutingOverHTTP: each rollout's calls reach one engine; when
// that engine dies, its calls are retried on the rollout's next replica and
// stay there; the counter tells hits from spills.
func TestAffineRoutingOverHTTP(t *testing.T) {
	a := newAffineEnv(t, nil)
	home := map[string]int{}
	used := map[int]bool{}
	for i := range 16 {
		ro := fmt.Sprintf("ro-affine-%d", i)
		home[ro] = a.call(ro)
		used[home[ro]] = true
		for turn := 1; turn < 4; turn++ {
			if got := a.call(ro); got != home[ro] {
				t.Fatalf("%s turn %d went to mock %d, its first turn to mock %d", ro, turn, got, home[ro])
			}
		}
	}
	if len(used) < 3 {
		t.Fatalf("16 rollouts used only mocks %v", used)
	}
	hits := testutil.ToFloat64(a.m.RoutingAffinity.WithLabelValues("hit"))
	if hits != 64 {
		t.Fatalf("rollgate_routing_affinity_total{outcome=hit} = %v after 64 calls, want 64", hits)
	}

	// The engine of ro-affine-0 goes away: its calls fail before any byte,
	// are retried elsewhere, and keep going to one replica.
	ro := "ro-affine-0"
	dead := home[ro]
	if err := a.mocks[dead].Shutdown(); err != nil {
		t.Fatal(err)
	}
	next := a.call(ro)
	if next == dead || next < 0 {
		t.Fatalf("after mock %d died, %s went to %d", dead, ro, next)
	}
	for range 3 {
		if got := a.call(ro); got != next {
			t.Fatalf("%s moved on from dead mock %d to %d, then to %d", ro, dead, next, got)
		}
	}
	// Rollouts of the live engines did not move.
	for r, h := range home {
		if h != dead {
			if got := a.call(r); got != h {
				t.Fatalf("%s moved from live mock %d to %d when mock %d died", r, h, got, dead)
			}
		}
	}
	if spills := testutil.ToFloat64(a.m.RoutingAffinity.WithLabelValues("spill")); spills < 4 {
		t.Fatalf("rollgate_routing_affinity_total{outcome=spill} = %v, want at least the 4 retries", spills)
	}

	// Calls naming no rollout: least outstanding, counted as fallback.
	if r := do(t, "POST", a.url+"/v1/chat/completions", chatBody); r.status != 200 {
		t.Fatalf("call without rollout: %d %s", r.status, r.body)
	}
	if fb := testutil.ToFloat64(a.m.RoutingAffinity.WithLabelValues("fallback")); fb != 1 {
		t.Fatalf("rollgate_routing_affinity_total{outcome=fallback} = %v, want 1", fb)
	}
}

// TestRoutingInBackendsAPI: GET shows each pool's policy, PUT sets it, and
// a wrong value is a 400 naming the field.
func TestRoutingInBackendsAPI(t *testing.T) {
	a := newAffineEnv(t, nil)
	g := do(t, "GET", a.url+"/api/v1/backends", "")
	if p := gjson.GetBytes(g.body, "backends.0"); p.Get("routing").String() != "affine" || p.Get("load_factor").Float() != 1.25 {
		t.Fatalf("GET backends, default routing: %s", g.body)
	}
	put := func(extra string) resp {
		return do(t, "PUT", a.url+"/api/v1/backends", `{"backends":[{"model":"*",`+extra+`"replicas":[{"url":"`+a.mockURL+`","kind":"vllm"}]}]}`)
	}
	if r := put(`"routing":"least_outstanding",`); r.status != 200 || gjson.GetBytes(r.body, "backends.0.routing").String() != "least_outstanding" {
		t.Fatalf("PUT routing least_outstanding: %d %s", r.status, r.body)
	}
	if r := put(`"routing":"affine","load_factor":2,`); r.status != 200 || gjson.GetBytes(r.body, "backends.0.load_factor").Float() != 2 {
		t.Fatalf("PUT load_factor 2: %d %s", r.status, r.body)
	}
	for extra, want := range map[string]string{
		`"routing":"sticky",`: `routing \"sticky\" is not one of affine, least_outstanding`,
		`"load_factor":0.9,`:  `load_factor 0.9 is below 1`,
	} {
		r := put(extra)
		if r.status != 400 || !strings.Contains(string(r.body), want) {
			t.Fatalf("PUT %s: %d %s, want 400 saying %s", extra, r.status, r.body, want)
		}
	}
}

// TestLeastOutstandingStaysSelectable: a pool set to least_outstanding
// spreads one rollout's sequential calls (ties rotate) and counts nothing.
func TestLeastOutstandingStaysSelectable(t *testing.T) {
	a := newAffineEnv(t, func(b *gateway.Backend) { b.Routing = gateway.RoutingLeastOutstanding })
	used := map[int]bool{}
	for range 8 {
		used[a.call("ro-lo")] = true
	}
	if len(used) < 2 {
		t.Fatalf("least_outstanding sent 8 calls of one rollout to mocks %v only", used)
	}
	for _, o := range []string{"hit", "spill", "fallback"} {
		if v := testutil.ToFloat64(a.m.RoutingAffinity.WithLabelValues(o)); v != 0 {
			t.Fatalf("least_outstanding pool counted %v affinity %s", v, o)
		}
	}
}
