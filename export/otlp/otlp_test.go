package otlp_test

import (
	"context"
	"encoding/hex"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

const (
	clientTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientParent = "00f067aa0ba902b7"
)

var t0 = uint64(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())

// testCalls are the rows of four calls: a streamed chat call with two
// choices from a rollout (with the client's trace), a text completion, an
// embedding and a failed chat call.
func testCalls() []export.Call {
	chat := export.Call{
		SpanID: "1111111111111111", TraceID: clientTrace, RolloutID: "ro-1", AttemptID: "at-1",
		TaskID: "task-9", AgentName: "solver", SequenceID: 3,
		StartTimeUnixNano: t0, EndTimeUnixNano: t0 + 250e6, TTFTNano: 5e6,
		Endpoint: "/v1/chat/completions", Model: "Qwen/Qwen3-8B", Backend: "vllm-a", PolicyVersion: "step-120",
		Stream: true, HTTPStatus: 200, TokenSource: export.TokenSourceEngine,
		FinishReason: "stop", PromptTokens: 12, CompletionTokens: 20,
	}
	chat1 := chat
	chat1.ChoiceIndex, chat1.FinishReason = 1, "length"
	return []export.Call{
		chat,
		{
			SpanID: "2222222222222222", TraceID: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", SequenceID: 1,
			StartTimeUnixNano: t0 + 1e9, EndTimeUnixNano: t0 + 2e9,
			Endpoint: "/v1/completions", Model: "base", Backend: "127.0.0.1:9999/v1", HTTPStatus: 200,
			TokenSource: export.TokenSourceNone, TokenCheck: "completion_ids", FinishReason: "length",
			PromptTokens: 4, CompletionTokens: 16,
		},
		chat1,
		{
			SpanID: "3333333333333333", TraceID: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", SequenceID: 2,
			StartTimeUnixNano: t0 + 3e9, EndTimeUnixNano: t0 + 3e9 + 1e6,
			Endpoint: "/v1/embeddings", Model: "emb", Backend: "mock-1", HTTPStatus: 200, PromptTokens: 7,
		},
		{
			SpanID: "4444444444444444", TraceID: "cccccccccccccccccccccccccccccccc", SequenceID: 4,
			StartTimeUnixNano: t0 + 4e9, EndTimeUnixNano: t0 + 4e9 + 2e6,
			Endpoint: "/v1/chat/completions", Model: "Qwen/Qwen3-8B", Backend: "vllm-a", HTTPStatus: 502,
			Error: "backend vllm-a: connection refused",
		},
	}
}

// wantSpan is what the receiver must have decoded for one call.
type wantSpan struct {
	name   string
	trace  string
	parent string
	start  uint64
	end    uint64
	error  bool
	attrs  map[string]any
	absent []string
}

var wantSpans = map[string]wantSpan{
	"1111111111111111": {
		name: "chat Qwen/Qwen3-8B", trace: clientTrace, parent: clientParent, start: t0, end: t0 + 250e6,
		attrs: map[string]any{
			"gen_ai.operation.name": "chat", "gen_ai.request.model": "Qwen/Qwen3-8B",
			"gen_ai.provider.name":           "openai",
			"gen_ai.response.finish_reasons": []string{"stop", "length"},
			"gen_ai.usage.input_tokens":      int64(12), "gen_ai.usage.output_tokens": int64(20),
			"server.address": "10.0.0.11", "server.port": int64(8000), "rollgate.backend": "vllm-a",
			"rollgate.rollout_id": "ro-1", "rollgate.attempt_id": "at-1", "rollgate.sequence_id": int64(3),
			"rollgate.policy_version": "step-120", "rollgate.token_source": "engine",
			"rollgate.task_id": "task-9", "rollgate.agent_name": "solver", "rollgate.stream": true,
			"rollgate.ttft_seconds": 0.005, "rollgate.choice_count": int64(2),
			"http.response.status_code": int64(200), "rollgate.endpoint": "/v1/chat/completions",
		},
		absent: []string{"error.type", "rollgate.token_check"},
	},
	"2222222222222222": {
		name: "text_completion base", trace: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", start: t0 + 1e9, end: t0 + 2e9,
		attrs: map[string]any{
			"gen_ai.operation.name": "text_completion", "gen_ai.request.model": "base",
			"gen_ai.response.finish_reasons": []string{"length"},
			"gen_ai.usage.input_tokens":      int64(4), "gen_ai.usage.output_tokens": int64(16),
			"server.address": "127.0.0.1", "server.port": int64(9999),
			"rollgate.sequence_id": int64(1), "rollgate.token_source": "none", "rollgate.token_check": "completion_ids",
			"rollgate.stream": false,
		},
		absent: []string{"rollgate.rollout_id", "rollgate.policy_version", "rollgate.choice_count", "rollgate.ttft_seconds"},
	},
	"3333333333333333": {
		name: "embeddings emb", trace: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", start: t0 + 3e9, end: t0 + 3e9 + 1e6,
		attrs: map[string]any{
			"gen_ai.operation.name": "embeddings", "gen_ai.usage.input_tokens": int64(7),
			"gen_ai.usage.output_tokens": int64(0), "server.address": "mock-1",
		},
		absent: []string{"server.port", "gen_ai.response.finish_reasons"},
	},
	"4444444444444444": {
		name: "chat Qwen/Qwen3-8B", trace: "cccccccccccccccccccccccccccccccc", start: t0 + 4e9, end: t0 + 4e9 + 2e6, error: true,
		attrs: map[string]any{
			"error.type": "502", "http.response.status_code": int64(502), "server.address": "10.0.0.11",
		},
		absent: []string{"gen_ai.usage.input_tokens"},
	},
}

// checkSpans asserts the decoded spans match wantSpans exactly.
func checkSpans(t *testing.T, got []gotSpan, header string) {
	t.Helper()
	if len(got) != len(wantSpans) {
		t.Fatalf("receiver got %d spans, want %d (one per call, not per choice)", len(got), len(wantSpans))
	}
	for _, g := range got {
		sp := g.span
		id := hex.EncodeToString(sp.GetSpanId())
		w, ok := wantSpans[id]
		if !ok {
			t.Errorf("unexpected span id %s", id)
			continue
		}
		if tr := hex.EncodeToString(sp.GetTraceId()); tr != w.trace {
			t.Errorf("span %s: trace id %s, want %s", id, tr, w.trace)
		}
		if p := hex.EncodeToString(sp.GetParentSpanId()); p != w.parent {
			t.Errorf("span %s: parent %q, want %q", id, p, w.parent)
		}
		if sp.GetName() != w.name {
			t.Errorf("span %s: name %q, want %q", id, sp.GetName(), w.name)
		}
		if sp.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("span %s: kind %v, want CLIENT", id, sp.GetKind())
		}
		if sp.GetStartTimeUnixNano() != w.start || sp.GetEndTimeUnixNano() != w.end {
			t.Errorf("span %s: times %d..%d, want %d..%d", id, sp.GetStartTimeUnixNano(), sp.GetEndTimeUnixNano(), w.start, w.end)
		}
		if isErr := sp.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR; isErr != w.error {
			t.Errorf("span %s: error status %v, want %v", id, isErr, w.error)
		}
		a := attrs(sp)
		for k, v := range w.attrs {
			if !reflect.DeepEqual(a[k], v) {
				t.Errorf("span %s: %s = %#v, want %#v", id, k, a[k], v)
			}
		}
		for _, k := range w.absent {
			if v, ok := a[k]; ok {
				t.Errorf("span %s: %s = %#v, want absent", id, k, v)
			}
		}
		if g.service != "rollgate-test" || g.scope != otlp.ScopeName {
			t.Errorf("span %s: service %q scope %q", id, g.service, g.scope)
		}
		if g.headers["X-Tenant"] != header {
			t.Errorf("span %s: export request header X-Tenant %q, want %q", id, g.headers["X-Tenant"], header)
		}
	}
}

