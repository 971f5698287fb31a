package backends

// Rollout-affine routing: the calls of one rollout go to one replica of the
// model's pool while it is healthy and not overloaded, so that the engine's
// prefix cache (vLLM's automatic prefix caching, SGLang's radix cache) holds
// the conversation a multi-turn agent resends every turn and only the new
// turn is prefilled.
//
// The replica is chosen by rendezvous (highest-random-weight) hashing of the
// rollout id with each replica's URL, with bounded load as in "consistent
// hashing with bounded loads" (Mirrokni, Thorup, Zadimoghaddam, SODA 2018):
// a replica already holding ceil(c × (total outstanding + 1) / healthy
// replicas) calls or more is skipped, and the next replica in the rollout's
// rendezvous order takes the call. So no replica carries more than about c
// times the average load, and when a replica leaves (unhealthy, removed,
// overloaded) only the rollouts it served move, each to its own next choice.
//
// The hash is deterministic (xxhash, no per-process seed as hash/maphash
// has), so every gateway behind a load balancer sends a rollout to the same
// replica, and so does a restarted gateway.

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Routing policies (Backend.Routing, gateway.Config.Routing, serve --routing).
const (
	// RoutingAffine sends the calls of one rollout to one replica while it is
	// healthy and not overloaded (see Affine). The default.
	RoutingAffine = "affine"
	// RoutingLeastOutstanding sends every call to the replica with the fewest
	// outstanding calls (see LeastOutstanding).
	RoutingLeastOutstanding = "least_outstanding"
	// DefaultRoutingLoadFactor is the default bound c of affine routing.
	DefaultRoutingLoadFactor = 1.25
)

// RouteOutcome says how a replica was selected, for the counter
// rollgate_routing_affinity_total.
type RouteOutcome uint8

// Outcomes of a selection.
const (
	// RouteUncounted: a least_outstanding pool's selection (not counted).
	RouteUncounted RouteOutcome = iota
	// RouteHit: the rollout's own replica, the first of its rendezvous order.
	RouteHit
	// RouteSpill: a later replica of the rollout's order, because its own was
	// unhealthy, over the load bound or already tried by this call.
	RouteSpill
	// RouteFallback: least outstanding, because the call names no rollout or
	// no replica is healthy.
	RouteFallback
	// NumRouteOutcomes is the number of outcomes (for arrays indexed by them).
	NumRouteOutcomes
)

var routeOutcomeNames = [NumRouteOutcomes]string{RouteHit: "hit", RouteSpill: "spill", RouteFallback: "fallback"}

// String is the outcome's label in rollgate_routing_affinity_total ("hit",
// "spill", "fallback"); "" for RouteUncounted.
func (o RouteOutcome) String() string {
	if o >= NumRouteOutcomes {
		return ""
	}
	return routeOutcomeNames[o]
}

// Selector picks a replica of a pool for one call of rollout (nil when the
// call names none), skipping those in exclude (already tried for this call),
// and says how it chose. It returns nil when none is left.
type Selector interface {
	Select(p *Pool, rollout []byte, exclude []*Upstream) (*Upstream, RouteOutcome)
}

// LeastOutstanding picks the healthy replica with the fewest outstanding
// requests relative to its weight; ties rotate. When every candidate is
// unhealthy it still picks one (the least loaded), so a pool never refuses
// calls only because checks failed.
type LeastOutstanding struct{}

// Select implements Selector; the rollout plays no part.
func (LeastOutstanding) Select(p *Pool, _ []byte, exclude []*Upstream) (*Upstream, RouteOutcome) {
	now := time.Now().UnixNano()
	if r := leastLoaded(p, exclude, now, true); r != nil {
		return r, RouteUncounted
	}
	return leastLoaded(p, exclude, now, false), RouteUncounted
}

func leastLoaded(p *Pool, exclude []*Upstream, now int64, healthyOnly bool) *Upstream {
	n := len(p.replicas)
	start := int(p.next.Add(1) % uint64(n))
	var best *Upstream
	var bestLoad int64
	for i := range n {
		r := p.replicas[(start+i)%n]
		if slices.Contains(exclude, r) || (healthyOnly && r.unhealthyUntil.Load() > now) {
			continue
		}
		w := int64(r.spec.Weight)
		if w <= 0 {
			w = 1
		}
		load := r.outstanding.Load() * 1000 / w
		if best == nil || load < bestLoad {
			best, bestLoad = r, load
		}
	}
	return best
}

var _ Selector = LeastOutstanding{}

// Affine is rollout-affine selection: rendezvous hashing of the rollout id
// with bounded load (see the top of affinity.go). Calls without a rollout
// id, and calls finding no healthy replica, are routed as by
// LeastOutstanding. Replica weights scale both a replica's share of rollouts
// (weighted rendezvous: score = -ln(u)/weight) and its load bound.
type Affine struct {
	// LoadFactor is c ≥ 1: a replica is skipped while its outstanding calls
	// are at or above ceil(c × (total outstanding + 1) × weight / healthy
	// weight). +Inf disables the bound (pure rendezvous hashing).
	LoadFactor float64
}

