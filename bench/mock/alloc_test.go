//go:build !race

// The race detector makes sync.Pool drop items at random, so allocation counts are only
// meaningful without it.

package mock

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestChatNonStreamAllocs pins the allocation budget of the non-streaming hot path.
func TestChatNonStreamAllocs(t *testing.T) {
	s := New(Config{})
	h := s.Handler()
	var ctx fasthttp.RequestCtx
	req := []byte(`{"model":"m","messages":[{"role":"user","content":"Hello there"}],"return_token_ids":true}`)
	serveInMemory(h, &ctx, PathChat, req)
	allocs := testing.AllocsPerRun(200, func() { serveInMemory(h, &ctx, PathChat, req) })
	if allocs > 2 {
		t.Fatalf("non-streaming chat allocates %.1f times per request, want <= 2", allocs)
	}
}