func TestSinkExportsToRealReceiver(t *testing.T) {
	cases := []struct {
		name  string
		start func(t *testing.T, r *receiver) string // returns the endpoint
		cfg   otlp.Config
	}{
		{"http url", startHTTPReceiver, otlp.Config{Protocol: "http"}},
		{"http host:port gzip", func(t *testing.T, r *receiver) string {
			return strings.TrimPrefix(startHTTPReceiver(t, r), "http://")
		}, otlp.Config{Insecure: true, Compression: "gzip"}},
		{"grpc host:port", startGRPCReceiver, otlp.Config{Protocol: "grpc", Insecure: true}},
		{"grpc url gzip", func(t *testing.T, r *receiver) string {
			return "http://" + startGRPCReceiver(t, r)
		}, otlp.Config{Protocol: "grpc", Insecure: true, Compression: "gzip"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newReceiver()
			cfg := tc.cfg
			cfg.Endpoint = tc.start(t, r)
			cfg.Headers = map[string]string{"X-Tenant": "team-a"}
			cfg.Timeout = 5 * time.Second
			cfg.ServiceName = "rollgate-test"
			cfg.ProviderName = "openai"
			cfg.Backends = map[string]string{"vllm-a": "http://10.0.0.11:8000/v1"}
			cfg.ParentSpanID = func(c *export.Call) string {
				if c.TraceID == clientTrace {
					return clientParent
				}
				return ""
			}
			s, err := otlp.New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			if err := s.Write(context.Background(), &export.Batch{Calls: testCalls()}); err != nil {
				t.Fatalf("Write: %v", err)
			}
			got, requests := r.snapshot()
			if requests != 1 {
				t.Errorf("%d export requests for one batch, want 1", requests)
			}
			checkSpans(t, got, "team-a")
			// Rewards and rollouts only: nothing is sent.
			if err := s.Write(context.Background(), &export.Batch{Rewards: []export.Reward{{RolloutID: "x"}}}); err != nil {
				t.Fatal(err)
			}
			if _, n := r.snapshot(); n != 1 {
				t.Errorf("%d export requests after a batch without calls, want 1", n)
			}
		})
	}
}

