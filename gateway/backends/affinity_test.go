package backends

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

// affinePool builds the pool of one model served by replicas at urls
// (weights: 1 unless given), through buildTable as the gateway does. The
// replicas are never contacted.
func affinePool(t testing.TB, old *Table, urls []string, weights ...int) (*Table, *Pool) {
	t.Helper()
	b := Backend{Model: "m", Routing: RoutingAffine}
	for i, u := range urls {
		w := 1
		if i < len(weights) {
			w = weights[i]
		}
		b.Replicas = append(b.Replicas, Replica{URL: u, Kind: "vllm", Weight: w})
	}
	tb, err := buildTable([]Backend{b}, old, &clientCache{}, &UpstreamKeys{}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	return tb, tb.pools["m"]
}

func replicaURLs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("http://10.0.0.%d:8000/v1", i+1)
	}
	return out
}

func rolloutID(i int) []byte { return []byte(fmt.Sprintf("ro-%08x", i)) }

// homes maps each of n rollouts to the URL of the replica p selects for it.
func homes(p *Pool, n int) []string {
	out := make([]string, n)
	for i := range out {
		r, _ := p.sel.Select(p, rolloutID(i), nil)
		out[i] = r.spec.URL
	}
	return out
}

func TestAffinityDistributionIsEven(t *testing.T) {
	f := func(weights []int, want []float64) {
		t.Helper()
		_, p := affinePool(t, nil, replicaURLs(len(weights)), weights...)
		const n = 40000
		count := map[string]int{}
		for _, u := range homes(p, n) {
			count[u]++
		}
		for i, u := range replicaURLs(len(weights)) {
			share := float64(count[u]) / n
			// 5% relative: over 10 standard deviations of a fair split here.
			if math.Abs(share-want[i]) > 0.05*want[i] {
				t.Errorf("weights %v: replica %d got %.3f of the rollouts, want %.3f", weights, i, share, want[i])
			}
		}
	}
	f([]int{1, 1, 1, 1}, []float64{0.25, 0.25, 0.25, 0.25})
	f([]int{1, 1, 2}, []float64{0.25, 0.25, 0.5})
	f([]int{1, 1, 1, 1, 1, 1, 1, 1}, []float64{0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125, 0.125})
}

func TestAffinityRolloutSticksToItsReplica(t *testing.T) {
	_, p := affinePool(t, nil, replicaURLs(4))
	for i := range 200 {
		ro := rolloutID(i)
		first, o := p.sel.Select(p, ro, nil)
		if o != RouteHit {
			t.Fatalf("rollout %s: outcome %d, want hit", ro, o)
		}
		// Its later turns, while other calls keep every replica busy evenly.
		for _, r := range p.replicas {
			r.outstanding.Add(3)
		}
		for turn := range 5 {
			r, o := p.sel.Select(p, ro, nil)
			if r != first || o != RouteHit {
				t.Fatalf("rollout %s turn %d: went to %s (outcome %d), its first call to %s", ro, turn, r.spec.URL, o, first.spec.URL)
			}
		}
		for _, r := range p.replicas {
			r.outstanding.Add(-3)
		}
	}
}

func TestAffinityUnhealthyReplicaMovesOnlyItsRollouts(t *testing.T) {
	_, p := affinePool(t, nil, replicaURLs(4))
	const n = 4000
	before := homes(p, n)
	sick := p.replicas[2]
	sick.unhealthyUntil.Store(time.Now().Add(time.Hour).UnixNano())
	after := homes(p, n)
	movedTo := map[string]int{}
	for i := range n {
		switch {
		case before[i] == sick.spec.URL && after[i] == sick.spec.URL:
			t.Fatalf("rollout %d still on the unhealthy replica", i)
		case before[i] == sick.spec.URL:
			movedTo[after[i]]++
			if _, o := p.sel.Select(p, rolloutID(i), nil); o != RouteSpill {
				t.Fatalf("rollout %d moved off an unhealthy replica: outcome %d, want spill", i, o)
			}
		case after[i] != before[i]:
			t.Fatalf("rollout %d moved from %s to %s although its replica is healthy", i, before[i], after[i])
		}
	}
	// The moved rollouts spread over the three others (their second choices).
	if len(movedTo) != 3 {
		t.Fatalf("the unhealthy replica's rollouts went to %v, want all three others", movedTo)
	}
	for u, c := range movedTo {
		if c < n/4/3/2 {
			t.Errorf("only %d of the moved rollouts went to %s: %v", c, u, movedTo)
		}
	}
	// Healthy again: every rollout is back home.
	sick.MarkSuccess()
	if back := homes(p, n); strings.Join(back, ",") != strings.Join(before, ",") {
		t.Fatal("rollouts did not return to their replica once it was healthy")
	}
}

