package gateway

import (
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

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
