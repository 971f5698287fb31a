//go:build !race

// The race detector makes sync.Pool drop items at random, so allocation counts are only
// meaningful without it.

package mock

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// TestChatNonStreamAllocs pins the allocation budget of the non-streaming hot path, in
// every flavour.
func TestChatNonStreamAllocs(t *testing.T) {
	for _, fl := range Flavors {
		s := New(Config{Flavor: fl})
		h := s.Handler()
		var ctx fasthttp.RequestCtx
		req := []byte(`{"model":"m","messages":[{"role":"user","content":"Hello there"}],"return_token_ids":true,"logprobs":true}`)
		if fl == FlavorVLLM {
			req = []byte(`{"model":"m","messages":[{"role":"user","content":"Hello there"}],"return_token_ids":true}`)
		}
		serveInMemory(h, &ctx, PathChat, req)
		allocs := testing.AllocsPerRun(200, func() { serveInMemory(h, &ctx, PathChat, req) })
		if allocs > 2 {
			t.Fatalf("%s: non-streaming chat allocates %.1f times per request, want <= 2", fl, allocs)
		}
	}
}
