package gateway

import (
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/openai"
)

// TestRouteTableAllocatesNothing: finding an agent route is on every
// call's path; it must not allocate, for the model routes (routeOf), under
// the rollout prefix, and for a route answered in full (/healthz).
func TestRouteTableAllocatesNothing(t *testing.T) {
	paths := map[string]openai.Endpoint{
		"/v1/chat/completions": openai.ChatCompletions, "/v1/completions": openai.Completions,
		"/v1/responses": openai.Responses, "/v1/embeddings": openai.Embeddings,
		"/v1/models": openai.Unknown, "/api/v1/rollouts": openai.Unknown, "/nothing/here/at/all/of/any/length": openai.Unknown,
	}
	for p, want := range paths {
		b := []byte(p)
		if got := routeOf(b); got != want {
			t.Errorf("routeOf(%s) = %v, want %v", p, got, want)
		}
		if a := testing.AllocsPerRun(100, func() { routeOf(b) }); a != 0 {
			t.Errorf("routeOf(%s) allocates %.1f times, want 0", p, a)
		}
	}
	s := routeServer(t)
	for _, p := range []string{"/healthz", "/rollout/ro-1/attempt/at-1/healthz"} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("GET")
		ctx.Request.SetRequestURI(p)
		if a := testing.AllocsPerRun(100, func() { ctx.Response.Reset(); s.Handle(&ctx) }); a != 0 {
			t.Errorf("GET %s allocates %.1f times, want 0", p, a)
		}
		if ctx.Response.StatusCode() != 200 || string(ctx.Response.Body()) != `{"status":"ok"}` {
			t.Errorf("GET %s: %d %s", p, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}
