package gateway_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollgate/rollgate/gateway"
)

const (
	tpTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	tpParent = "00f067aa0ba902b7"
)

// tracedEnv is a gateway whose own spans go to an in-memory exporter, with a
// refused replica ("dead", nothing listens there) in front of the mock.
func tracedEnv(t *testing.T, ratio float64, mutate func(*gateway.Config)) (*env, *gateway.Tracing, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tr, err := gateway.NewTracing(exp, gateway.TracingOptions{SampleRatio: ratio, ServiceName: "rollgate-test"})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.Tracing = tr
		c.HealthInterval = -1 // only calls mark the dead replica, so it stays in rotation
		c.Backends[0].Replicas = append([]gateway.Replica{{Name: "dead", URL: "http://127.0.0.1:1/v1", Kind: "vllm"}}, c.Backends[0].Replicas...)
		if mutate != nil {
			mutate(c)
		}
	})
	t.Cleanup(func() { tr.Shutdown(context.Background()) })
	return e, tr, exp
}

// flushed returns the spans exported so far, after a flush.
func flushed(t *testing.T, tr *gateway.Tracing, exp *tracetest.InMemoryExporter) tracetest.SpanStubs {
	t.Helper()
	if err := tr.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return exp.GetSpans()
}

func attrMap(kvs []attribute.KeyValue) map[attribute.Key]any {
	m := map[attribute.Key]any{}
	for _, kv := range kvs {
		m[kv.Key] = kv.Value.AsInterface()
	}
	return m
}

// callSpans splits spans into each call's root (keyed by rollgate.request_id)
// and the attempts under it, in start order.
func callSpans(t *testing.T, spans tracetest.SpanStubs) (roots map[string]tracetest.SpanStub, attempts map[trace.SpanID][]tracetest.SpanStub) {
	t.Helper()
	roots, attempts = map[string]tracetest.SpanStub{}, map[trace.SpanID][]tracetest.SpanStub{}
	for _, s := range spans {
		switch s.SpanKind {
		case trace.SpanKindServer:
			id, _ := attrMap(s.Attributes)[gateway.AttrRequestID].(string)
			roots[id] = s
		case trace.SpanKindClient:
			attempts[s.Parent.SpanID()] = append(attempts[s.Parent.SpanID()], s)
		default:
			t.Errorf("span %q of kind %v", s.Name, s.SpanKind)
		}
	}
	for _, list := range attempts {
		for i := 1; i < len(list); i++ {
			if list[i].StartTime.Before(list[i-1].StartTime) {
				list[i-1], list[i] = list[i], list[i-1]
			}
		}
	}
	return roots, attempts
}

func wantAttrs(t *testing.T, what string, got []attribute.KeyValue, want map[attribute.Key]any) {
	t.Helper()
	m := attrMap(got)
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s: %s = %#v, want %#v", what, k, m[k], v)
		}
	}
}

