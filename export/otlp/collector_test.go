package otlp_test

import (
	"context"
	"encoding/hex"
	"reflect"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// startCollector runs the real OpenTelemetry Collector (scripts/otelcol) for
// the test. Without ROLLGATE_TEST_OTELCOL the test fails and says how to
// get one.
func startCollector(t *testing.T) *testenv.Collector {
	t.Helper()
	c, err := testenv.StartCollector()
	if err != nil {
		t.Fatalf("the OTLP tests need a real OpenTelemetry Collector: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// collected waits until the collector's file exporter has written spans for
// which done returns true (15 s at most), and returns them.
func collected(t *testing.T, c *testenv.Collector, done func([]gotSpan) bool) []gotSpan {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		reqs, err := c.Requests()
		if err != nil {
			t.Fatal(err)
		}
		r := newReceiver()
		for _, req := range reqs {
			r.record(req, nil)
		}
		got, _ := r.snapshot()
		if done(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector file has %d spans after 15s, not the expected ones; collector log:\n%s", len(got), c.Log())
		}
		time.Sleep(50 * time.Millisecond) // polling interval of this wait on the collector's file
	}
}

func byService(spans []gotSpan, service string) []gotSpan {
	var out []gotSpan
	for _, s := range spans {
		if s.service == service {
			out = append(out, s)
		}
	}
	return out
}

const (
	gwTrace  = "0af7651916cd43dd8448eb211c80319c"
	gwParent = "b7ad6b7169203331"
)

// TestCollectorReceivesCallAndGatewaySpans sends, over OTLP/HTTP and then
// gRPC, to a real OpenTelemetry Collector: the captured-call spans of
// testCalls (checked attribute by attribute), and a gateway's live traffic
// with a refused replica — captured-call GenAI spans and the gateway's own
// hop and backend-attempt spans — and reads all of them back from the
// collector's file exporter.
func TestCollectorReceivesCallAndGatewaySpans(t *testing.T) {
	for _, proto := range []string{"http", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			col := startCollector(t)
			endpoint := col.HTTP
			if proto == "grpc" {
				endpoint = col.GRPC
			}
			base := otlp.Config{Endpoint: endpoint, Protocol: proto, Insecure: true, Timeout: 5 * time.Second}

			// The sink on its own: every GenAI and rollgate attribute.
			cfg := base
			cfg.ServiceName, cfg.ProviderName = "rollgate-test", "openai"
			cfg.Backends = map[string]string{"vllm-a": "http://10.0.0.11:8000/v1"}
			cfg.ParentSpanID = func(c *export.Call) string {
				if c.TraceID == clientTrace {
					return clientParent
				}
				return ""
			}
			sink, err := otlp.New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := sink.Write(context.Background(), &export.Batch{Calls: testCalls()}); err != nil {
				t.Fatalf("Write to the collector: %v", err)
			}
			sink.Close(context.Background())

			// A gateway with capture to OTLP and its own tracing, same endpoint.
			reqIDs := runTracedGateway(t, base)

			got := collected(t, col, func(got []gotSpan) bool {
				return len(byService(got, "rollgate-test")) == len(wantSpans) && gatewayDone(byService(got, "rollgate-gw"), len(reqIDs))
			})
			checkSpans(t, byService(got, "rollgate-test"), "")
			checkGatewaySpans(t, byService(got, "rollgate-gw"), reqIDs)
		})
	}
}

// runTracedGateway runs three chat calls (in the client's sampled trace)
// through a gateway whose pool has a refused replica before the mock, with
// the OTLP sink and the gateway's tracing on cfg's endpoint. It returns the
// calls' x-request-id values in order.
func runTracedGateway(t *testing.T, cfg otlp.Config) []string {
	t.Helper()
	cfg.ServiceName = "rollgate-gw"
	cfg.ParentSpanID = func(c *export.Call) string { return c.ParentSpanID }
	sink, err := otlp.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	exp, err := otlp.NewExporter(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The default ratio: the calls are in the client's sampled trace, so all are traced.
	tr, err := gateway.NewTracing(exp, gateway.TracingOptions{SampleRatio: 0.01, ServiceName: cfg.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := startGateway(t, sink, func(c *gateway.Config) {
		c.HealthInterval, c.Tracing = -1, tr // only calls mark the refused replica: it stays in rotation
		// Least outstanding tries the refused replica first (affine routing
		// might hash the rollout onto the mock and never retry).
		c.Routing = gateway.RoutingLeastOutstanding
		c.Backends[0].Replicas = append([]gateway.Replica{{Name: "dead", URL: "http://127.0.0.1:1/v1", Kind: "vllm"}}, c.Backends[0].Replicas...)
	})
	var ids []string
	for i := range 3 {
		body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
		if i == 2 {
			body = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		}
		res := post(t, "http://"+addr+"/rollout/ro-c/attempt/at-1/v1/chat/completions", body,
			"traceparent", "00-"+gwTrace+"-"+gwParent+"-01")
		if res.StatusCode != 200 {
			t.Fatalf("call %d: status %d", i, res.StatusCode)
		}
		ids = append(ids, res.Header.Get("x-request-id"))
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sink.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	return ids
}

// gatewayDone reports whether spans hold a whole gateway run of n calls:
// n captured-call spans, n SERVER spans and as many attempt spans as those
// counted.
func gatewayDone(spans []gotSpan, n int) bool {
	roots, want := 0, 2*n
	for _, g := range spans {
		if g.span.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
			roots++
			a, _ := attrs(g.span)["rollgate.backend_attempts"].(int64)
			want += int(a)
		}
	}
	return roots == n && len(spans) >= want
}

// checkGatewaySpans checks, for each call, its captured GenAI span, the
// gateway's SERVER span and its backend attempts, as the collector got them.
func checkGatewaySpans(t *testing.T, got []gotSpan, reqIDs []string) {
	t.Helper()
	byID := map[string]gotSpan{}
	children := map[string][]*tracepb.Span{}
	for _, g := range got {
		byID[hex.EncodeToString(g.span.GetSpanId())] = g
		if hex.EncodeToString(g.span.GetTraceId()) != gwTrace {
			t.Errorf("span %q in trace %x, want the client's %s", g.span.GetName(), g.span.GetTraceId(), gwTrace)
		}
		p := hex.EncodeToString(g.span.GetParentSpanId())
		children[p] = append(children[p], g.span)
	}
	retried := 0
	for i, id := range reqIDs {
		seq := int64(i + 1)
		call, ok := byID[id]
		if !ok {
			t.Fatalf("call %d: no captured-call span %s in the collector's file", seq, id)
		}
		if call.scope != otlp.ScopeName || call.span.GetKind() != tracepb.Span_SPAN_KIND_CLIENT ||
			hex.EncodeToString(call.span.GetParentSpanId()) != gwParent {
			t.Errorf("call %d: captured span scope %q kind %v parent %x, want %s CLIENT under %s",
				seq, call.scope, call.span.GetKind(), call.span.GetParentSpanId(), otlp.ScopeName, gwParent)
		}
		a := attrs(call.span)
		for k, v := range map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "rollgate.rollout_id": "ro-c",
			"rollgate.attempt_id": "at-1", "rollgate.sequence_id": seq, "rollgate.backend": "mock-1",
			"rollgate.policy_version": "v7", "rollgate.token_source": "engine", "rollgate.stream": i == 2,
			"gen_ai.response.finish_reasons": []string{"stop"},
		} {
			if !reflect.DeepEqual(a[k], v) {
				t.Errorf("call %d: captured span %s = %#v, want %#v", seq, k, a[k], v)
			}
		}
		if out, _ := a["gen_ai.usage.output_tokens"].(int64); out <= 0 {
			t.Errorf("call %d: gen_ai.usage.output_tokens %v", seq, a["gen_ai.usage.output_tokens"])
		}

		// The gateway's hop: a SERVER span under the client's span that
		// names and links the captured call.
		var root *tracepb.Span
		for _, s := range children[gwParent] {
			if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER && attrs(s)["rollgate.request_id"] == id {
				root = s
			}
		}
		if root == nil {
			t.Fatalf("call %d: no gateway SERVER span with rollgate.request_id %s under the client's span", seq, id)
		}
		if g := byID[hex.EncodeToString(root.GetSpanId())]; g.scope != gateway.TracerScope {
			t.Errorf("call %d: gateway span scope %q", seq, g.scope)
		}
		if l := root.GetLinks(); len(l) != 1 || hex.EncodeToString(l[0].GetSpanId()) != id {
			t.Errorf("call %d: gateway span links %v, want the captured call %s", seq, l, id)
		}
		attempts := children[hex.EncodeToString(root.GetSpanId())]
		ra := attrs(root)
		for k, v := range map[string]any{
			"http.route": "/v1/chat/completions", "http.response.status_code": int64(200),
			"rollgate.rollout_id": "ro-c", "rollgate.attempt_id": "at-1", "rollgate.sequence_id": seq,
			"gen_ai.request.model": "m", "rollgate.backend": "mock-1",
			"rollgate.backend_attempts": int64(len(attempts)),
		} {
			if !reflect.DeepEqual(ra[k], v) {
				t.Errorf("call %d: gateway span %s = %#v, want %#v", seq, k, ra[k], v)
			}
		}
		if len(attempts) < 1 || len(attempts) > 2 {
			t.Fatalf("call %d: %d backend attempt spans, want 1 or 2", seq, len(attempts))
		}
		for _, at := range attempts {
			aa := attrs(at)
			if at.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
				t.Errorf("call %d: attempt kind %v", seq, at.GetKind())
			}
			switch aa["rollgate.backend"] {
			case "dead":
				retried++
				if aa["error.type"] != "connection_refused" || aa["rollgate.retried"] != true ||
					aa["rollgate.backend_attempt"] != int64(1) || at.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
					t.Errorf("call %d: refused attempt %v status %v", seq, aa, at.GetStatus())
				}
			case "mock-1":
				if aa["http.response.status_code"] != int64(200) || aa["rollgate.backend_attempt"] != int64(len(attempts)) ||
					aa["rollgate.backend_url"] == nil || at.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR {
					t.Errorf("call %d: served attempt %v status %v", seq, aa, at.GetStatus())
				}
				if len(attempts) == 2 && aa["http.request.resend_count"] != int64(1) {
					t.Errorf("call %d: retry without http.request.resend_count: %v", seq, aa)
				}
			default:
				t.Errorf("call %d: attempt on backend %v", seq, aa["rollgate.backend"])
			}
		}
	}
	if retried == 0 {
		t.Error("no call went to the refused replica first: no retry span to check")
	}
	if want := 2*len(reqIDs) + retried + len(reqIDs); len(got) != want {
		t.Errorf("%d spans from the gateway run, want %d (per call: captured, hop, attempts)", len(got), want)
	}
}
