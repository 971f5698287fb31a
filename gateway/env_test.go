package gateway_test

import (
	"net/http"
	"testing"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/metrics"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// The harness lives in testkit/gatewaytest (the control plane's tests
// share it); these are the short names the gateway's tests use.

func TestMain(m *testing.M) { gatewaytest.Main(m) }

func storeKinds(t *testing.T, f func(t *testing.T, open func(t *testing.T) export.Store)) {
	gatewaytest.StoreKinds(t, f)
}

func openSQLite(t *testing.T) (export.Store, string) {
	t.Helper()
	return gatewaytest.OpenSQLite(t)
}

// env is a running mock engine, gateway (with its control plane) and store
// on loopback.
type env struct {
	*gatewaytest.Env
	t       *testing.T
	mock    *mock.Server
	mockURL string // http://127.0.0.1:P/v1
	store   export.Store
	m       *metrics.Metrics
	pipe    *capture.Pipeline
	gw      *gateway.Server
	url     string // http://127.0.0.1:P
}

func wrap(e *gatewaytest.Env) *env {
	return &env{Env: e, t: e.T, mock: e.Mock, mockURL: e.MockURL, store: e.Store, m: e.M, pipe: e.Pipe, gw: e.GW, url: e.URL}
}

// newEnv starts a mock (kind vllm, model "*") and a gateway in front of it.
// mutate may change the gateway config before start.
func newEnv(t *testing.T, store export.Store, mutate func(*gateway.Config)) *env {
	t.Helper()
	return wrap(gatewaytest.NewEnv(t, store, mutate))
}

// newEnvWith is newEnv with the mock engine configured by mc.
func newEnvWith(t *testing.T, store export.Store, mc mock.Config, mutate func(*gateway.Config)) *env {
	t.Helper()
	return wrap(gatewaytest.NewEnvWith(t, store, mc, mutate))
}

// resp is a finished HTTP exchange.
type resp struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request to url with optional headers (pairs of name, value).
func do(t *testing.T, method, url, body string, headers ...string) resp {
	t.Helper()
	r := gatewaytest.Do(t, method, url, body, headers...)
	return resp{status: r.Status, header: r.Header, body: r.Body}
}

func (e *env) waitCalls(spanID string, n int) []export.Call {
	e.t.Helper()
	return e.WaitCalls(spanID, n)
}

func sseData(body []byte) []string { return gatewaytest.SSEData(body) }

func (e *env) rejected(reason string) float64 { return e.Rejected(reason) }

func (e *env) storedCalls(f export.CallFilter) []export.Call {
	e.t.Helper()
	return e.StoredCalls(f)
}

func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	gatewaytest.WaitFor(t, what, f)
}

func grepLines(s, sub string) string { return gatewaytest.GrepLines(s, sub) }