// TestTracingRetriesNestInClientTrace: calls with a sampled traceparent get
// a SERVER span parented on the client's span, with one CLIENT span per
// backend attempt; a call first sent to the refused replica has a failed,
// retried attempt span and then the mock's.
func TestTracingRetriesNestInClientTrace(t *testing.T) {
	// The ratio does not apply: the client's trace is sampled. Least
	// outstanding rotates among idle replicas (affine routing would keep
	// ro-1 on one of them).
	e, tr, exp := tracedEnv(t, 0.000001, func(c *gateway.Config) { c.Routing = gateway.RoutingLeastOutstanding })
	ids := map[string]int{}
	for i := range 3 {
		r := do(t, "POST", e.url+"/rollout/ro-1/attempt/at-1/v1/chat/completions", chatBody,
			"traceparent", "00-"+tpTrace+"-"+tpParent+"-01")
		if r.status != 200 {
			t.Fatalf("call %d: %d %s", i, r.status, r.body)
		}
		ids[r.header.Get("x-request-id")] = i + 1
	}
	roots, attempts := callSpans(t, flushed(t, tr, exp))
	if len(roots) != 3 {
		t.Fatalf("%d SERVER spans for 3 calls, want 3", len(roots))
	}
	retried := 0
	for reqID, seq := range ids {
		root, ok := roots[reqID]
		if !ok {
			t.Fatalf("no SERVER span with rollgate.request_id %s", reqID)
		}
		if root.SpanContext.TraceID().String() != tpTrace || root.Parent.SpanID().String() != tpParent || !root.Parent.IsRemote() {
			t.Errorf("call %d: trace %s parent %s (remote %v), want the client's %s / %s", seq,
				root.SpanContext.TraceID(), root.Parent.SpanID(), root.Parent.IsRemote(), tpTrace, tpParent)
		}
		if root.Name != "POST /v1/chat/completions" {
			t.Errorf("call %d: name %q", seq, root.Name)
		}
		if len(root.Links) != 1 || root.Links[0].SpanContext.SpanID().String() != reqID {
			t.Errorf("call %d: links %+v, want one to the captured call's span %s", seq, root.Links, reqID)
		}
		list := attempts[root.SpanContext.SpanID()]
		wantAttrs(t, "root", root.Attributes, map[attribute.Key]any{
			"http.request.method": "POST", "http.route": "/v1/chat/completions",
			"url.path":                  "/rollout/ro-1/attempt/at-1/v1/chat/completions",
			"http.response.status_code": int64(200), "gen_ai.operation.name": "chat",
			"gen_ai.request.model": "mock-model", "rollgate.rollout_id": "ro-1", "rollgate.attempt_id": "at-1",
			"rollgate.sequence_id": int64(seq), "rollgate.backend": "mock-1", "rollgate.policy_version": "v7",
			"rollgate.backend_attempts": int64(len(list)), "rollgate.stream": false,
		})
		if root.Status.Code == codes.Error {
			t.Errorf("call %d: SERVER span status %v", seq, root.Status)
		}
		if len(list) == 0 || len(list) > 2 {
			t.Fatalf("call %d: %d attempt spans, want 1 or 2", seq, len(list))
		}
		last := list[len(list)-1]
		wantAttrs(t, "last attempt", last.Attributes, map[attribute.Key]any{
			"rollgate.backend": "mock-1", "rollgate.backend_url": e.mockURL, "http.response.status_code": int64(200),
			"server.address": "127.0.0.1", "rollgate.backend_attempt": int64(len(list)), "rollgate.policy_version": "v7",
		})
		if last.Status.Code == codes.Error || last.EndTime.After(root.EndTime) || last.StartTime.Before(root.StartTime) {
			t.Errorf("call %d: last attempt status %v, %v..%v outside %v..%v", seq, last.Status, last.StartTime, last.EndTime, root.StartTime, root.EndTime)
		}
		if len(list) == 2 {
			retried++
			first := list[0]
			wantAttrs(t, "refused attempt", first.Attributes, map[attribute.Key]any{
				"rollgate.backend": "dead", "rollgate.backend_url": "http://127.0.0.1:1/v1", "server.port": int64(1),
				"url.full": "http://127.0.0.1:1/v1/chat/completions", "error.type": "connection_refused",
				"rollgate.retried": true, "rollgate.backend_attempt": int64(1),
			})
			wantAttrs(t, "retry", last.Attributes, map[attribute.Key]any{"http.request.resend_count": int64(1)})
			if first.Status.Code != codes.Error || !strings.Contains(first.Status.Description, "refused") {
				t.Errorf("refused attempt status %+v", first.Status)
			}
			if len(first.Events) != 1 || first.Events[0].Name != "exception" {
				t.Errorf("refused attempt events %+v, want the recorded error", first.Events)
			}
			if first.EndTime.After(last.StartTime) {
				t.Errorf("retry starts at %v, before the refused attempt ended at %v", last.StartTime, first.EndTime)
			}
		}
	}
	// Round-robin among equally idle replicas: of 3 calls at least one tries
	// the dead replica first.
	if retried == 0 {
		t.Fatal("no call was retried after the refused replica")
	}
}

// TestTracingSampling: without a traceparent the ratio decides, on the
// call's trace id, which the spans share with the captured row; an
// unsampled traceparent is never traced.
func TestTracingSampling(t *testing.T) {
	e, tr, exp := tracedEnv(t, 1, nil)
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	row := e.waitCalls(r.header.Get("x-request-id"), 1)[0]
	roots, _ := callSpans(t, flushed(t, tr, exp))
	root, ok := roots[row.SpanID]
	if !ok || root.Parent.IsValid() {
		t.Fatalf("root for %s: found %v, parent %v (want none)", row.SpanID, ok, root.Parent)
	}
	if got := root.SpanContext.TraceID().String(); got != row.TraceID {
		t.Errorf("span trace id %s, want the captured row's %s", got, row.TraceID)
	}

	exp.Reset()
	r = do(t, "POST", e.url+"/v1/chat/completions", chatBody, "traceparent", "00-"+tpTrace+"-"+tpParent+"-00")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if spans := flushed(t, tr, exp); len(spans) != 0 {
		t.Fatalf("%d spans for a call whose traceparent is not sampled", len(spans))
	}

	// A tiny ratio samples (almost) nothing without a traceparent.
	e2, tr2, exp2 := tracedEnv(t, 1e-12, nil)
	for range 5 {
		do(t, "POST", e2.url+"/v1/chat/completions", chatBody)
	}
	if spans := flushed(t, tr2, exp2); len(spans) != 0 {
		t.Fatalf("ratio 1e-12: %d spans for 5 calls", len(spans))
	}
}