func TestAffinityRemovingOrAddingAReplicaMovesOnlyItsRollouts(t *testing.T) {
	urls := replicaURLs(5)
	old, p4 := affinePool(t, nil, urls[:4])
	const n = 4000
	before := homes(p4, n)

	// Remove replica 1: only its rollouts move.
	_, p3 := affinePool(t, old, []string{urls[0], urls[2], urls[3]})
	for i, u := range homes(p3, n) {
		if before[i] != urls[1] && u != before[i] {
			t.Fatalf("rollout %d moved from %s to %s when %s was removed", i, before[i], u, urls[1])
		}
	}
	// Add replica 4: rollouts move only to it, about a fifth of them.
	_, p5 := affinePool(t, old, urls)
	moved := 0
	for i, u := range homes(p5, n) {
		if u != before[i] {
			if u != urls[4] {
				t.Fatalf("rollout %d moved from %s to %s, not to the added replica", i, before[i], u)
			}
			moved++
		}
	}
	if moved < n/5*9/10 || moved > n/5*11/10 {
		t.Fatalf("%d of %d rollouts moved to the added replica, want about a fifth", moved, n)
	}
}

func TestAffinityOverloadSpillsToTheNextReplica(t *testing.T) {
	_, p := affinePool(t, nil, replicaURLs(4))
	ro := rolloutID(7)
	home, _ := p.sel.Select(p, ro, nil)
	home.outstanding.Store(100) // the rest idle: far above the bound
	next, o := p.sel.Select(p, ro, []*Upstream{})
	if next == home || o != RouteSpill {
		t.Fatalf("overloaded home: got %s (outcome %d), want another replica, spill", next.spec.URL, o)
	}
	// The spill goes to the rollout's second choice: the one it gets when
	// its home is left out for any other reason.
	if second, _ := p.sel.Select(p, ro, []*Upstream{home}); second != next {
		t.Fatalf("spilled to %s, but the rollout's second choice is %s", next.spec.URL, second.spec.URL)
	}

	// The bound exactly: ceil(1.25 × (total+1) / 4). With 3 on the home
	// and 1 on each other replica, total 6: bound ceil(8.75/4) = 3, so 3 is
	// at the bound (spill) and 2 below it (hit).
	for _, r := range p.replicas {
		r.outstanding.Store(1)
	}
	home.outstanding.Store(3)
	if r, o := p.sel.Select(p, ro, nil); r == home || o != RouteSpill {
		t.Fatalf("home at the bound: got home=%v outcome %d, want a spill", r == home, o)
	}
	home.outstanding.Store(2) // total 5: bound ceil(7.5/4) = 2, home at it
	if r, o := p.sel.Select(p, ro, nil); r == home || o != RouteSpill {
		t.Fatalf("home at the bound (2 of bound 2): got home=%v outcome %d, want a spill", r == home, o)
	}
	home.outstanding.Store(1) // total 4: bound ceil(6.25/4) = 2, home below
	if r, o := p.sel.Select(p, ro, nil); r != home || o != RouteHit {
		t.Fatalf("home below the bound: got %s outcome %d, want home, hit", r.spec.URL, o)
	}
	// A larger load factor keeps the rollout home under the same load.
	home.outstanding.Store(3)
	if r, o := (Affine{LoadFactor: 2}).Select(p, ro, nil); r != home || o != RouteHit {
		t.Fatalf("c=2, home 3 of bound ceil(2×7/4)=4: got %s outcome %d, want home, hit", r.spec.URL, o)
	}
}

func TestAffinityRetryExcludesTheFailedReplica(t *testing.T) {
	_, p := affinePool(t, nil, replicaURLs(3))
	ro := rolloutID(1)
	var tried []*Upstream
	for range 3 {
		r, _ := p.sel.Select(p, ro, tried)
		for _, x := range tried {
			if r == x {
				t.Fatalf("selected %s again after it failed", r.spec.URL)
			}
		}
		tried = append(tried, r)
	}
	if r, _ := p.sel.Select(p, ro, tried); r != nil {
		t.Fatalf("every replica tried, got %s, want nil (the proxy then starts over)", r.spec.URL)
	}
}

