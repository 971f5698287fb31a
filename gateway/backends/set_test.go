package backends

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// TestReplaceKeepsUnchangedReplicas: a swap keeps the Upstream (its load,
// health and resolved kind) of a replica whose configuration is unchanged,
// makes a new one for a changed replica, and a refused table leaves the
// current one in place.
func TestReplaceKeepsUnchangedReplicas(t *testing.T) {
	spec := []Backend{{Model: "m", Replicas: []Replica{{URL: "http://10.0.0.1:8000/v1", Kind: "vllm"}, {URL: "http://10.0.0.2:8000/v1", Kind: "sglang"}}}}
	s, err := New(spec, Options{})
	if err != nil {
		t.Fatal(err)
	}
	old := s.Load().Pool([]byte("m")).Replicas()
	old[0].Acquire()
	old[1].MarkFailure(1, time.Hour)

	next := []Backend{{Model: "m", Replicas: []Replica{{URL: "http://10.0.0.1:8000/v1", Kind: "vllm"}, {URL: "http://10.0.0.2:8000/v1", Kind: "sglang", PolicyVersion: "v2"}}},
		{Model: "*", Replicas: []Replica{{URL: "http://10.0.0.3:8000/v1", Kind: "openai"}}}}
	if err := s.Replace(next); err != nil {
		t.Fatal(err)
	}
	t2 := s.Load()
	now := t2.Pool([]byte("m")).Replicas()
	if now[0] != old[0] || now[0].Outstanding() != 1 {
		t.Fatalf("unchanged replica: new object or lost its load (%d)", now[0].Outstanding())
	}
	if now[1] == old[1] || !now[1].Healthy() || now[1].Spec().PolicyVersion != "v2" {
		t.Fatalf("changed replica: kept the old object or its health: %+v healthy=%v", now[1].Spec(), now[1].Healthy())
	}
	if t2.Lookup("other") != t2.Wildcard() || t2.Pool([]byte("other")) != nil || t2.Empty() {
		t.Fatal("the wildcard pool does not serve unlisted models")
	}
	if got := t2.InFlight(); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
	if k, ok := now[1].ResolvedKind(); !ok || k != openai.KindSGLang {
		t.Fatalf("configured kind: %v %v", k, ok)
	}

	err = s.Replace([]Backend{{Model: "m"}})
	if err == nil || !strings.Contains(err.Error(), `backends[0] (model "m"): no replicas`) {
		t.Fatalf("empty pool: %v", err)
	}
	if s.Load() != t2 {
		t.Fatal("a refused table replaced the current one")
	}
	v := t2.View()
	if len(v) != 2 || v[0].Model != "m" || v[0].Routing != RoutingAffine || v[0].LoadFactor != DefaultRoutingLoadFactor ||
		v[0].Replicas[0].Outstanding != 1 || v[0].Replicas[0].ResolvedKind != "vllm" || v[0].Replicas[1].PolicyVersion != "v2" {
		t.Fatalf("view: %+v", v)
	}
}

// TestCheckLoopMarksHealth: the active checks take a replica whose engine
// answers 503 on /health (and /v1/models) out of selection after
// UnhealthyAfter checks, and bring it back once it answers 200.
func TestCheckLoopMarksHealth(t *testing.T) {
	var up atomic.Bool
	var checks atomic.Int64
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checks.Add(1)
		if up.Load() {
			fmt.Fprint(w, `{}`)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer eng.Close()
	s, err := New([]Backend{{Model: "m", Replicas: []Replica{{URL: eng.URL + "/v1", Kind: "vllm"}}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Load().Pool([]byte("m")).Replicas()[0]
	stop := make(chan struct{})
	defer close(stop)
	go s.CheckLoop(stop, Health{Interval: 5 * time.Millisecond, UnhealthyAfter: 2, Cooldown: time.Hour})
	testenv.WaitFor(t, 10*time.Second, func() string { return fmt.Sprintf("healthy after %d checks", checks.Load()) },
		func() bool { return !r.Healthy() })
	up.Store(true)
	testenv.WaitFor(t, 10*time.Second, func() string { return fmt.Sprintf("unhealthy after %d checks", checks.Load()) }, r.Healthy)
}

// TestNamedFindsEveryPool: Named yields the replicas of that name across
// pools, the first engine with a filler deciding capture's id fallback.
func TestNamedFindsEveryPool(t *testing.T) {
	s, err := New([]Backend{
		{Model: "a", Replicas: []Replica{{Name: "gpu", URL: "http://10.0.0.1:8000/v1", Kind: "openai"}}},
		{Model: "b", Replicas: []Replica{{Name: "gpu", URL: "http://10.0.0.1:8000/v1", Kind: "llamacpp"}, {Name: "cpu", URL: "http://10.0.0.2:8000/v1", Kind: "vllm"}}},
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var fillers, named int
	for r := range s.Load().Named("gpu") {
		named++
		if e := r.Engine(); engines.Filler(e.Kind, e.BaseURL) != nil {
			fillers++
			if e.Kind != openai.KindLlamaCpp || e.BaseURL != "http://10.0.0.1:8000/v1" {
				t.Fatalf("a llama.cpp replica's filler is not the llama.cpp one: %+v", e)
			}
		}
	}
	if named != 2 || fillers != 1 {
		t.Fatalf("named %d, with a filler %d; want 2 and 1", named, fillers)
	}
}
