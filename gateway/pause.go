package gateway

import (
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// pauser holds new calls while a trainer updates weights (POST
// /api/v1/pause ... /resume). Calls already sent upstream finish normally.
type pauser struct {
	mu      sync.Mutex
	paused  bool
	since   time.Time
	abort   bool          // paused in mode abort (resume.go)
	resumed chan struct{} // closed on resume
}

// state returns whether calls are held, since when, and the channel that
// closes on resume.
func (p *pauser) state() (bool, time.Time, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused, p.since, p.resumed
}

// Pause holds new calls until Resume (or PauseMaxHold); calls already sent
// upstream finish normally.
func (s *Server) Pause() {
	s.pause.pause()
	s.log.Info("paused: holding new calls", "in_flight", s.PauseState().InFlight)
}

// Resume releases the held calls.
func (s *Server) Resume() {
	s.pause.resume()
	s.log.Info("resumed: releasing held calls")
}

func (p *pauser) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused, p.since, p.resumed = true, time.Now(), make(chan struct{})
	}
}

// setAbort marks the pause as one in mode abort.
func (p *pauser) setAbort() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.abort = p.paused
}

// abortMode returns whether calls are held and whether in mode abort.
func (p *pauser) abortMode() (paused, abort bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused, p.abort
}

func (p *pauser) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused, p.abort = false, false
		close(p.resumed)
	}
}

// waitIfPaused holds the call while the gateway is paused, up to
// PauseMaxHold; then it answers 503 with Retry-After and returns false.
func (s *Server) waitIfPaused(ctx *fasthttp.RequestCtx, c *call) bool {
	paused, _, resumed := s.pause.state()
	if !paused {
		return true
	}
	s.held.Add(1)
	defer s.held.Add(-1)
	t := time.NewTimer(s.cfg.PauseMaxHold)
	defer t.Stop()
	select {
	case <-resumed:
		return true
	case <-t.C:
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
		s.reject(ctx, c, rejectPaused, fasthttp.StatusServiceUnavailable, errServer,
			"the gateway is paused for a weight update and did not resume within pause_max_hold; retry later")
		return false
	}
}

const retryAfterSeconds = 5

// PauseState returns the drain state: whether new calls are held (and in
// which mode), how many are held, how many are still in flight upstream and
// how many aborted streams wait for the resume (not in flight: they hold no
// replica).
func (s *Server) PauseState() PauseView {
	paused, since, _ := s.pause.state()
	_, abort := s.pause.abortMode()
	inflight := s.inFlight()
	v := PauseView{Paused: paused, HeldCalls: s.held.Load(), InFlight: inflight, Drained: paused && inflight == 0, State: "running",
		ParkedStreams: s.resumables.parked.Load()}
	if paused {
		v.Mode = PauseWait
		if abort {
			v.Mode = PauseAbort
		}
		v.PausedSince = since.UnixNano()
		v.State = "draining"
		if v.Drained {
			v.State = "paused"
		}
	}
	return v
}
