package gateway

import (
	"crypto/subtle"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	resumed chan struct{} // closed on resume
}

// state returns whether calls are held, since when, and the channel that
// closes on resume.
func (p *pauser) state() (bool, time.Time, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused, p.since, p.resumed
}

func (p *pauser) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.paused {
		p.paused, p.since, p.resumed = true, time.Now(), make(chan struct{})
	}
}

func (p *pauser) resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		p.paused = false
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

// pauseView is the drain state reported by pause/resume and GET backends.
type pauseView struct {
	Paused      bool   `json:"paused"`
	PausedSince int64  `json:"paused_since_unix_nano,omitempty"`
	HeldCalls   int64  `json:"held_calls"`
	InFlight    int64  `json:"in_flight"`
	Drained     bool   `json:"drained"`
	State       string `json:"state"`
}

func (s *Server) pauseState() pauseView {
	paused, since, _ := s.pause.state()
	var inflight int64
	t := s.table.Load()
	for _, p := range t.allPools() {
		for _, r := range p.replicas {
			inflight += r.outstanding.Load()
		}
	}
	v := pauseView{Paused: paused, HeldCalls: s.held.Load(), InFlight: inflight, Drained: paused && inflight == 0, State: "running"}
	if paused {
		v.PausedSince = since.UnixNano()
		v.State = "draining"
		if v.Drained {
			v.State = "paused"
		}
	}
	return v
}

func (s *Server) postPause(ctx *fasthttp.RequestCtx) {
	s.pause.pause()
	s.log.Info("paused: holding new calls", "in_flight", s.pauseState().InFlight)
	writeJSON(ctx, fasthttp.StatusOK, s.pauseState())
}

func (s *Server) postResume(ctx *fasthttp.RequestCtx) {
	s.pause.resume()
	s.log.Info("resumed: releasing held calls")
	writeJSON(ctx, fasthttp.StatusOK, s.pauseState())
}

// authorizedAdmin checks the admin token (constant-time) on every /api/v1
// route, reads included, when one is set. The scheme is matched without
// regard to case (RFC 9110 §11.1).
func (s *Server) authorizedAdmin(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.AdminToken == "" {
		return true
	}
	got := ctx.Request.Header.Peek("Authorization")
	if len(got) > 7 && strings.EqualFold(string(got[:7]), "bearer ") {
		got = got[7:]
	} else {
		got = nil
	}
	if got != nil && subtle.ConstantTimeCompare(got, []byte(s.cfg.AdminToken)) == 1 {
		return true
	}
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="rollgate admin"`)
	s.plainError(ctx, fasthttp.StatusUnauthorized, "authentication_error", "this /api/v1 route needs the admin token: Authorization: Bearer $ROLLGATE_ADMIN_TOKEN")
	return false
}

// healthLoop checks every replica actively until stop closes.
func (s *Server) healthLoop(stop <-chan struct{}) {
	if s.cfg.HealthInterval < 0 {
		return
	}
	t := time.NewTicker(s.cfg.HealthInterval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, p := range s.table.Load().allPools() {
			for _, r := range p.replicas {
				if r.checkHealth(2 * time.Second) {
					r.markSuccess()
				} else {
					r.markFailure(s.cfg.UnhealthyAfter, s.cfg.UnhealthyCooldown)
				}
			}
		}
	}
}

// acquireSlot takes a concurrency slot (MaxConcurrency), waiting up to
// QueueTimeout; when none frees up it answers 429 with Retry-After.
func (s *Server) acquireSlot(ctx *fasthttp.RequestCtx, c *call) bool {
	if s.slots == nil {
		return true
	}
	select {
	case s.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(s.cfg.QueueTimeout)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true
	case <-t.C:
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(retryAfterSeconds))
		s.reject(ctx, c, rejectConcurrency, fasthttp.StatusTooManyRequests, "rate_limit_error",
			fmt.Sprintf("the gateway is at its concurrency limit (%d calls in progress, max_concurrency) and no slot freed up within %s; retry later",
				cap(s.slots), s.cfg.QueueTimeout))
		return false
	}
}

func (s *Server) releaseSlot() {
	if s.slots != nil {
		<-s.slots
	}
}

// resolveClientKeys fills Key from KeyEnv and checks every key is usable.
func resolveClientKeys(keys []ClientKey) ([]ClientKey, error) {
	out := make([]ClientKey, 0, len(keys))
	for i, k := range keys {
		if k.Key == "" && k.KeyEnv != "" {
			k.Key = os.Getenv(k.KeyEnv)
		}
		if k.Name == "" || k.Key == "" {
			return nil, fmt.Errorf("client_keys[%d]: needs a name and a key (key_env %q is empty or unset)", i, k.KeyEnv)
		}
		out = append(out, k)
	}
	return out, nil
}

// clientKeyName checks the agent's API key (constant-time against every
// configured key) and returns its name; ok is true when keys are off.
func (s *Server) clientKeyName(ctx *fasthttp.RequestCtx) (name string, ok bool) {
	if len(s.clientKeys) == 0 {
		return "", true
	}
	got := ctx.Request.Header.Peek("Authorization")
	if len(got) > 7 && strings.EqualFold(string(got[:7]), "bearer ") {
		got = got[7:]
	} else if k := ctx.Request.Header.Peek("api-key"); len(k) > 0 {
		got = k
	}
	for _, k := range s.clientKeys {
		if subtle.ConstantTimeCompare(got, []byte(k.Key)) == 1 {
			name, ok = k.Name, true // keep comparing: constant time over the list
		}
	}
	return name, ok
}
