package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/rollgate/rollgate/export/otlp"
	"github.com/rollgate/rollgate/gateway/backends"
)

// TracerScope is the instrumentation scope of the gateway's own spans.
const TracerScope = "github.com/rollgate/rollgate/gateway"

// Attribute keys of the gateway's own spans (besides the HTTP, server and
// GenAI ones, and otlp's rollout attributes).
const (
	// AttrRequestID is the captured call's span id (x-request-id): the id of
	// the GenAI span export/otlp sends for the same call.
	AttrRequestID = attribute.Key("rollgate.request_id")
	// AttrBackendAttempts counts the backend attempts of a call (1 = no retry).
	AttrBackendAttempts = attribute.Key("rollgate.backend_attempts")
	// AttrBackendAttempt numbers one attempt (1 = first try, 2 = first retry...).
	AttrBackendAttempt = attribute.Key("rollgate.backend_attempt")
	// AttrRetried says the gateway sent the call again after this attempt failed.
	AttrRetried = attribute.Key("rollgate.retried")
	// AttrBackendURL is the replica's base URL.
	AttrBackendURL = attribute.Key("rollgate.backend_url")
)

// TracingOptions configures the gateway's own tracing.
type TracingOptions struct {
	// SampleRatio is the fraction (0 < r <= 1) of calls without a
	// traceparent that are traced, decided on the call's trace id. A call
	// whose traceparent is sampled is always traced (the agent's trace stays
	// complete), one whose traceparent is not sampled never is.
	SampleRatio float64
	// ServiceName is the resource's service.name (default "rollgate").
	ServiceName string
	// BatchTimeout is the longest a finished span waits before it is sent
	// (default 5s, the OpenTelemetry SDK's).
	BatchTimeout time.Duration
}

// Tracing makes the gateway's own spans: one SERVER span per call handled
// (the proxy hop: routing, pause and concurrency waits, the answer) with one
// CLIENT child span per backend attempt, retries included. Spans are queued
// and exported in batches off the hot path by the OpenTelemetry SDK's batch
// processor (bounded queue: spans are dropped, never waited for, when it is
// full). A call's spans use its trace id (the client's traceparent trace id,
// or the one the gateway made for the captured row), so they sit in the same
// trace as the captured call's GenAI span.
//
// A gateway without Tracing (the default) does no tracing work at all; with
// it, a call that is not sampled costs one sampling decision and allocates
// nothing.
type Tracing struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	root   sdktrace.Sampler // for calls without a parent
}

// NewTracing returns the gateway's tracer sending spans to exp.
func NewTracing(exp sdktrace.SpanExporter, opt TracingOptions) (*Tracing, error) {
	if !(opt.SampleRatio > 0 && opt.SampleRatio <= 1) {
		return nil, fmt.Errorf("gateway tracing: sample ratio %v: want 0 < ratio <= 1 (0 turns tracing off)", opt.SampleRatio)
	}
	if opt.ServiceName == "" {
		opt.ServiceName = "rollgate"
	}
	var bopts []sdktrace.BatchSpanProcessorOption
	if opt.BatchTimeout > 0 {
		bopts = append(bopts, sdktrace.WithBatchTimeout(opt.BatchTimeout))
	}
	root := sdktrace.TraceIDRatioBased(opt.SampleRatio)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp, bopts...),
		sdktrace.WithSampler(sdktrace.ParentBased(root)),
		sdktrace.WithIDGenerator(callIDs{}),
		sdktrace.WithResource(resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(opt.ServiceName))),
	)
	return &Tracing{
		tp:     tp,
		tracer: tp.Tracer(TracerScope, trace.WithSchemaURL(semconv.SchemaURL)),
		root:   root,
	}, nil
}

// Flush exports every finished span now.
func (t *Tracing) Flush(ctx context.Context) error {
	if err := t.tp.ForceFlush(ctx); err != nil {
		return fmt.Errorf("gateway tracing: flush: %w", err)
	}
	return nil
}

// Shutdown exports the spans still queued and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("gateway tracing: shutdown: %w", err)
	}
	return nil
}

// callTrace is a traced call's spans; the zero value (not sampled) does nothing.
type callTrace struct {
	span     trace.Span // the proxy hop; nil when the call is not traced
	ctx      context.Context
	attempt  trace.Span // the backend attempt in progress
	attempts int
}

