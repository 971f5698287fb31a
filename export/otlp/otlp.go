// Package otlp is an export.Sink that sends every captured LLM call as an
// OpenTelemetry span over OTLP (HTTP or gRPC), following the GenAI semantic
// conventions, so captured calls appear inside the agent's own traces.
//
// The span's trace id is the call's trace_id (the client's traceparent trace
// id when it sent one) and its span id is the call's span_id. Spans are built
// as SDK read-only spans and handed straight to the OTLP exporter: one export
// request per capture batch, acknowledged before Write returns, so the capture
// pipeline's retries and drop accounting apply unchanged.
//
// A request with several choices yields several llm_calls rows sharing one
// span id; the sink emits one span for it, from the choice 0 row, with the
// finish reasons of every choice of the call found in the same batch.
package otlp

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollgate/rollgate/export"
)

// ScopeName is the instrumentation scope of the spans this sink emits.
const ScopeName = "github.com/rollgate/rollgate/export/otlp"

// Attribute keys of rollgate's own span attributes (besides the GenAI ones).
const (
	AttrRolloutID     = attribute.Key("rollgate.rollout_id")
	AttrAttemptID     = attribute.Key("rollgate.attempt_id")
	AttrSequenceID    = attribute.Key("rollgate.sequence_id")
	AttrPolicyVersion = attribute.Key("rollgate.policy_version")
	AttrTokenSource   = attribute.Key("rollgate.token_source")
	AttrTokenCheck    = attribute.Key("rollgate.token_check")
	AttrTaskID        = attribute.Key("rollgate.task_id")
	AttrAgentName     = attribute.Key("rollgate.agent_name")
	AttrBackend       = attribute.Key("rollgate.backend")
	AttrEndpoint      = attribute.Key("rollgate.endpoint")
	AttrStream        = attribute.Key("rollgate.stream")
	AttrTTFTSeconds   = attribute.Key("rollgate.ttft_seconds")
	AttrChoiceCount   = attribute.Key("rollgate.choice_count")
)

// Config configures the OTLP sink. The zero value is "off": the sink is only
// created when Endpoint is set.
type Config struct {
	// Endpoint is where spans go: "host:port", or a URL. For HTTP a URL
	// without a path gets /v1/traces; an http:// URL implies Insecure.
	Endpoint string `yaml:"endpoint"`
	// Protocol is "http" (OTLP/HTTP protobuf, the default) or "grpc".
	Protocol string `yaml:"protocol"`
	// Headers are sent with every export request (e.g. authentication).
	Headers map[string]string `yaml:"headers"`
	// Insecure sends over plain HTTP / gRPC without TLS.
	Insecure bool `yaml:"insecure"`
	// Timeout bounds one export request (default 10s).
	Timeout time.Duration `yaml:"timeout"`
	// Compression is "gzip" or "" (none).
	Compression string `yaml:"compression"`
	// ServiceName is the resource's service.name (default "rollgate").
	ServiceName string `yaml:"service_name"`
	// ProviderName, when set, is recorded as gen_ai.provider.name (e.g. "openai").
	ProviderName string `yaml:"provider_name"`

	// Backends maps a replica name (the backend column) to its base URL, so
	// server.address and server.port name the engine. Replicas not listed
	// are parsed from their name ("host:port/path" is the default name).
	Backends map[string]string `yaml:"-"`
	// ParentSpanID, when set, returns the client's parent span id (16 hex
	// characters, from its traceparent) for a call, or "" for none.
	ParentSpanID func(c *export.Call) string `yaml:"-"`
}

// Enabled reports whether the configuration asks for OTLP export.
func (c *Config) Enabled() bool { return c.Endpoint != "" }

// Sink writes captured calls as spans to an OTLP receiver.
type Sink struct {
	cfg      Config
	exporter sdktrace.SpanExporter
	res      *resource.Resource
	scope    instrumentation.Scope
	servers  map[string]server
}

