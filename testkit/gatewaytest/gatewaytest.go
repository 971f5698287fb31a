// Package gatewaytest starts what the gateway's and the control plane's
// tests run against: a mock engine, a gateway with its control plane mounted
// and a store, on loopback, with helpers to call them and read what was
// stored. Test code only.
package gatewaytest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/controlplane"
	_ "github.com/rollgate/rollgate/engines/llamacpp" // the engine kinds, registered as cmd/rollgate does
	_ "github.com/rollgate/rollgate/engines/openai"
	_ "github.com/rollgate/rollgate/engines/sglang"
	_ "github.com/rollgate/rollgate/engines/vllm"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// SequenceStore opens a sequence store (gateway.Config.SequenceStore) in a
// SQLite file of t's temporary directory, as rollgate serve opens one beside
// its database. It is closed when t ends.
func SequenceStore(t testing.TB) seqstore.Store {
	t.Helper()
	st, err := seqstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "sequences.db"), seqstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// clickhouseDSN is the real ClickHouse server started for this test binary.
var clickhouseDSN string

// Main is a test binary's TestMain: it starts a real ClickHouse for
// StoreKinds, runs the tests and exits with their code.
func Main(m *testing.M) {
	dsn, stop, err := testenv.StartClickHouse()
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway tests need a real ClickHouse:", err)
		os.Exit(1)
	}
	clickhouseDSN = dsn
	code := m.Run()
	stop()
	os.Exit(code)
}