// callTraceKey carries a call's trace id to callIDs.
type callTraceKey struct{}

// callIDs is the tracer's id generator: a root span takes the call's trace
// id from its context, so the gateway's spans join the captured call's trace.
type callIDs struct{}

// NewIDs implements sdktrace.IDGenerator.
func (callIDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	tid, _ := ctx.Value(callTraceKey{}).(trace.TraceID)
	for !tid.IsValid() {
		putUint64(tid[:8], rand.Uint64())
		putUint64(tid[8:], rand.Uint64())
	}
	return tid, newSpanID()
}

// NewSpanID implements sdktrace.IDGenerator.
func (callIDs) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		putUint64(sid[:], rand.Uint64())
	}
	return sid
}

func putUint64(b []byte, v uint64) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// begin starts the call's SERVER span when the call is sampled.
func (t *Tracing) begin(ctx *fasthttp.RequestCtx, c *call) {
	ids := &c.pend.IDs
	var tid trace.TraceID
	if !ids.Set || !decodeHex(tid[:], ids.Trace[:]) {
		return
	}
	var parent trace.SpanContext
	if ids.HasParent {
		tp := ctx.Request.Header.Peek("traceparent")
		var flags [1]byte
		if len(tp) < 55 || !decodeHex(flags[:], tp[53:55]) || flags[0]&byte(trace.FlagsSampled) == 0 {
			return // the client's trace is not sampled
		}
		var psid trace.SpanID
		if !decodeHex(psid[:], ids.Parent[:]) {
			return
		}
		ts, _ := trace.ParseTraceState(string(ctx.Request.Header.Peek("tracestate")))
		parent = trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: tid, SpanID: psid, TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
		})
	} else if t.root.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid}).Decision != sdktrace.RecordAndSample {
		return
	}
	sctx := context.WithValue(context.Background(), callTraceKey{}, tid)
	if parent.IsValid() {
		sctx = trace.ContextWithRemoteSpanContext(sctx, parent)
	}
	m := &c.pend.Meta
	attrs := make([]attribute.KeyValue, 0, 10)
	attrs = append(attrs,
		semconv.HTTPRequestMethodKey.String("POST"),
		semconv.HTTPRouteKey.String(m.Endpoint),
		semconv.URLPathKey.String(string(ctx.Path())),
		semconv.GenAIOperationNameKey.String(otlp.Operation(m.Endpoint)),
		AttrRequestID.String(string(ids.Span[:])))
	// Attribution and sequence id are set by end: a call gets them only once
	// admitted (authenticated, within limits).
	var sid trace.SpanID
	var links []trace.Link
	if decodeHex(sid[:], ids.Span[:]) {
		// The captured call's GenAI span (export/otlp) in the same trace.
		links = []trace.Link{{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled})}}
	}
	c.tr.ctx, c.tr.span = t.tracer.Start(sctx, "POST "+m.Endpoint,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(c.start),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
}

// attemptStart starts the CLIENT span of one backend attempt (n from 0).
func (t *Tracing) attemptStart(c *call, r *backends.Upstream, n int, path []byte) {
	if c.tr.span == nil {
		return
	}
	c.tr.attempts = n + 1
	attrs := make([]attribute.KeyValue, 0, 10)
	full := r.Origin() + r.BasePath() + strings.TrimPrefix(string(path), "/v1")
	attrs = append(attrs,
		semconv.HTTPRequestMethodKey.String("POST"),
		semconv.URLFullKey.String(full),
		otlp.AttrBackend.String(r.Name()),
		AttrBackendURL.String(r.Spec().URL),
		AttrBackendAttempt.Int(n+1))
	if u, err := url.Parse(r.Origin()); err == nil {
		attrs = append(attrs, semconv.ServerAddressKey.String(u.Hostname()))
		if p, err := strconv.Atoi(u.Port()); err == nil {
			attrs = append(attrs, semconv.ServerPortKey.Int(p))
		}
	}
	if n > 0 {
		attrs = append(attrs, semconv.HTTPRequestResendCountKey.Int(n))
	}
	if pv := r.Spec().PolicyVersion; pv != "" {
		attrs = append(attrs, otlp.AttrPolicyVersion.String(pv))
	}
	route := strings.TrimPrefix(string(path), "/v1")
	_, c.tr.attempt = t.tracer.Start(c.tr.ctx, "POST "+r.BasePath()+route, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// attemptFailed ends the current attempt's span with the error that ended
// it before any response; retried says whether the call is sent again.
func (t *Tracing) attemptFailed(c *call, err error, retried bool) {
	sp := c.tr.attempt
	if sp == nil {
		return
	}
	c.tr.attempt = nil
	sp.RecordError(err)
	sp.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)), AttrRetried.Bool(retried))
	sp.SetStatus(codes.Error, err.Error())
	sp.End()
}