// Select implements Selector without allocating.
func (a Affine) Select(p *Pool, rollout []byte, exclude []*Upstream) (*Upstream, RouteOutcome) {
	if len(rollout) == 0 {
		r, _ := LeastOutstanding{}.Select(p, nil, exclude)
		return r, RouteFallback
	}
	now := time.Now().UnixNano()
	var (
		total int64
		sumW  float64
	)
	for _, r := range p.replicas {
		if r.unhealthyUntil.Load() > now || slices.Contains(exclude, r) {
			continue
		}
		total += r.outstanding.Load()
		sumW += r.weight()
	}
	if sumW == 0 { // nothing healthy left: least loaded of the rest
		return leastLoaded(p, exclude, now, false), RouteFallback
	}
	h := xxhash.Sum64(rollout)
	var (
		best, home           *Upstream
		bestScore, homeScore float64
	)
	for _, r := range p.replicas {
		w := r.weight()
		sc := rendezvousScore(h, r.key, w)
		if home == nil || sc < homeScore {
			home, homeScore = r, sc
		}
		if r.unhealthyUntil.Load() > now || slices.Contains(exclude, r) {
			continue
		}
		bound := math.Ceil(a.LoadFactor * float64(total+1) * w / sumW)
		if float64(r.outstanding.Load()) >= bound {
			continue
		}
		if best == nil || sc < bestScore {
			best, bestScore = r, sc
		}
	}
	if best == nil {
		// Some replica is always under the bound (c ≥ 1); the counters moved
		// between the two passes. Least loaded of the healthy ones.
		return leastLoaded(p, exclude, now, true), RouteSpill
	}
	if best == home {
		return best, RouteHit
	}
	return best, RouteSpill
}

var _ Selector = Affine{}

// weight is the replica's selection weight (at least 1).
func (r *Upstream) weight() float64 {
	if r.spec.Weight <= 0 {
		return 1
	}
	return float64(r.spec.Weight)
}

// replicaHashKey is the hash of a replica's identity in rendezvous hashing: its
// URL, so a replica keeps its rollouts across table swaps and renames.
func replicaHashKey(url string) uint64 { return xxhash.Sum64String(url) }

// rendezvousScore is the weighted rendezvous score of a rollout (hash h) on
// a replica (hash key, weight w): -ln(u)/w with u uniform in (0, 1) from
// the hash of the pair. The lowest score wins; with equal weights that is
// the highest hash.
func rendezvousScore(h, key uint64, w float64) float64 {
	var pair [16]byte
	binary.LittleEndian.PutUint64(pair[:8], h)
	binary.LittleEndian.PutUint64(pair[8:], key)
	x := xxhash.Sum64(pair[:])
	u := (float64(x>>11) + 0.5) / (1 << 53)
	return -math.Log(u) / w
}

// validRouting checks a routing policy and load factor ("" and 0 mean the
// default), naming them as the fields routingField and lfField.
func validRouting(routing string, loadFactor float64, routingField, lfField string) error {
	switch routing {
	case "", RoutingAffine, RoutingLeastOutstanding:
	default:
		return fmt.Errorf("%s %q is not one of %s, %s", routingField, routing, RoutingAffine, RoutingLeastOutstanding)
	}
	if !(loadFactor == 0 || loadFactor >= 1) {
		return fmt.Errorf("%s %v is below 1: affine routing needs c ≥ 1 (default %v; larger keeps rollouts on their replica under more imbalance)", lfField, loadFactor, DefaultRoutingLoadFactor)
	}
	return nil
}

// poolSelector returns the selector of backend b: its own routing and load
// factor, else the gateway's (routing, loadFactor; "" and 0 = the defaults).
func poolSelector(b Backend, routing string, loadFactor float64) (Selector, error) {
	if err := validRouting(routing, loadFactor, "routing (--routing)", "routing_load_factor (--routing-load-factor)"); err != nil {
		return nil, err
	}
	if routing == "" {
		routing = RoutingAffine
	}
	lf := DefaultRoutingLoadFactor
	if loadFactor != 0 {
		lf = loadFactor
	}
	if b.Routing != "" {
		routing = b.Routing
	}
	if b.LoadFactor != 0 {
		lf = b.LoadFactor
	}
	if routing == RoutingLeastOutstanding {
		return LeastOutstanding{}, nil
	}
	return Affine{LoadFactor: lf}, nil
}

// routingOf describes a pool's selector for GET /api/v1/backends.
func routingOf(sel Selector) (routing string, loadFactor float64) {
	if a, ok := sel.(Affine); ok {
		return RoutingAffine, a.LoadFactor
	}
	return RoutingLeastOutstanding, 0
}
