package controlplane

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/jsonscan"
)

// Attribute keys that attribute an agent span to a rollout (span attributes
// first, then resource attributes, then the per-rollout path or headers).
var (
	rolloutKeys  = []string{"rollgate.rollout_id", "rollout_id"}
	attemptKeys  = []string{"rollgate.attempt_id", "attempt_id"}
	toolNameKeys = []string{"gen_ai.tool.name", "tool.name", "tool_name"}
	toolCallKeys = []string{"gen_ai.tool.call.id", "tool_call_id", "tool.call.id"}
)

// ServeTraces is the OTLP/HTTP trace receiver (POST /v1/traces, also under
// the per-rollout prefix, which attributes the spans to rolloutID and
// attemptID): protobuf or JSON, optionally gzipped. Spans are stored
// in agent_spans before the answer, so a 200 means stored; a store failure
// answers 503, which OTLP exporters retry.
func (s *Server) ServeTraces(ctx *fasthttp.RequestCtx, rolloutID, attemptID string) {
	isJSON := bytes.HasPrefix(ctx.Request.Header.ContentType(), []byte("application/json"))
	if !ctx.IsPost() {
		s.otlpError(ctx, isJSON, fasthttp.StatusMethodNotAllowed, "use POST /v1/traces")
		return
	}
	if !s.gw.ClientAuthorized(ctx) {
		s.otlpError(ctx, isJSON, fasthttp.StatusUnauthorized, "Incorrect API key provided")
		return
	}
	if !isJSON && !bytes.HasPrefix(ctx.Request.Header.ContentType(), []byte("application/x-protobuf")) {
		s.otlpError(ctx, isJSON, fasthttp.StatusUnsupportedMediaType, "Content-Type must be application/x-protobuf or application/json")
		return
	}
	body := ctx.PostBody()
	if enc := string(ctx.Request.Header.ContentEncoding()); enc == "gzip" {
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			s.otlpError(ctx, isJSON, fasthttp.StatusBadRequest, "bad gzip body: "+err.Error())
			return
		}
		limit := int64(s.cfg.MaxRequestBodyBytes)
		b, err := io.ReadAll(io.LimitReader(zr, limit+1))
		if err != nil {
			s.otlpError(ctx, isJSON, fasthttp.StatusBadRequest, "bad gzip body: "+err.Error())
			return
		}
		if int64(len(b)) > limit {
			s.otlpError(ctx, isJSON, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("decompressed body larger than %d bytes", limit))
			return
		}
		body = b
	} else if enc != "" && enc != "identity" {
		s.otlpError(ctx, isJSON, fasthttp.StatusUnsupportedMediaType, "Content-Encoding "+enc+" is not supported (use gzip)")
		return
	}
	req, err := DecodeOTLPTraces(body, isJSON)
	if err != nil {
		s.otlpError(ctx, isJSON, fasthttp.StatusBadRequest, err.Error())
		return
	}
	spans, rejected, why := SpansFromOTLP(req, rolloutID, attemptID, uint64(time.Now().UnixNano()))
	if len(spans) > 0 {
		c, cancel := s.storeCtx()
		err := s.store.Write(c, &export.Batch{Spans: spans})
		cancel()
		if err != nil {
			ctx.Response.Header.Set("Retry-After", "5")
			s.otlpError(ctx, isJSON, fasthttp.StatusServiceUnavailable, "storing spans (nothing stored; retry): "+err.Error())
			return
		}
	}
	for _, sp := range spans {
		a := "false"
		if sp.RolloutID != "" {
			a = "true"
		}
		s.m.AgentSpans.WithLabelValues(a, "stored").Inc()
	}
	if rejected > 0 {
		s.m.AgentSpans.WithLabelValues("false", "rejected").Add(float64(rejected))
	}
	resp := &coltrace.ExportTraceServiceResponse{}
	if rejected > 0 {
		resp.PartialSuccess = &coltrace.ExportTracePartialSuccess{RejectedSpans: int64(rejected), ErrorMessage: why}
	}
	s.otlpAnswer(ctx, isJSON, fasthttp.StatusOK, resp)
}

func (s *Server) otlpAnswer(ctx *fasthttp.RequestCtx, isJSON bool, status int, m proto.Message) {
	var b []byte
	var err error
	if isJSON {
		ctx.SetContentType("application/json")
		b, err = protojson.Marshal(m)
	} else {
		ctx.SetContentType("application/x-protobuf")
		b, err = proto.Marshal(m)
	}
	if err != nil {
		s.log.Error("encoding an OTLP answer", "err", err)
	}
	ctx.SetStatusCode(status)
	ctx.SetBody(b)
}

// otlpError answers with a google.rpc.Status, as OTLP/HTTP specifies.
func (s *Server) otlpError(ctx *fasthttp.RequestCtx, isJSON bool, status int, msg string) {
	code := int32(3) // INVALID_ARGUMENT
	if status == fasthttp.StatusServiceUnavailable {
		code = 14 // UNAVAILABLE
	}
	s.otlpAnswer(ctx, isJSON, status, &rpcstatus.Status{Code: code, Message: msg})
}

