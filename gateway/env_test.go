package gateway_test

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
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/internal/testenv"
)

// clickhouseDSN is the real ClickHouse server started for this test binary.
var clickhouseDSN string

func TestMain(m *testing.M) {
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

var dbSeq atomic.Int64

// storeKinds runs f once with the embedded store and once with ClickHouse.
func storeKinds(t *testing.T, f func(t *testing.T, open func(t *testing.T) export.Store)) {
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

// env is a running mock engine, gateway and store on loopback.
type env struct {
	t       *testing.T
	mock    *mock.Server
	mockURL string // http://127.0.0.1:P/v1
	store   export.Store
	m       *metrics.Metrics
	pipe    *capture.Pipeline
	gw      *gateway.Server
	url     string // http://127.0.0.1:P
}

// newEnv starts a mock (kind vllm, model "*") and a gateway in front of it.
// mutate may change the gateway config before start.
func newEnv(t *testing.T, store export.Store, mutate func(*gateway.Config)) *env {
	t.Helper()
	return newEnvWith(t, store, mock.Config{}, mutate)
}

// newEnvWith is newEnv with the mock engine configured by mc (for example
// another flavour: SGLang, llama.cpp).
func newEnvWith(t *testing.T, store export.Store, mc mock.Config, mutate func(*gateway.Config)) *env {
	t.Helper()
	ms, base, err := mock.Start(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Shutdown() })
	e := &env{t: t, mock: ms, mockURL: base, store: store, m: metrics.New()}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{
		Listen:          ln.Addr().String(),
		UpstreamTimeout: 20 * time.Second,
		Backends: []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{
			{Name: "mock-1", URL: base, Kind: "vllm", PolicyVersion: "v7"},
		}}},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	e.pipe = capture.NewPipeline(capture.Config{FlushInterval: 10 * time.Millisecond, BatchSize: 64},
		[]capture.NamedSink{{Name: store.Name(), Sink: store}}, e.m, nil)
	gw, err := gateway.New(cfg, store, e.pipe, e.m, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.gw = gw
	e.pipe.SetFallback(gw.FallbackFor)
	go gw.Serve(ln)
	e.url = "http://" + ln.Addr().String()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gw.Shutdown(ctx)
		e.pipe.Close(ctx)
	})
	return e
}

// resp is a finished HTTP exchange.
type resp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request to base+path with optional headers (pairs of name, value).
func do(t *testing.T, method, url, body string, headers ...string) resp {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
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
	return resp{status: r.StatusCode, header: r.Header, body: b}
}

// waitCalls polls the store until n rows with the span id are there.
func (e *env) waitCalls(spanID string, n int) []export.Call {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		rows, err := e.store.Calls(context.Background(), export.CallFilter{SpanID: spanID})
		if err != nil {
			e.t.Fatalf("reading calls: %v", err)
		}
		if len(rows) >= n {
			if len(rows) > n {
				e.t.Fatalf("span %s: %d rows stored, want %d", spanID, len(rows), n)
			}
			return rows
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("span %s: %d rows stored after 15s, want %d", spanID, len(rows), n)
		}
		time.Sleep(20 * time.Millisecond) // polling interval of this wait on the stored rows
	}
}

// sseData returns the data payloads of an SSE body.
func sseData(body []byte) []string {
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

// rejected returns rollgate_calls_rejected_total{reason}.
func (e *env) rejected(reason string) float64 {
	return testutil.ToFloat64(e.m.CallsRejected.WithLabelValues(reason))
}

// storedCalls waits until every call captured so far is stored, then
// returns the rows matching f.
func (e *env) storedCalls(f export.CallFilter) []export.Call {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := e.pipe.Sync(ctx); err != nil {
		e.t.Fatalf("syncing capture: %v", err)
	}
	rows, err := e.store.Calls(ctx, f)
	if err != nil {
		e.t.Fatalf("reading calls: %v", err)
	}
	return rows
}