// OpenSQLite opens an embedded store in a temporary directory and returns
// it with its path.
func OpenSQLite(t *testing.T) (export.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rollgate.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

var dbSeq atomic.Int64

// StoreKinds runs f once with the embedded store and once with ClickHouse.
func StoreKinds(t *testing.T, f func(t *testing.T, open func(t *testing.T) export.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		f(t, func(t *testing.T) export.Store {
			s, err := sqlite.Open(filepath.Join(t.TempDir(), "rollgate.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
	t.Run("clickhouse", func(t *testing.T) {
		f(t, func(t *testing.T) export.Store {
			db := fmt.Sprintf("gw_test_%d_%d", time.Now().UnixNano()%1e9, dbSeq.Add(1))
			s, err := clickhouse.Open(context.Background(), testenv.FreshDatabase(clickhouseDSN, db), clickhouse.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		})
	})
}

// Env is a running mock engine, gateway (with its control plane) and store
// on loopback.
type Env struct {
	T       *testing.T
	Mock    *mock.Server
	MockURL string // http://127.0.0.1:P/v1
	Store   export.Store
	M       *metrics.Metrics
	Pipe    *capture.Pipeline
	GW      *gateway.Server
	CP      *controlplane.Server
	URL     string // http://127.0.0.1:P
}

// NewEnv starts a mock (kind vllm, model "*") and a gateway in front of it.
// mutate may change the gateway config before start.
func NewEnv(t *testing.T, store export.Store, mutate func(*gateway.Config)) *Env {
	t.Helper()
	return NewEnvWith(t, store, mock.Config{}, mutate)
}

// NewEnvWith is NewEnv with the mock engine configured by mc (for example
// another flavour: SGLang, llama.cpp).
func NewEnvWith(t *testing.T, store export.Store, mc mock.Config, mutate func(*gateway.Config)) *Env {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return NewEnvOn(t, ln, store, mc, mutate)
}

// NewEnvOn is NewEnvWith with the gateway serving on ln (a test's own
// listener, for example one that records what the gateway writes).
func NewEnvOn(t *testing.T, ln net.Listener, store export.Store, mc mock.Config, mutate func(*gateway.Config)) *Env {
	t.Helper()
	ms, base, err := mock.Start(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	e := &Env{T: t, Mock: ms, MockURL: base, Store: store, M: metrics.New()}
	cfg := gateway.Config{
		Listen:          ln.Addr().String(),
		UpstreamTimeout: 20 * time.Second,
		Backends: []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{
			{Name: "mock-1", URL: base, Kind: "vllm", PolicyVersion: "v7"},
		}}},
		SequenceStore: SequenceStore(t),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	pc := capture.Config{FlushInterval: 10 * time.Millisecond, BatchSize: 64}
	if err := pc.UseEngines(cfg.DisableTokenizeFallback, cfg.DetokCheck); err != nil {
		t.Fatal(err)
	}
	e.Pipe = capture.NewPipeline(pc, []capture.NamedSink{{Name: store.Name(), Sink: store}}, e.M, nil)
	gw, err := gateway.New(cfg, e.Pipe, e.M, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.GW = gw
	e.CP = controlplane.New(controlplane.ConfigOf(cfg), gw, store, e.Pipe, e.M, nil)
	gw.SetControlPlane(e.CP)
	go gw.Serve(ln)
	e.URL = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.CP.Close()
		gw.Shutdown(ctx)
		e.Pipe.Close(ctx)
	})
	return e
}

// Resp is a finished HTTP exchange.
type Resp struct {
	Status int
	Header http.Header
	Body   []byte
}

// Do sends a request to base+path with optional headers (pairs of name,
// value). A body is sent as application/json unless the headers say
// otherwise; a header with an empty value is not sent (Content-Type, ""
// sends a body without one), and "Host" sets the Host header.
func Do(t *testing.T, method, url, body string, headers ...string) Resp {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		switch {
		case strings.EqualFold(headers[i], "Host"):
			req.Host = headers[i+1]
		case headers[i+1] == "":
			req.Header.Del(headers[i])
		default:
			req.Header.Set(headers[i], headers[i+1])
		}
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("%s %s: reading body: %v", method, url, err)
	}
	return Resp{Status: r.StatusCode, Header: r.Header, Body: b}
}

// WaitCalls polls the store until n rows with the span id are there.
func (e *Env) WaitCalls(spanID string, n int) []export.Call {
	e.T.Helper()
	var rows []export.Call
	testenv.WaitFor(e.T, 15*time.Second, func() string {
		return fmt.Sprintf("span %s: %d rows stored, want %d", spanID, len(rows), n)
	}, func() bool {
		var err error
		if rows, err = e.Store.Calls(context.Background(), export.CallFilter{SpanID: spanID}); err != nil {
			e.T.Fatalf("reading calls: %v", err)
		}
		return len(rows) >= n
	})
	if len(rows) > n {
		e.T.Fatalf("span %s: %d rows stored, want %d", spanID, len(rows), n)
	}
	return rows
}

// SSEData returns the data payloads of an SSE body.
func SSEData(body []byte) []string {
	var out []string
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		for _, line := range bytes.Split(ev, []byte("\n")) {
			if bytes.HasPrefix(line, []byte("data: ")) {
				out = append(out, string(line[6:]))
			}
		}
	}
	return out
}

// Rejected returns rollgate_calls_rejected_total{reason}.
func (e *Env) Rejected(reason string) float64 {
	return testutil.ToFloat64(e.M.CallsRejected.WithLabelValues(reason))
}

// StoredCalls waits until every call captured so far is stored, then
// returns the rows matching f.
func (e *Env) StoredCalls(f export.CallFilter) []export.Call {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := e.Pipe.Sync(ctx); err != nil {
		e.T.Fatalf("syncing capture: %v", err)
	}
	rows, err := e.Store.Calls(ctx, f)
	if err != nil {
		e.T.Fatalf("reading calls: %v", err)
	}
	return rows
}

// WaitFor polls f until it is true or 15 s pass.
func WaitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, func() string { return what }, f)
}

// GrepLines returns the lines of s that contain sub.
func GrepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// ChatBody is a small chat completion request for the mock engine.
const ChatBody = `{"model":"mock-model","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the world"}],"max_tokens":12}`

// WithStream adds the JSON members extra to the request body.
func WithStream(body string, extra string) string {
	return strings.TrimSuffix(body, "}") + "," + extra + "}"
}
