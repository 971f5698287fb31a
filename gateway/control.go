package gateway

import (
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/openai"
)

// ControlPlane serves the routes the gateway hands over to it: every path
// under /api/v1/ and OTLP trace ingest (POST /v1/traces, also under the
// per-rollout prefix). Package controlplane implements it; cmd/rollgate
// mounts it with SetControlPlane.
type ControlPlane interface {
	// ServeAPI answers an /api/v1 request; sub is the path after "/api/v1".
	ServeAPI(ctx *fasthttp.RequestCtx, sub string)
	// ServeTraces answers an OTLP/HTTP trace export attributed (by the
	// per-rollout path or headers) to rolloutID and attemptID, which may be
	// empty.
	ServeTraces(ctx *fasthttp.RequestCtx, rolloutID, attemptID string)
}

// SetControlPlane mounts cp on /api/v1/ and /v1/traces. Call it before
// Serve. Without one those paths answer 404.
func (s *Server) SetControlPlane(cp ControlPlane) { s.control = cp }

// BackendsView is the routing table as GET /api/v1/backends shows it.
type BackendsView struct {
	Backends []BackendView `json:"backends"`
	Drain    PauseView     `json:"drain"`
}

// BackendView is one model's pool of replicas.
type BackendView struct {
	Model    string        `json:"model"`
	Replicas []ReplicaView `json:"replicas"`
	// Routing and LoadFactor are the pool's effective policy (defaults resolved).
	Routing    string  `json:"routing"`
	LoadFactor float64 `json:"load_factor,omitempty"`
}

// ReplicaView is one replica: its configuration, the engine kind it was
// found to be, the calls it holds and whether it is healthy.
type ReplicaView struct {
	Replica
	ResolvedKind string `json:"resolved_kind,omitempty"`
	Outstanding  int64  `json:"outstanding"`
	Healthy      bool   `json:"healthy"`
}

// Backends returns the routing table, replica state and drain state.
func (s *Server) Backends() BackendsView {
	t := s.table.Load()
	doc := BackendsView{Backends: []BackendView{}, Drain: s.PauseState()}
	for _, b := range t.spec {
		p := t.lookup(b.Model)
		if b.Model == "*" {
			p = t.wildcard
		}
		v := BackendView{Model: b.Model}
		v.Routing, v.LoadFactor = routingOf(p.sel)
		for _, r := range p.replicas {
			rv := ReplicaView{Replica: r.spec, Outstanding: r.outstanding.Load(), Healthy: r.healthy()}
			if r.kindOK.Load() {
				rv.ResolvedKind = openai.Kind(r.kind.Load()).String()
			}
			v.Replicas = append(v.Replicas, rv)
		}
		doc.Backends = append(doc.Backends, v)
	}
	return doc
}

// ReplaceBackends swaps the routing table and returns the new one as
// Backends shows it. In-flight calls keep the replica they were sent to; new
// calls use the new table. The error says what is wrong with backends; the
// table is then unchanged.
func (s *Server) ReplaceBackends(backends []Backend) (BackendsView, error) {
	s.tableMu.Lock()
	defer s.tableMu.Unlock()
	t, err := buildTable(backends, s.table.Load(), &s.clients, s.upstreamKeys)
	if err != nil {
		return BackendsView{}, err
	}
	s.table.Store(t)
	s.log.Info("routing table replaced", "models", len(backends))
	return s.Backends(), nil
}

// RegisterRollout records a registered rollout's task id: the rollout's
// calls, those already made included, are captured with it.
func (s *Server) RegisterRollout(rolloutID, taskID string) {
	s.rollouts.Store(rolloutID, taskID)
	s.noteRegistered(rolloutID, taskID)
}

// NextSequenceID takes the next sequence id of (rolloutID, attemptID), as a
// proxied call would. The error (only with a sequence store) says no block
// could be reserved in time.
func (s *Server) NextSequenceID(rolloutID, attemptID string) (uint64, error) {
	return s.seq.next(rolloutID, attemptID)
}

// ClientAuthorized reports whether the request carries an accepted client
// API key (always true when client keys are off).
func (s *Server) ClientAuthorized(ctx *fasthttp.RequestCtx) bool {
	_, ok := s.clientKeyName(ctx)
	return ok
}
