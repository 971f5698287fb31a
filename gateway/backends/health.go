package backends

import (
	"time"

	"github.com/valyala/fasthttp"
)

// MarkFailure records a failed call or check; after failThreshold
// consecutive failures the replica leaves selection for cooldown.
func (u *Upstream) MarkFailure(failThreshold int, cooldown time.Duration) {
	if int(u.fails.Add(1)) >= failThreshold {
		u.unhealthyUntil.Store(time.Now().Add(cooldown).UnixNano())
	}
}

// MarkSuccess records a successful call or check: the replica is healthy.
func (u *Upstream) MarkSuccess() {
	if u.fails.Load() != 0 {
		u.fails.Store(0)
	}
	if u.unhealthyUntil.Load() != 0 {
		u.unhealthyUntil.Store(0)
	}
	if u.unreachable.Load() {
		u.unreachable.Store(false)
	}
}

// Healthy reports whether the replica is in selection now.
func (u *Upstream) Healthy() bool { return u.unhealthyUntil.Load() <= time.Now().UnixNano() }

// checkHealth asks the replica's engine whether it is up: GET /health on its
// origin (vLLM, SGLang), falling back to GET {base}/models for other servers.
func (u *Upstream) checkHealth(timeout time.Duration) bool {
	for _, path := range []string{"/health", u.basePath + "/models"} {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI(u.origin + path)
		req.Header.SetMethod(fasthttp.MethodGet)
		if u.auth != "" {
			req.Header.Set("Authorization", u.auth)
		}
		err := u.client.DoTimeout(req, resp, timeout)
		ok := err == nil && resp.StatusCode() == 200
		if err == nil {
			_ = readBody(resp, 1<<20)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
		if ok {
			return true
		}
		if err != nil {
			return false // unreachable: no point trying another path
		}
	}
	return false
}

// Health configures the active health checks and what failures do.
type Health struct {
	// Interval is the period of the checks (negative: none).
	Interval time.Duration
	// UnhealthyAfter consecutive failures take a replica out of selection
	// for Cooldown.
	UnhealthyAfter int
	Cooldown       time.Duration
}

// CheckLoop checks every replica of the current table each h.Interval
// (GET /health, else GET {base}/models) until stop closes.
func (s *Set) CheckLoop(stop <-chan struct{}, h Health) {
	if h.Interval < 0 {
		return
	}
	t := time.NewTicker(h.Interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		for _, p := range s.Load().Pools() {
			for _, r := range p.replicas {
				ok := r.checkHealth(2 * time.Second)
				r.unreachable.Store(!ok)
				if ok {
					r.MarkSuccess()
				} else {
					r.MarkFailure(h.UnhealthyAfter, h.Cooldown)
				}
			}
		}
	}
}