// DecodeOTLPTraces decodes an ExportTraceServiceRequest from protobuf or from
// OTLP/JSON, whose trace and span ids are hex strings (not base64 as
// protojson expects for bytes).
func DecodeOTLPTraces(body []byte, isJSON bool) (*coltrace.ExportTraceServiceRequest, error) {
	req := &coltrace.ExportTraceServiceRequest{}
	if !isJSON {
		if err := proto.Unmarshal(body, req); err != nil {
			return nil, fmt.Errorf("bad OTLP protobuf body: %w", err)
		}
		return req, nil
	}
	if err := jsonscan.Validate(body); errors.Is(err, jsonscan.ErrTooDeep) {
		return nil, fmt.Errorf("bad OTLP JSON body: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("bad OTLP JSON body: %w", err)
	}
	if err := hexIDsToBase64(v, 0); err != nil {
		return nil, err
	}
	fixed, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("bad OTLP JSON body: %w", err)
	}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(fixed, req); err != nil {
		return nil, fmt.Errorf("bad OTLP JSON body: %w", err)
	}
	return req, nil
}

// hexIDsToBase64 rewrites, anywhere in v, the id fields OTLP/JSON writes as
// hex into the base64 protojson reads.
func hexIDsToBase64(v any, depth int) error {
	if depth > 64 {
		return errors.New("bad OTLP JSON body: nested too deeply")
	}
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			switch k {
			case "traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id":
				if h, ok := val.(string); ok {
					b, err := hex.DecodeString(h)
					if err != nil {
						return fmt.Errorf("bad OTLP JSON body: %s %q is not hex", k, h)
					}
					x[k] = base64.StdEncoding.EncodeToString(b)
				}
				continue
			}
			if err := hexIDsToBase64(val, depth+1); err != nil {
				return err
			}
		}
	case []any:
		for _, e := range x {
			if err := hexIDsToBase64(e, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// SpansFromOTLP turns a decoded request into agent_spans rows. rollout and
// attempt attribute spans that carry no attribution of their own. Spans with
// ids of the wrong length are rejected and counted; why says the first reason.
func SpansFromOTLP(req *coltrace.ExportTraceServiceRequest, rollout, attempt string, now uint64) (out []export.Span, rejected int, why string) {
	for _, rs := range req.GetResourceSpans() {
		rattrs := rs.GetResource().GetAttributes()
		service := attrString(rattrs, "service.name")
		rRollout, rAttempt := firstAttr(rattrs, rolloutKeys), firstAttr(rattrs, attemptKeys)
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				if len(sp.GetTraceId()) != 16 || len(sp.GetSpanId()) != 8 || (len(sp.GetParentSpanId()) != 0 && len(sp.GetParentSpanId()) != 8) {
					rejected++
					if why == "" {
						why = fmt.Sprintf("span %q: trace id must be 16 bytes, span ids 8", sp.GetName())
					}
					continue
				}
				attrs := sp.GetAttributes()
				row := export.Span{
					TraceID: hex.EncodeToString(sp.GetTraceId()), SpanID: hex.EncodeToString(sp.GetSpanId()),
					ParentSpanID: hex.EncodeToString(sp.GetParentSpanId()), Name: sp.GetName(),
					Kind:        strings.ToLower(strings.TrimPrefix(sp.GetKind().String(), "SPAN_KIND_")),
					ServiceName: service, ToolName: firstAttr(attrs, toolNameKeys), ToolCallID: firstAttr(attrs, toolCallKeys),
					StatusCode:    strings.ToLower(strings.TrimPrefix(sp.GetStatus().GetCode().String(), "STATUS_CODE_")),
					StatusMessage: sp.GetStatus().GetMessage(), StartTimeUnixNano: sp.GetStartTimeUnixNano(),
					EndTimeUnixNano: sp.GetEndTimeUnixNano(), Attributes: attrsJSON(attrs), ReceivedUnixNano: now,
				}
				row.RolloutID, row.AttemptID = firstAttr(attrs, rolloutKeys), firstAttr(attrs, attemptKeys)
				if row.RolloutID == "" {
					row.RolloutID, row.AttemptID = rRollout, rAttempt
				}
				if row.RolloutID == "" {
					row.RolloutID, row.AttemptID = rollout, attempt
				}
				out = append(out, row)
			}
		}
	}
	return out, rejected, why
}

func firstAttr(kvs []*commonpb.KeyValue, keys []string) string {
	for _, k := range keys {
		if v := attrString(kvs, k); v != "" {
			return v
		}
	}
	return ""
}

func attrString(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			switch v := anyValue(kv.GetValue(), 0).(type) {
			case string:
				return v
			case nil:
				return ""
			default:
				b, _ := json.Marshal(v)
				return string(b)
			}
		}
	}
	return ""
}

// attrsJSON renders attributes as a JSON object.
func attrsJSON(kvs []*commonpb.KeyValue) string {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = anyValue(kv.GetValue(), 0)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// anyValue converts an OTLP AnyValue to plain Go values for JSON.
func anyValue(v *commonpb.AnyValue, depth int) any {
	if v == nil || depth > 32 {
		return nil
	}
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BytesValue:
		return base64.StdEncoding.EncodeToString(x.BytesValue)
	case *commonpb.AnyValue_ArrayValue:
		out := make([]any, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, anyValue(e, depth+1))
		}
		return out
	case *commonpb.AnyValue_KvlistValue:
		out := map[string]any{}
		for _, kv := range x.KvlistValue.GetValues() {
			out[kv.GetKey()] = anyValue(kv.GetValue(), depth+1)
		}
		return out
	}
	return nil
}
