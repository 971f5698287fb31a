package main

import (
	"io"
	"net/http"
	"net/http/httptest"
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
		if r.URL.Path == "/v1/traces" && strings.Contains(r.Header.Get("Content-Type"), "protobuf") {
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, ok := got.Load().([]byte); ok && strings.Contains(string(b), "gen_ai.operation.name") {
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
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no span reached the OTLP receiver")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
