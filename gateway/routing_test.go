package gateway

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/metrics"
)

// TestAffinitySelectAllocatesNothing: the selection and its counter are on
// every call's path.
func TestAffinitySelectAllocatesNothing(t *testing.T) {
	b := Backend{Model: "m", Routing: RoutingAffine}
	for i := range 4 {
		b.Replicas = append(b.Replicas, Replica{URL: fmt.Sprintf("http://10.0.0.%d:8000/v1", i+1), Kind: "vllm"})
	}
	set, err := backends.New([]Backend{b}, backends.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := set.Load().Pool([]byte("m"))
	m := metrics.New()
	s := &Server{affinity: newRouteCounters(m)}
	ro := []byte("ro-0123456789abcdef")
	tried := make([]*backends.Upstream, 0, 4)
	allocs := testing.AllocsPerRun(1000, func() {
		r := s.pick(p, ro, tried[:0])
		r.Acquire() // some load, so that the bound is exercised
		if s.pick(p, nil, tried[:0]) == nil {
			panic("no replica")
		}
	})
	if allocs != 0 {
		t.Fatalf("selection allocates %.1f times per call, want 0", allocs)
	}
	if hit := testutil.ToFloat64(m.RoutingAffinity.WithLabelValues("hit")); hit == 0 {
		t.Fatal("rollgate_routing_affinity_total{outcome=hit} not counted")
	}
	if fb := testutil.ToFloat64(m.RoutingAffinity.WithLabelValues("fallback")); fb == 0 {
		t.Fatal("rollgate_routing_affinity_total{outcome=fallback} not counted")
	}
}