func TestSinkReportsRefusedExport(t *testing.T) {
	r := newReceiver()
	r.fail = 503
	s, err := otlp.New(context.Background(), otlp.Config{Endpoint: startHTTPReceiver(t, r), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	err = s.Write(context.Background(), &export.Batch{Calls: testCalls()})
	if err == nil || !strings.Contains(err.Error(), "otlp: exporting 4 spans") {
		t.Fatalf("Write to a receiver answering 503: err %v, want an export error", err)
	}
	if got, _ := r.snapshot(); len(got) != 0 {
		t.Fatalf("%d spans recorded by a refusing receiver", len(got))
	}
}

func TestSinkUnreachableReceiver(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	for _, proto := range []string{"http", "grpc"} {
		s, err := otlp.New(context.Background(), otlp.Config{Endpoint: addr, Protocol: proto, Insecure: true, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Write(context.Background(), &export.Batch{Calls: testCalls()}); err == nil {
			t.Errorf("%s: Write to a closed port succeeded", proto)
		}
		s.Close(context.Background())
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  otlp.Config
		want string
	}{
		{"off", otlp.Config{}, "no endpoint"},
		{"protocol", otlp.Config{Endpoint: "127.0.0.1:4318", Protocol: "udp"}, `protocol "udp"`},
		{"compression", otlp.Config{Endpoint: "127.0.0.1:4318", Compression: "zstd"}, `compression "zstd"`},
		{"url", otlp.Config{Endpoint: "http://"}, "not a valid URL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.Enabled() != (tc.cfg.Endpoint != "") {
				t.Errorf("Enabled() = %v", tc.cfg.Enabled())
			}
			_, err := otlp.New(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: err %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestOperation(t *testing.T) {
	for ep, want := range map[string]string{
		"/v1/chat/completions": "chat", "/v1/responses": "chat", "/v1/completions": "text_completion",
		"/v1/embeddings": "embeddings", "/v1/messages": "chat", "/v1/models": "other", "": "other",
	} {
		if got := otlp.Operation(ep); got != want {
			t.Errorf("Operation(%q) = %q, want %q", ep, got, want)
		}
	}
}

// TestGatewayCallNestsInClientTrace runs the whole path: a client request
// with a traceparent through a real gateway and mock engine, the capture
// pipeline with the OTLP sink next to the store, and a real OTLP receiver.
func TestGatewayCallNestsInClientTrace(t *testing.T) {
	r := newReceiver()
	sink, err := otlp.New(context.Background(), otlp.Config{
		Endpoint: startHTTPReceiver(t, r), Timeout: 5 * time.Second, ServiceName: "rollgate-test",
		ParentSpanID: func(c *export.Call) string { return c.ParentSpanID },
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, stop := startGateway(t, sink, nil)
	defer func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
		sink.Close(context.Background())
	}()

	url := "http://" + addr + "/rollout/ro-7/attempt/at-2/v1/chat/completions"
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	res := post(t, url, body, "traceparent", "00-"+clientTrace+"-"+clientParent+"-01")
	reqID := res.Header.Get("x-request-id")
	if res.StatusCode != 200 || reqID == "" {
		t.Fatalf("gateway answered %d, x-request-id %q", res.StatusCode, reqID)
	}
	got := r.waitSpans(t, 1)
	sp := got[0].span
	if id := hex.EncodeToString(sp.GetSpanId()); id != reqID {
		t.Errorf("span id %s, want the call's x-request-id %s", id, reqID)
	}
	if tr := hex.EncodeToString(sp.GetTraceId()); tr != clientTrace {
		t.Errorf("trace id %s, want the client's %s", tr, clientTrace)
	}
	if p := hex.EncodeToString(sp.GetParentSpanId()); p != clientParent {
		t.Errorf("parent span id %s, want the client's span %s (the call must nest under it)", p, clientParent)
	}
	a := attrs(sp)
	for k, v := range map[string]any{
		"gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "rollgate.rollout_id": "ro-7",
		"rollgate.attempt_id": "at-2", "rollgate.sequence_id": int64(1), "rollgate.policy_version": "v7",
		"rollgate.token_source": "engine", "server.address": "mock-1", "rollgate.stream": true,
		"gen_ai.response.finish_reasons": []string{"stop"},
	} {
		if !reflect.DeepEqual(a[k], v) {
			t.Errorf("%s = %#v, want %#v", k, a[k], v)
		}
	}
	if in, out := a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]; in == nil || out == nil || out.(int64) <= 0 {
		t.Errorf("usage attributes %v / %v, want the engine's counts", in, out)
	}
	if sp.GetEndTimeUnixNano() <= sp.GetStartTimeUnixNano() {
		t.Errorf("span ends at %d, before its start %d", sp.GetEndTimeUnixNano(), sp.GetStartTimeUnixNano())
	}
}

// startGateway runs a mock engine and a gateway in front of it (replica
// "mock-1", policy v7, model "*") on loopback, capturing into an embedded
// store and sink; mutate may change the config. It returns the gateway's
// host:port and a function that shuts the gateway down and flushes capture.
func startGateway(t *testing.T, sink export.Sink, mutate func(*gateway.Config)) (addr string, stop func() error) {
	t.Helper()
	ms, base, err := mock.Start(mock.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "rollgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	m := metrics.New()
	pipe := capture.NewPipeline(capture.Config{FlushInterval: 10 * time.Millisecond, BatchSize: 64},
		[]capture.NamedSink{{Name: store.Name(), Sink: store}, {Name: "otlp", Sink: sink}}, m, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{
		Listen: ln.Addr().String(), UpstreamTimeout: 20 * time.Second,
		SequenceStore: gatewaytest.SequenceStore(t),
		Backends: []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{
			{Name: "mock-1", URL: base, Kind: "vllm", PolicyVersion: "v7"},
		}}},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	gw, err := gateway.New(cfg, pipe, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	go gw.Serve(ln)
	return ln.Addr().String(), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			return err
		}
		return pipe.Close(ctx)
	}
}

func BenchmarkSpans(b *testing.B) {
	s, err := otlp.New(context.Background(), otlp.Config{Endpoint: "127.0.0.1:1"})
	if err != nil {
		b.Fatal(err)
	}
	calls := testCalls()
	b.ReportAllocs()
	for b.Loop() {
		spans := s.Spans(calls)
		for i := range spans {
			_ = spans[i].Snapshot()
		}
	}
}
