package otlp_test

import (
	"compress/gzip"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// gotSpan is one span as a receiver decoded it, with its resource's
// service.name, scope name, and the export request's headers.
type gotSpan struct {
	span    *tracepb.Span
	service string
	scope   string
	headers map[string]string
}

// receiver records the spans of every OTLP export request it accepts.
type receiver struct {
	mu       sync.Mutex
	spans    []gotSpan
	requests int
	fail     int // HTTP status to answer with instead of accepting (0 = accept)
	changed  chan struct{}
}

func newReceiver() *receiver { return &receiver{changed: make(chan struct{}, 1)} }

func (r *receiver) record(req *coltracepb.ExportTraceServiceRequest, headers map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests++
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, gotSpan{span: sp, service: service, scope: ss.GetScope().GetName(), headers: headers})
			}
		}
	}
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// snapshot returns the spans received so far and the number of requests.
func (r *receiver) snapshot() ([]gotSpan, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gotSpan(nil), r.spans...), r.requests
}

// waitSpans waits until at least n spans arrived (15 s at most).
func (r *receiver) waitSpans(t *testing.T, n int) []gotSpan {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		if got, _ := r.snapshot(); len(got) >= n {
			return got
		}
		select {
		case <-r.changed:
		case <-deadline:
			got, _ := r.snapshot()
			t.Fatalf("receiver: %d spans after 15s, want %d", len(got), n)
		}
	}
}

// startHTTPReceiver serves OTLP/HTTP (protobuf) on POST /v1/traces on a
// loopback port and returns its base URL.
func startHTTPReceiver(t *testing.T, r *receiver) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
			http.Error(w, "content type "+ct, http.StatusUnsupportedMediaType)
			return
		}
		r.mu.Lock()
		fail := r.fail
		r.mu.Unlock()
		if fail != 0 {
			http.Error(w, "refused by test", fail)
			return
		}
		var msg coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		h := map[string]string{}
		for k := range req.Header {
			h[http.CanonicalHeaderKey(k)] = req.Header.Get(k)
		}
		r.record(&msg, h)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	})
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// grpcTraceService is the official OTLP collector trace service, recording.
type grpcTraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *receiver
}

func (s *grpcTraceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	h := map[string]string{}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for k, v := range md {
			if len(v) > 0 {
				h[http.CanonicalHeaderKey(k)] = v[0]
			}
		}
	}
	s.r.record(req, h)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// startGRPCReceiver serves the OTLP gRPC trace service on a loopback port and
// returns host:port.
func startGRPCReceiver(t *testing.T, r *receiver) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, &grpcTraceService{r: r})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// attrs flattens a span's attributes into Go values (string, int64, float64,
// bool, []string).
func attrs(sp *tracepb.Span) map[string]any {
	m := map[string]any{}
	for _, kv := range sp.GetAttributes() {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_ArrayValue:
		var out []string
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, e.GetStringValue())
		}
		return out
	}
	return nil
}

// post sends a JSON POST with optional header pairs and drains the answer.
func post(t *testing.T, url, body string, headers ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}
