package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestServeExportsOTLP: with --otlp-endpoint, a captured call reaches the
// OTLP/HTTP receiver as an ExportTraceServiceRequest carrying its span id.
func TestServeExportsOTLP(t *testing.T) {
	var got atomic.Value
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		// Keep the request carrying the captured call's GenAI span (the
		// gateway's own spans, sampled at 0.01 by default, go to the same
		// receiver in requests of their own).
		if r.URL.Path == "/v1/traces" && strings.Contains(r.Header.Get("Content-Type"), "protobuf") &&
			strings.Contains(string(b), "gen_ai.operation.name") {
			got.Store(b)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()
	addr := freeAddr(t)
	start(t, addr, "/readyz", "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"),
		"--otlp-endpoint", recv.URL, "--otlp-insecure")
	status, _, h := post(t, "http://"+addr+"/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`)
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	span := h.Get("x-request-id")
	waitUntil(t, "a span at the OTLP receiver", 10*time.Second, func() bool { _, ok := got.Load().([]byte); return ok })
	b := got.Load().([]byte)
	// Span ids travel as raw bytes in protobuf: compare the decoded hex.
	raw := make([]byte, 8)
	for i := range raw {
		var v byte
		for _, c := range span[2*i : 2*i+2] {
			v = v<<4 | byte(strings.IndexRune("0123456789abcdef", c))
		}
		raw[i] = v
	}
	if !strings.Contains(string(b), string(raw)) {
		t.Fatalf("exported spans lack span id %s", span)
	}
}

// TestServeGatewayTracing: --otlp-gateway-sample-ratio 1 sends the gateway's
// own spans (scope github.com/rollgate/rollgate/gateway, a SERVER span with
// its backend attempts) to the --otlp-endpoint receiver; bad ratios and a
// ratio without an endpoint stop the start with exit code 2.
func TestServeGatewayTracing(t *testing.T) {
	var gwSpans atomic.Value
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if strings.Contains(string(b), "github.com/rollgate/rollgate/gateway") {
			gwSpans.Store(b)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()
	addr := freeAddr(t)
	start(t, addr, "/readyz", "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "r.db"),
		"--otlp-endpoint", recv.URL, "--otlp-gateway-sample-ratio", "1")
	if status, _, _ := post(t, "http://"+addr+"/v1/chat/completions", `{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`); status != 200 {
		t.Fatalf("status %d", status)
	}
	// the SDK's batch timeout is 5s
	waitUntil(t, "a gateway span at the OTLP receiver", 15*time.Second, func() bool { _, ok := gwSpans.Load().([]byte); return ok })
	b := gwSpans.Load().([]byte)
	for _, want := range []string{"rollgate.backend_attempts", "rollgate.backend_attempt", "rollgate.request_id", "POST /v1/chat/completions"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("gateway spans lack %q", want)
		}
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--otlp-endpoint", recv.URL, "--otlp-gateway-sample-ratio", "1.5"}, "want a fraction from 0 (off) to 1"},
		{[]string{"--otlp-gateway-sample-ratio", "0.5"}, "needs --otlp-endpoint"},
	} {
		cmd := exec.Command(binary, append([]string{"serve", "--listen", freeAddr(t), "--db", filepath.Join(t.TempDir(), "r.db")}, tc.args...)...)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("serve %v: exit %d, output %q; want 2 and %q", tc.args, cmd.ProcessState.ExitCode(), out, tc.want)
		}
	}
}
