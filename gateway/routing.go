package gateway

import (
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/metrics"
)

// The routing table and replica health live in package backends; these
// names keep the gateway's Go API as it was.
type (
	// Backend is one model and the replicas that serve it (backends.Backend).
	Backend = backends.Backend
	// Replica is one inference server (backends.Replica).
	Replica = backends.Replica
	// BackendsView is the routing table as GET /api/v1/backends shows it.
	BackendsView = backends.View
	// BackendView is one model's pool of replicas.
	BackendView = backends.PoolView
	// ReplicaView is one replica with its state.
	ReplicaView = backends.ReplicaView
	// PauseView is the drain state.
	PauseView = backends.DrainView
)

// Routing policies (Backend.Routing, Config.Routing, serve --routing) and
// the default load bound of affine routing: see package backends.
const (
	RoutingAffine            = backends.RoutingAffine
	RoutingLeastOutstanding  = backends.RoutingLeastOutstanding
	DefaultRoutingLoadFactor = backends.DefaultRoutingLoadFactor
)

// ValidateBackends checks a routing table and says which entry is wrong.
func ValidateBackends(bs []Backend) error { return backends.Validate(bs) }

// routeCounters are rollgate_routing_affinity_total's series by outcome,
// resolved once so that counting allocates nothing.
type routeCounters [backends.NumRouteOutcomes]prometheus.Counter

func newRouteCounters(m *metrics.Metrics) routeCounters {
	var rc routeCounters
	for o := range backends.NumRouteOutcomes {
		if name := o.String(); name != "" {
			rc[o] = m.RoutingAffinity.WithLabelValues(name)
		}
	}
	return rc
}

// pick selects the replica of pool p for a call of rollout (nil: none),
// skipping those in exclude, and counts the outcome.
func (s *Server) pick(p *backends.Pool, rollout []byte, exclude []*backends.Upstream) *backends.Upstream {
	r, o := p.Select(rollout, exclude)
	if c := s.affinity[o]; c != nil {
		c.Inc()
	}
	return r
}

// backendClients says how the gateway's clients of backend origins are made:
// bounded dials, the idle timeout on every read (idleconn.go), and the
// transport that cancels the non-streamed calls of clients that hung up
// (transport.go).
func (s *Server) backendClients() backends.ClientConfig {
	connectTimeout, idle := s.cfg.ConnectTimeout, s.cfg.IdleTimeout
	return backends.ClientConfig{
		MaxResponseBodyBytes: s.cfg.MaxResponseBodyBytes,
		ReadBufferSize:       s.cfg.BackendReadBuffer,
		Transport:            &s.transport,
		Dial: func(addr string) (net.Conn, error) {
			conn, err := fasthttp.DialTimeout(addr, connectTimeout)
			if err != nil {
				return nil, err
			}
			host := hostOf(addr)
			return &idleConn{Conn: conn, idle: idle, unacked: func() { s.unreached.note(host) }}, nil
		},
	}
}
