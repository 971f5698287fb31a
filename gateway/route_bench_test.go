package gateway

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/gateway/seqstore"
	"github.com/rollgate/rollgate/internal/metrics"
)

// routeServer is a gateway that is never served: Handle is called on
// request contexts directly, so what is measured is the routing of a
// request and the answer of the route, not the network.
func routeServer(tb testing.TB) *Server {
	tb.Helper()
	m := metrics.New()
	pipe := capture.NewPipeline(capture.Config{}, nil, m, nil)
	seqs, err := seqstore.OpenSQLite(context.Background(), filepath.Join(tb.TempDir(), "sequences.db"), seqstore.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	s, err := New(Config{Backends: []Backend{{Model: "*", Replicas: []Replica{{URL: "http://127.0.0.1:1/v1", Kind: "vllm"}}}}, SequenceStore: seqs}, pipe, m, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { close(s.stop); seqs.Close() })
	return s
}

// BenchmarkRoute measures Handle on routes the gateway answers itself, so
// that the router's own cost shows: the liveness probe (bare and under the
// rollout prefix), a model route asked with the wrong method (405) and an
// unknown route (404).
//
//	go test -run '^$' -bench BenchmarkRoute -benchmem ./gateway/
func BenchmarkRoute(b *testing.B) {
	s := routeServer(b)
	for _, tc := range []struct{ name, method, path string }{
		{"healthz", "GET", "/healthz"},
		{"rollout-healthz", "GET", "/rollout/ro-1/attempt/at-1/healthz"},
		{"chat-wrong-method", "GET", "/v1/chat/completions"},
		{"unknown", "GET", "/v2/nothing"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var ctx fasthttp.RequestCtx
			ctx.Request.Header.SetMethod(tc.method)
			ctx.Request.SetRequestURI(tc.path)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				s.Handle(&ctx)
			}
		})
	}
}
