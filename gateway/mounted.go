package gateway

import (
	"fmt"
	"iter"

	"github.com/rollgate/rollgate/gateway/backends"
)

// NewMountedBackends returns a routing table of a mounted surface's own,
// apart from the operator's (Config.Backends, ReplaceBackends): Agent
// Lightning's POST /api/models registers its endpoints there. Its pools
// serve only the calls that name one of them (AgentCall.Pool); the
// gateway's own routes, GET /v1/models and GET /api/v1/backends never see
// them. The table is empty until Replace; its replicas get the gateway's
// HTTP clients, health checks and engine-kind probes, and their calls count
// in the drain state's in_flight.
func (s *Server) NewMountedBackends() (*backends.Set, error) {
	set, err := backends.New(nil, s.backendOpts)
	if err != nil {
		return nil, fmt.Errorf("gateway: a mounted surface's routing table: %w", err)
	}
	s.mountMu.Lock()
	var next []*backends.Set
	if old := s.mountedSets.Load(); old != nil {
		next = append(next, *old...)
	}
	next = append(next, set)
	s.mountedSets.Store(&next)
	s.mountMu.Unlock()
	go set.CheckLoop(s.stop, s.health)
	return set, nil
}

// tables yields the operator's routing table and then every mounted one.
func (s *Server) tables() iter.Seq[*backends.Table] {
	return func(yield func(*backends.Table) bool) {
		if !yield(s.backends.Load()) {
			return
		}
		if ms := s.mountedSets.Load(); ms != nil {
			for _, set := range *ms {
				if !yield(set.Load()) {
					return
				}
			}
		}
	}
}

// named yields the replicas named name of every table (the operator's
// first), as a captured row's backend names them.
func (s *Server) named(name string) iter.Seq[*backends.Upstream] {
	return func(yield func(*backends.Upstream) bool) {
		for t := range s.tables() {
			for r := range t.Named(name) {
				if !yield(r) {
					return
				}
			}
		}
	}
}

// inFlight is the number of calls outstanding on the replicas of every
// table.
func (s *Server) inFlight() int64 {
	var n int64
	for t := range s.tables() {
		n += t.InFlight()
	}
	return n
}
