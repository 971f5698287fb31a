package load

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// TestIdleConns: OpenIdle holds keep-alive connections the server keeps
// open, StillOpen counts the ones the server closed, and a server that
// answers other than 200 or closes after the call is an error.
func TestIdleConns(t *testing.T) {
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			w.Write([]byte(`{"data":[]}`))
		case "/close":
			w.Header().Set("Connection", "close")
			w.Write([]byte(`{}`))
		default:
			http.NotFound(w, r)
		}
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	ctx := context.Background()

	ic, err := OpenIdle(ctx, srv.URL, "/v1/models", 20)
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close()
	if ic.Len() != 20 || ic.StillOpen() != 20 {
		t.Fatalf("held %d, open %d; want 20 and 20", ic.Len(), ic.StillOpen())
	}
	mu.Lock()
	for _, c := range conns[:5] {
		c.Close()
	}
	mu.Unlock()
	var open int
	testenv.WaitFor(t, 10*time.Second, func() string { return fmt.Sprintf("%d of 20 open, want 15 after closing five", open) },
		func() bool { open = ic.StillOpen(); return open == 15 })

	if _, err := OpenIdle(ctx, srv.URL, "/nope", 3); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("a 404: err = %v, want one naming 404", err)
	}
	if _, err := OpenIdle(ctx, srv.URL, "/close", 3); err == nil || !strings.Contains(err.Error(), "keep-alive") {
		t.Errorf("Connection: close: err = %v, want one naming keep-alive", err)
	}
	if _, err := OpenIdle(ctx, "https://127.0.0.1:1", "/v1/models", 1); err == nil {
		t.Error("https: no error")
	}
}

// TestRSS: the resident set of this process is read and sampled.
func TestRSS(t *testing.T) {
	v, err := RSS([]int{os.Getpid()})
	if err != nil || v <= 1 {
		t.Fatalf("RSS = %v MiB, %v", v, err)
	}
	s := SampleRSS([]int{os.Getpid()}, 10*time.Millisecond)
	peak, err := s.Stop()
	if err != nil || peak <= 1 {
		t.Fatalf("sampled peak = %v MiB, %v", peak, err)
	}
	if _, err := RSS([]int{1 << 30}); err == nil {
		t.Error("RSS of a missing process: no error")
	}
}