// end finishes a traced call's spans from its captured row.
func (t *Tracing) end(c *call, end time.Time) {
	m := &c.pend.Meta
	if sp := c.tr.attempt; sp != nil {
		c.tr.attempt = nil
		if m.HTTPStatus != 0 {
			sp.SetAttributes(semconv.HTTPResponseStatusCodeKey.Int(int(m.HTTPStatus)))
		}
		if m.HTTPStatus >= 400 || m.Error != "" {
			typ := "_OTHER"
			if m.HTTPStatus >= 400 {
				typ = statusLabel(m.HTTPStatus)
			}
			sp.SetAttributes(semconv.ErrorTypeKey.String(typ))
			sp.SetStatus(codes.Error, m.Error)
		}
		sp.End(trace.WithTimestamp(end))
	}
	sp := c.tr.span
	attrs := make([]attribute.KeyValue, 0, 14)
	attrs = append(attrs,
		semconv.HTTPResponseStatusCodeKey.Int(int(m.HTTPStatus)),
		AttrBackendAttempts.Int(c.tr.attempts),
		otlp.AttrStream.Bool(m.Stream))
	if m.SequenceID != 0 {
		attrs = append(attrs, otlp.AttrSequenceID.Int64(int64(m.SequenceID)))
	}
	if m.RolloutID != "" {
		attrs = append(attrs, otlp.AttrRolloutID.String(m.RolloutID), otlp.AttrAttemptID.String(m.AttemptID))
	}
	if m.TaskID != "" {
		attrs = append(attrs, otlp.AttrTaskID.String(m.TaskID))
	}
	if m.AgentName != "" {
		attrs = append(attrs, otlp.AttrAgentName.String(m.AgentName))
	}
	if m.Model != "" {
		attrs = append(attrs, semconv.GenAIRequestModelKey.String(m.Model))
	}
	if m.Backend != "" {
		attrs = append(attrs, otlp.AttrBackend.String(m.Backend))
	}
	if m.PolicyVersion != "" {
		attrs = append(attrs, otlp.AttrPolicyVersion.String(m.PolicyVersion))
	}
	if m.TTFTNano > 0 {
		attrs = append(attrs, otlp.AttrTTFTSeconds.Float64(float64(m.TTFTNano)/1e9))
	}
	// A SERVER span is an error for 5xx, or when the call failed after its
	// status was sent (stream cut short, client gone).
	if m.HTTPStatus >= 500 || (m.Error != "" && m.HTTPStatus < 400) {
		typ := "_OTHER"
		if m.HTTPStatus >= 500 {
			typ = statusLabel(m.HTTPStatus)
		}
		attrs = append(attrs, semconv.ErrorTypeKey.String(typ))
		sp.SetStatus(codes.Error, m.Error)
	}
	sp.SetAttributes(attrs...)
	sp.End(trace.WithTimestamp(end))
	c.tr = callTrace{}
}

// errorType is error.type for a backend call that failed before a response.
func errorType(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrTimeout), errors.Is(err, fasthttp.ErrDialTimeout), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED), strings.Contains(err.Error(), "connection refused"):
		return "connection_refused"
	case errors.Is(err, syscall.ECONNRESET), strings.Contains(err.Error(), "connection reset"):
		return "connection_reset"
	case errors.Is(err, fasthttp.ErrConnectionClosed), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection_closed"
	}
	return "_OTHER"
}

// decodeHex decodes lowercase hex src into dst (len(src) == 2*len(dst)).
func decodeHex(dst, src []byte) bool {
	if len(src) != 2*len(dst) {
		return false
	}
	for i := range dst {
		hi, ok1 := unhex(src[2*i])
		lo, ok2 := unhex(src[2*i+1])
		if !ok1 || !ok2 {
			return false
		}
		dst[i] = hi<<4 | lo
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Interface guard.
var _ sdktrace.IDGenerator = callIDs{}