// server is a backend's server.address and server.port (0 when unknown).
type server struct {
	addr string
	port int
}

// New creates the exporter for cfg. It does not connect: the first Write does.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	cfg.setDefaults()
	exp, err := NewExporter(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &Sink{
		cfg:      cfg,
		exporter: exp,
		res: resource.NewWithAttributes(semconv.SchemaURL,
			semconv.ServiceName(cfg.ServiceName)),
		scope:   instrumentation.Scope{Name: ScopeName, SchemaURL: semconv.SchemaURL},
		servers: make(map[string]server, len(cfg.Backends)),
	}
	for name, u := range cfg.Backends {
		s.servers[name] = parseServer(u)
	}
	return s, nil
}

const defaultTimeout = 10 * time.Second

// setDefaults fills the zero settings with their defaults.
func (c *Config) setDefaults() {
	if c.Protocol == "" {
		c.Protocol = "http"
	}
	if c.Timeout <= 0 {
		c.Timeout = defaultTimeout
	}
	if c.ServiceName == "" {
		c.ServiceName = "rollgate"
	}
}

// NewExporter returns an OTLP span exporter for cfg's endpoint, protocol,
// headers, TLS, timeout and compression, for other span sources sharing the
// sink's configuration (the gateway's own tracing). It does not retry: a
// failed export is reported to the caller (the SDK's batch processor drops
// the batch and reports it to the OpenTelemetry error handler).
func NewExporter(ctx context.Context, cfg Config) (sdktrace.SpanExporter, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("otlp: no endpoint configured")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	return newExporter(ctx, &cfg)
}