func TestAffinityFallbacks(t *testing.T) {
	_, p := affinePool(t, nil, replicaURLs(3))
	p.replicas[0].outstanding.Store(5)
	p.replicas[1].outstanding.Store(1)
	p.replicas[2].outstanding.Store(3)
	// No rollout id: least outstanding.
	if r, o := p.sel.Select(p, nil, nil); r != p.replicas[1] || o != RouteFallback {
		t.Fatalf("no rollout: got %s outcome %d, want the least loaded, fallback", r.spec.URL, o)
	}
	// No healthy replica: least loaded of all, never a refusal.
	for _, r := range p.replicas {
		r.unhealthyUntil.Store(time.Now().Add(time.Hour).UnixNano())
	}
	if r, o := p.sel.Select(p, rolloutID(3), nil); r != p.replicas[1] || o != RouteFallback {
		t.Fatalf("none healthy: got %v outcome %d, want the least loaded, fallback", r, o)
	}
}

func TestRoutingSettingsAreChecked(t *testing.T) {
	f := func(b Backend, want string) {
		t.Helper()
		b.Model = "m"
		b.Replicas = []Replica{{URL: "http://127.0.0.1:1/v1"}}
		err := Validate([]Backend{b})
		switch {
		case want == "" && err != nil:
			t.Fatalf("%+v: %v", b, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("%+v: error %v, want one containing %q", b, err, want)
		}
	}
	f(Backend{}, "")
	f(Backend{Routing: "affine", LoadFactor: 1}, "")
	f(Backend{Routing: "least_outstanding"}, "")
	f(Backend{Routing: "sticky"}, `backends[0] (model "m"): routing "sticky" is not one of affine, least_outstanding`)
	f(Backend{LoadFactor: 0.5}, `backends[0] (model "m"): load_factor 0.5 is below 1`)
	f(Backend{LoadFactor: math.NaN()}, `load_factor NaN is below 1`)

	// The gateway-wide default says which setting to change.
	_, err := poolSelector(Backend{}, "round_robin", 0)
	if err == nil || !strings.Contains(err.Error(), `routing (--routing) "round_robin" is not one of`) {
		t.Fatalf("bad Config.Routing: %v", err)
	}
	// A pool's own routing overrides the default.
	if sel, err := poolSelector(Backend{Routing: RoutingLeastOutstanding}, RoutingAffine, 0); err != nil || sel != (LeastOutstanding{}) {
		t.Fatalf("pool routing least_outstanding: %v %v", sel, err)
	}
	if _, err := poolSelector(Backend{}, "", 0.5); err == nil || !strings.Contains(err.Error(), "routing_load_factor (--routing-load-factor) 0.5 is below 1") {
		t.Fatalf("bad Config.RoutingLoadFactor: %v", err)
	}
	if sel, err := poolSelector(Backend{}, "", 2); err != nil || sel != (Affine{LoadFactor: 2}) {
		t.Fatalf("default affine with c=2: %v %v", sel, err)
	}
}

// TestPoolSelectAllocatesNothing: the selection is on every call's path
// (gateway's TestAffinitySelectAllocatesNothing adds the outcome's counter).
func TestPoolSelectAllocatesNothing(t *testing.T) {
	_, p := affinePool(t, nil, replicaURLs(4))
	ro := []byte("ro-0123456789abcdef")
	tried := make([]*Upstream, 0, 4)
	allocs := testing.AllocsPerRun(1000, func() {
		r, o := p.Select(ro, tried[:0])
		if o != RouteHit && o != RouteSpill {
			panic("rollout routed as " + o.String())
		}
		r.Acquire() // some load, so that the bound is exercised
		if r, o := p.Select(nil, tried[:0]); r == nil || o != RouteFallback {
			panic("no replica")
		}
	})
	if allocs != 0 {
		t.Fatalf("selection allocates %.1f times per call, want 0", allocs)
	}
}

func BenchmarkAffinitySelect(b *testing.B) {
	f := func(name string, sel Selector) {
		b.Run(name, func(b *testing.B) {
			_, p := affinePool(b, nil, replicaURLs(8))
			p.sel = sel
			ros := make([][]byte, 1024)
			for i := range ros {
				ros[i] = rolloutID(i)
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if r, _ := p.sel.Select(p, ros[i%len(ros)], nil); r == nil {
					b.Fatal("no replica")
				}
			}
		})
	}
	f("affine", Affine{LoadFactor: DefaultRoutingLoadFactor})
	f("least_outstanding", LeastOutstanding{})
}
