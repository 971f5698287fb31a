package gateway

import (
	"context"
	"testing"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rollgate/rollgate/capture"
)

// TestTracingUnsampledAllocatesNothing: with tracing on, a call that is not
// sampled (by the ratio, or by its client's unsampled traceparent) costs a
// sampling decision and no allocation.
func TestTracingUnsampledAllocatesNothing(t *testing.T) {
	tr, err := NewTracing(tracetest.NewNoopExporter(), TracingOptions{SampleRatio: 1e-12})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown(context.Background())
	f := func(traceparent string) {
		t.Helper()
		var rc fasthttp.RequestCtx
		if traceparent != "" {
			rc.Request.Header.Set("traceparent", traceparent)
		}
		c := call{pend: capture.AcquirePending()}
		fillIDs(&c.pend.IDs, rc.Request.Header.Peek("traceparent"))
		allocs := testing.AllocsPerRun(200, func() { tr.begin(&rc, &c) })
		if allocs != 0 || c.tr.span != nil {
			t.Errorf("traceparent %q: %v allocations per call, traced %v; want 0, not traced", traceparent, allocs, c.tr.span != nil)
		}
	}
	f("")
	f("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	f("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7") // no flags: not sampled
}