func newExporter(ctx context.Context, cfg *Config) (sdktrace.SpanExporter, error) {
	ep := cfg.Endpoint
	hasScheme := strings.HasPrefix(ep, "http://") || strings.HasPrefix(ep, "https://")
	if hasScheme {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("otlp: endpoint %q: not a valid URL", ep)
		}
	}
	switch cfg.Compression {
	case "", "none", "gzip":
	default:
		return nil, fmt.Errorf("otlp: compression %q: want gzip or none", cfg.Compression)
	}
	switch strings.ToLower(cfg.Protocol) {
	case "", "http", "http/protobuf":
		opts := []otlptracehttp.Option{
			otlptracehttp.WithTimeout(cfg.Timeout),
			// The capture pipeline retries failed batches itself.
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}),
		}
		if hasScheme {
			u, _ := url.Parse(ep)
			if u.Path == "" || u.Path == "/" {
				u.Path = "/v1/traces"
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u.String()))
		} else {
			opts = append(opts, otlptracehttp.WithEndpoint(ep))
		}
		if cfg.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
		}
		if cfg.Compression == "gzip" {
			opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp: http exporter for %s: %w", ep, err)
		}
		return exp, nil
	case "grpc":
		opts := []otlptracegrpc.Option{
			otlptracegrpc.WithTimeout(cfg.Timeout),
			otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}),
		}
		if hasScheme {
			opts = append(opts, otlptracegrpc.WithEndpointURL(ep))
		} else {
			opts = append(opts, otlptracegrpc.WithEndpoint(ep))
		}
		if cfg.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		if len(cfg.Headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(cfg.Headers))
		}
		if cfg.Compression == "gzip" {
			opts = append(opts, otlptracegrpc.WithCompressor("gzip"))
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("otlp: grpc exporter for %s: %w", ep, err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("otlp: protocol %q: want http or grpc", cfg.Protocol)
}

// Name is the sink's name in metrics and logs.
func (s *Sink) Name() string { return "otlp" }

// Write exports one span per call in b (rewards and rollouts are ignored)
// and returns once the receiver acknowledged them.
func (s *Sink) Write(ctx context.Context, b *export.Batch) error {
	spans := s.Spans(b.Calls)
	if len(spans) == 0 {
		return nil
	}
	ro := make([]sdktrace.ReadOnlySpan, len(spans))
	for i := range spans {
		ro[i] = spans[i].Snapshot()
	}
	if err := s.exporter.ExportSpans(ctx, ro); err != nil {
		return fmt.Errorf("otlp: exporting %d spans to %s: %w", len(ro), s.cfg.Endpoint, err)
	}
	return nil
}

// Close flushes and shuts the exporter down.
func (s *Sink) Close(ctx context.Context) error {
	if err := s.exporter.Shutdown(ctx); err != nil {
		return fmt.Errorf("otlp: shutting down exporter: %w", err)
	}
	return nil
}

// Spans turns calls into span stubs: one per call (the choice 0 row), with
// the finish reasons of all its choices present in calls.
func (s *Sink) Spans(calls []export.Call) []tracetest.SpanStub {
	var reasons map[string][]string // span id → finish reasons of choices > 0
	var counts map[string]int
	for i := range calls {
		c := &calls[i]
		if c.ChoiceIndex == 0 {
			continue
		}
		if reasons == nil {
			reasons, counts = map[string][]string{}, map[string]int{}
		}
		counts[c.SpanID]++
		if c.FinishReason != "" {
			reasons[c.SpanID] = append(reasons[c.SpanID], c.FinishReason)
		}
	}
	out := make([]tracetest.SpanStub, 0, len(calls))
	for i := range calls {
		c := &calls[i]
		if c.ChoiceIndex != 0 {
			continue
		}
		out = append(out, s.stub(c, reasons[c.SpanID], counts[c.SpanID]+1))
	}
	return out
}

// Operation is the gen_ai.operation.name for an endpoint column value.
func Operation(endpoint string) string {
	switch {
	case strings.HasSuffix(endpoint, "/chat/completions"), strings.HasSuffix(endpoint, "/responses"), strings.HasSuffix(endpoint, "/messages"):
		return semconv.GenAIOperationNameChat.Value.AsString()
	case strings.HasSuffix(endpoint, "/completions"):
		return semconv.GenAIOperationNameTextCompletion.Value.AsString()
	case strings.HasSuffix(endpoint, "/embeddings"):
		return semconv.GenAIOperationNameEmbeddings.Value.AsString()
	}
	return "other"
}

func (s *Sink) stub(c *export.Call, moreReasons []string, choices int) tracetest.SpanStub {
	op := Operation(c.Endpoint)
	name := op
	if c.Model != "" {
		name = op + " " + c.Model
	}
	attrs := make([]attribute.KeyValue, 0, 24)
	attrs = append(attrs, semconv.GenAIOperationNameKey.String(op))
	if s.cfg.ProviderName != "" {
		attrs = append(attrs, semconv.GenAIProviderNameKey.String(s.cfg.ProviderName))
	}
	if c.Model != "" {
		attrs = append(attrs, semconv.GenAIRequestModelKey.String(c.Model))
	}
	var reasons []string
	if c.FinishReason != "" {
		reasons = append(reasons, c.FinishReason)
	}
	reasons = append(reasons, moreReasons...)
	if len(reasons) > 0 {
		attrs = append(attrs, semconv.GenAIResponseFinishReasonsKey.StringSlice(reasons))
	}
	if c.PromptTokens > 0 || c.CompletionTokens > 0 {
		attrs = append(attrs,
			semconv.GenAIUsageInputTokensKey.Int64(int64(c.PromptTokens)),
			semconv.GenAIUsageOutputTokensKey.Int64(int64(c.CompletionTokens)))
	}
	if c.Backend != "" {
		srv, ok := s.servers[c.Backend]
		if !ok {
			srv = parseServer(c.Backend)
		}
		attrs = append(attrs, semconv.ServerAddressKey.String(srv.addr), AttrBackend.String(c.Backend))
		if srv.port > 0 {
			attrs = append(attrs, semconv.ServerPortKey.Int(srv.port))
		}
	}
	if c.HTTPStatus != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCodeKey.Int(int(c.HTTPStatus)))
	}
	if c.RolloutID != "" {
		attrs = append(attrs, AttrRolloutID.String(c.RolloutID), AttrAttemptID.String(c.AttemptID))
	}
	if c.TaskID != "" {
		attrs = append(attrs, AttrTaskID.String(c.TaskID))
	}
	if c.AgentName != "" {
		attrs = append(attrs, AttrAgentName.String(c.AgentName))
	}
	attrs = append(attrs,
		AttrSequenceID.Int64(int64(c.SequenceID)),
		AttrEndpoint.String(c.Endpoint),
		AttrStream.Bool(c.Stream))
	if c.PolicyVersion != "" {
		attrs = append(attrs, AttrPolicyVersion.String(c.PolicyVersion))
	}
	if c.TokenSource != "" {
		attrs = append(attrs, AttrTokenSource.String(c.TokenSource))
	}
	if c.TokenCheck != "" {
		attrs = append(attrs, AttrTokenCheck.String(c.TokenCheck))
	}
	if c.TTFTNano > 0 {
		attrs = append(attrs, AttrTTFTSeconds.Float64(float64(c.TTFTNano)/1e9))
	}
	if choices > 1 {
		attrs = append(attrs, AttrChoiceCount.Int(choices))
	}

	var status sdktrace.Status
	if c.Error != "" || c.HTTPStatus >= 400 {
		typ := semconv.ErrorTypeOther.Value.AsString()
		if c.HTTPStatus >= 400 {
			typ = strconv.Itoa(int(c.HTTPStatus))
		}
		attrs = append(attrs, semconv.ErrorTypeKey.String(typ))
		status = sdktrace.Status{Code: codes.Error, Description: c.Error}
	}

	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    traceID(c.TraceID),
		SpanID:     spanID(c.SpanID),
		TraceFlags: trace.FlagsSampled,
	})
	var parent trace.SpanContext
	if s.cfg.ParentSpanID != nil {
		if p, err := trace.SpanIDFromHex(s.cfg.ParentSpanID(c)); err == nil {
			parent = trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: sc.TraceID(), SpanID: p, TraceFlags: trace.FlagsSampled, Remote: true,
			})
		}
	}
	start := time.Unix(0, int64(c.StartTimeUnixNano))
	end := time.Unix(0, int64(c.EndTimeUnixNano))
	if end.Before(start) {
		end = start
	}
	return tracetest.SpanStub{
		Name:                 name,
		SpanContext:          sc,
		Parent:               parent,
		SpanKind:             trace.SpanKindClient,
		StartTime:            start,
		EndTime:              end,
		Attributes:           attrs,
		Status:               status,
		Resource:             s.res,
		InstrumentationScope: s.scope,
	}
}