// TestTracingStreamAndFailures: a streamed call's attempt span lasts until
// the stream ends; a backend that drops every connection yields one failed
// span per attempt (retries included) and an erroring SERVER span; an
// unrouted model yields a SERVER span with no attempt.
func TestTracingStreamAndFailures(t *testing.T) {
	e, tr, exp := tracedEnv(t, 1, func(c *gateway.Config) {
		c.Backends[0].Replicas = c.Backends[0].Replicas[1:] // the mock only
		c.Backends[0].Model = "mock-model"
	})
	r := do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "20")
	if r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	stream := r.header.Get("x-request-id")
	r = do(t, "POST", e.url+"/v1/chat/completions", chatBody, "x-mock-fail", "disconnect")
	if r.status != 502 {
		t.Fatalf("disconnect: %d %s", r.status, r.body)
	}
	dropped := r.header.Get("x-request-id")
	r = do(t, "POST", e.url+"/v1/chat/completions", strings.Replace(chatBody, "mock-model", "nope", 1))
	if r.status != 404 {
		t.Fatalf("unrouted: %d %s", r.status, r.body)
	}
	unrouted := r.header.Get("x-request-id")

	roots, attempts := callSpans(t, flushed(t, tr, exp))
	root := roots[stream]
	list := attempts[root.SpanContext.SpanID()]
	if len(list) != 1 {
		t.Fatalf("stream: %d attempts", len(list))
	}
	wantAttrs(t, "stream root", root.Attributes, map[attribute.Key]any{"rollgate.stream": true, "http.response.status_code": int64(200)})
	if _, ok := attrMap(root.Attributes)["rollgate.ttft_seconds"]; !ok {
		t.Error("stream root: no rollgate.ttft_seconds")
	}
	// 16 tokens 20 ms apart: the attempt covers the stream, not just the headers.
	if d := list[0].EndTime.Sub(list[0].StartTime); d < 200*time.Millisecond {
		t.Errorf("stream attempt lasted %v, want the whole stream", d)
	}

	root = roots[dropped]
	list = attempts[root.SpanContext.SpanID()]
	if len(list) != 3 { // the first try and 2 retries (Config.Retries default)
		t.Fatalf("dropped connections: %d attempt spans, want 3", len(list))
	}
	for i, a := range list {
		wantAttrs(t, "dropped attempt", a.Attributes, map[attribute.Key]any{
			"rollgate.backend_attempt": int64(i + 1), "rollgate.retried": i < 2, "rollgate.backend": "mock-1",
		})
		if a.Status.Code != codes.Error {
			t.Errorf("attempt %d status %v", i+1, a.Status)
		}
	}
	wantAttrs(t, "dropped root", root.Attributes, map[attribute.Key]any{
		"http.response.status_code": int64(502), "error.type": "502", "rollgate.backend_attempts": int64(3),
	})
	if root.Status.Code != codes.Error || !strings.Contains(root.Status.Description, "after 3 attempts") {
		t.Errorf("dropped root status %+v", root.Status)
	}

	root = roots[unrouted]
	if n := len(attempts[root.SpanContext.SpanID()]); n != 0 || root.Name == "" {
		t.Fatalf("unrouted: root %q with %d attempts", root.Name, n)
	}
	wantAttrs(t, "unrouted root", root.Attributes, map[attribute.Key]any{
		"http.response.status_code": int64(404), "rollgate.backend_attempts": int64(0), "gen_ai.request.model": "nope",
	})
	if root.Status.Code == codes.Error {
		t.Error("a 404 marks the SERVER span as an error")
	}
}

func TestNewTracingRejectsBadRatio(t *testing.T) {
	for _, r := range []float64{0, -0.5, 1.5} {
		if _, err := gateway.NewTracing(tracetest.NewNoopExporter(), gateway.TracingOptions{SampleRatio: r}); err == nil {
			t.Errorf("ratio %v accepted", r)
		}
	}
}

// Interface guard: the in-memory exporter is a real SDK exporter.
var _ sdktrace.SpanExporter = (*tracetest.InMemoryExporter)(nil)
