package gateway_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
	"github.com/rollgate/rollgate/internal/metrics"
)

// discard is a sink that stores nothing, so benchmarks measure the gateway
// and capture assembly, not a database.
type discard struct{}

func (discard) Write(context.Context, *export.Batch) error { return nil }

// benchTarget starts the mock and a gateway in front of it (capture into a
// discarding sink) and returns the mock's and the gateway's addresses.
func benchTarget(b *testing.B, tracing *gateway.Tracing) (mockAddr, gwAddr string) {
	return benchGateway(b, mock.Config{}, gateway.Config{Tracing: tracing})
}

// benchGateway starts the mock configured by mc and a gateway configured by
// cfg (its backend: every model to the mock) in front of it, capturing into
// a discarding sink, and returns the mock's and the gateway's addresses.
func benchGateway(b *testing.B, mc mock.Config, cfg gateway.Config) (mockAddr, gwAddr string) {
	ms, base, err := mock.Start(mc)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ms.Shutdown() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	m := metrics.New()
	pipe := capture.NewPipeline(capture.Config{}, []capture.NamedSink{{Name: "discard", Sink: discard{}}}, m, nil)
	// A real sequence store, with blocks so large that the benchmark's one
	// attempt reserves once: the calls measured take their ids from memory,
	// as calls of a known attempt do (BenchmarkSequenceFirstCall measures a
	// reservation).
	seqs, err := seqstore.OpenSQLite(context.Background(), filepath.Join(b.TempDir(), "sequences.db"),
		seqstore.Options{MinBlock: 1 << 40, MaxBlock: 1 << 40})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { seqs.Close() })
	cfg.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{URL: base, Kind: "vllm"}}}}
	cfg.SequenceStore = seqs
	gw, err := gateway.New(cfg, pipe, m, nil)
	if err != nil {
		b.Fatal(err)
	}
	go gw.Serve(ln)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
		pipe.Close(ctx)
	})
	return strings.TrimSuffix(strings.TrimPrefix(base, "http://"), "/v1"), ln.Addr().String()
}

// BenchmarkForward compares a call made directly to the mock engine with the
// same call through the gateway, non-streamed and streamed (16 tokens). The
// gateway's own cost is the difference between the "direct" and "gateway"
// rows; allocations include the client and the mock in this process.
//
//	go test -run '^$' -bench BenchmarkForward -benchmem ./gateway/
func BenchmarkForward(b *testing.B) {
	mockAddr, gwAddr := benchTarget(b, nil)
	benchForward(b, mockAddr, gwAddr)
}

// BenchmarkForwardTraced is BenchmarkForward with the gateway's own tracing
// on: "all" traces every call (ratio 1: a SERVER span and one backend attempt
// span per call, batched to an exporter that discards them), "none" samples
// no call (ratio 1e-12: only the sampling decision).
//
//	go test -run '^$' -bench BenchmarkForwardTraced -benchmem ./gateway/
func BenchmarkForwardTraced(b *testing.B) {
	for _, tc := range []struct {
		name  string
		ratio float64
	}{{"all", 1}, {"none", 1e-12}} {
		b.Run(tc.name, func(b *testing.B) {
			tr, err := gateway.NewTracing(tracetest.NewNoopExporter(), gateway.TracingOptions{SampleRatio: tc.ratio})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { tr.Shutdown(context.Background()) })
			mockAddr, gwAddr := benchTarget(b, tr)
			benchForward(b, mockAddr, gwAddr)
		})
	}
}

func benchForward(b *testing.B, mockAddr, gwAddr string) {
	bodies := map[string]string{
		"nonstream": chatBody,
		"stream":    withStream(chatBody, `"stream":true`),
	}
	for _, mode := range []string{"nonstream", "stream"} {
		for _, target := range []struct{ name, addr, path string }{
			{"direct", mockAddr, "/v1/chat/completions"},
			{"gateway", gwAddr, "/rollout/bench/attempt/1/v1/chat/completions"},
		} {
			b.Run(mode+"/"+target.name, func(b *testing.B) {
				c := &fasthttp.HostClient{Addr: target.addr, MaxConns: 64}
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI("http://" + target.addr + target.path)
				req.Header.SetMethod("POST")
				req.Header.SetContentType("application/json")
				req.SetBodyString(bodies[mode])
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
					}
				}
			})
		}
	}
}