// traceID parses a 32-hex trace id, or returns a random one when it is
// missing or malformed (a span needs a valid id).
func traceID(h string) trace.TraceID {
	if id, err := trace.TraceIDFromHex(h); err == nil {
		return id
	}
	var id trace.TraceID
	fill(id[:])
	return id
}

// spanID parses a 16-hex span id, or returns a random one.
func spanID(h string) trace.SpanID {
	if id, err := trace.SpanIDFromHex(h); err == nil {
		return id
	}
	var id trace.SpanID
	fill(id[:])
	return id
}

func fill(b []byte) {
	for {
		_, _ = rand.Read(b)
		for _, c := range b {
			if c != 0 {
				return
			}
		}
	}
}

// parseServer reads server.address and server.port from a base URL or a
// replica name of the form host[:port][/path] (port 0 when not known).
func parseServer(s string) server {
	explicit := strings.Contains(s, "://")
	raw := s
	if !explicit {
		raw = "http://" + s
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return server{addr: s}
	}
	srv := server{addr: u.Hostname()}
	if p := u.Port(); p != "" {
		srv.port, _ = strconv.Atoi(p)
	} else if explicit && u.Scheme == "https" {
		srv.port = 443
	} else if explicit && u.Scheme == "http" {
		srv.port = 80
	}
	return srv
}
