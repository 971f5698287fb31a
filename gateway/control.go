package gateway

import (
	"context"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/seqstore"
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

// Backends returns the routing table, replica state and drain state.
func (s *Server) Backends() BackendsView {
	return BackendsView{Backends: s.backends.Load().View(), Drain: s.PauseState()}
}

// ReplaceBackends swaps the routing table and returns the new one as
// Backends shows it. In-flight calls keep the replica they were sent to; new
// calls use the new table. The error says what is wrong with backends; the
// table is then unchanged.
func (s *Server) ReplaceBackends(spec []Backend) (BackendsView, error) {
	if err := tokenInKinds(s.cfg.TokenIn, spec); err != nil {
		return BackendsView{}, err
	}
	if err := s.backends.Replace(spec); err != nil {
		return BackendsView{}, err
	}
	s.log.Info("routing table replaced", "models", len(spec))
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

// RolloutSeen reports whether this gateway admitted a call of the rollout,
// or, with a sequence store, any gateway sharing its database did (within
// its retention): true before the calls' capture is stored.
func (s *Server) RolloutSeen(ctx context.Context, rolloutID string) (bool, error) {
	seen := false
	s.seq.forRollout(rolloutID, func(*seqEntry) { seen = true })
	if seen {
		return true, nil
	}
	s.seq.mu.RLock()
	st := s.seq.store
	s.seq.mu.RUnlock()
	if f, ok := st.(seqstore.RolloutFinder); ok {
		return f.HasRollout(ctx, rolloutID)
	}
	return false, nil
}

// ClientAuthorized reports whether the request carries an accepted client
// API key (always true when client keys are off).
func (s *Server) ClientAuthorized(ctx *fasthttp.RequestCtx) bool {
	_, ok := s.clientKeyName(ctx)
	return ok
}
