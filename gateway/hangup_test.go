package gateway_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// storyBody is a non-streamed chat call as long as its x-mock-* headers say.
const storyBody = `{"model":"mock-model","messages":[{"role":"user","content":"Tell me a long story"}]}`

// rawCall is a non-streamed chat request on the wire, for rollout rollout,
// with extra header lines (each ending in \r\n).
func rawCall(rollout, extra string) string {
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
		"x-rollout-id: %s\r\nx-attempt-id: 1\r\n%sContent-Length: %d\r\n\r\n%s", rollout, extra, len(storyBody), storyBody)
}

// rolloutRows polls the store until the rollout has n rows.
func rolloutRows(t *testing.T, e *env, rollout string, n int) []export.Call {
	t.Helper()
	var rows []export.Call
	waitFor(t, fmt.Sprintf("%d rows of rollout %s", n, rollout), func() bool {
		var err error
		rows, err = e.store.Calls(context.Background(), export.CallFilter{RolloutID: rollout})
		if err != nil {
			t.Fatalf("reading calls: %v", err)
		}
		return len(rows) >= n
	})
	if len(rows) != n {
		t.Fatalf("rollout %s: %d rows, want %d", rollout, len(rows), n)
	}
	return rows
}

// TestNonStreamedHangUpCancelsBackend: a client that hangs up while its
// non-streamed call is generating (a minute of it) gets its backend request
// aborted (the mock sees the gateway's connection close, as vLLM would) and
// its call captured as 499 "client disconnected before the response"; over
// plain TCP and over TLS (a client that dies without close_notify).
func TestNonStreamedHangUpCancelsBackend(t *testing.T) {
	store, _ := openSQLite(t)
	certFile, keyFile, pool := selfSigned(t)
	plain := newEnv(t, store, func(c *gateway.Config) { c.UpstreamTimeout = 10 * time.Minute })
	secure := newEnv(t, store, func(c *gateway.Config) {
		c.UpstreamTimeout = 10 * time.Minute
		c.TLSCertFile, c.TLSKeyFile = certFile, keyFile
	})
	// One minute of generation: far beyond the wait for the abort.
	const slow = "x-mock-ttft-ms: 60000\r\n"

	check := func(t *testing.T, e *env, rollout string) {
		t.Helper()
		waitFor(t, "the backend to abort the request", func() bool { return e.mock.Aborted() == 1 })
		r := rolloutRows(t, e, rollout, 1)[0]
		if r.HTTPStatus != 499 || r.Error != "client disconnected before the response" {
			t.Fatalf("row of the call whose client hung up: status %d, error %q", r.HTTPStatus, r.Error)
		}
		if r.Stream || r.Backend != "mock-1" {
			t.Fatalf("row: stream %v, backend %q", r.Stream, r.Backend)
		}
	}

	t.Run("tcp", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(plain.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, rawCall("hangup-tcp", slow)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the call to reach the backend", func() bool { return plain.mock.Generating() == 1 })
		conn.Close()
		check(t, plain, "hangup-tcp")
		// The gateway goes on serving.
		if res := do(t, "POST", plain.url+"/v1/chat/completions", chatBody); res.status != 200 {
			t.Fatalf("call after the hang-up: %d %s", res.status, res.body)
		}
	})

	t.Run("tls", func(t *testing.T) {
		raw, err := net.Dial("tcp", strings.TrimPrefix(secure.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		conn := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if _, err := io.WriteString(conn, rawCall("hangup-tls", slow)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the call to reach the backend", func() bool { return secure.mock.Generating() == 1 })
		raw.Close() // the client dies: FIN without close_notify
		check(t, secure, "hangup-tls")
	})
}

// TestNonStreamedCallsUnaffectedByHangUpWatch: while the gateway watches the
// client connection of a non-streamed call, normal calls, a second request
// on the same keep-alive connection, pipelined requests (sent together, or
// the second while the first is at the backend) and a client that sends its
// request slowly are answered as before and captured as 200; after a watched
// call the server's idle timeout still closes the idle connection.
func TestNonStreamedCallsUnaffectedByHangUpWatch(t *testing.T) {
	store, _ := openSQLite(t)
	e := newEnv(t, store, func(c *gateway.Config) { c.ClientIdleTimeout = time.Second })
	addr := strings.TrimPrefix(e.url, "http://")
	// A short generation, so the watcher really waits: 10 tokens 20 ms apart.
	const short = "x-mock-tokens: 10\r\nx-mock-itl-ms: 20\r\n"

	dial := func(t *testing.T) (net.Conn, *bufio.Reader) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		// A guard against a hung test, not a timed assertion.
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		return conn, bufio.NewReader(conn)
	}
	send := func(t *testing.T, conn net.Conn, s string) {
		t.Helper()
		if _, err := io.WriteString(conn, s); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(t *testing.T, br *bufio.Reader, what string) {
		t.Helper()
		status, body := readRaw(t, br, what)
		if status != 200 || !strings.Contains(string(body), `"finish_reason":"stop"`) {
			t.Fatalf("%s: %d %s", what, status, body)
		}
	}
	clean := func(t *testing.T, rollout string, n int) {
		t.Helper()
		for i, r := range rolloutRows(t, e, rollout, n) {
			if r.HTTPStatus != 200 || r.Error != "" {
				t.Fatalf("row %d of %s: status %d, error %q", i, rollout, r.HTTPStatus, r.Error)
			}
		}
	}

	t.Run("normal", func(t *testing.T) {
		res := do(t, "POST", e.url+"/v1/chat/completions", storyBody,
			"x-rollout-id", "normal", "x-attempt-id", "1", "x-mock-tokens", "10", "x-mock-itl-ms", "20")
		if res.status != 200 || !strings.Contains(string(res.body), `"choices"`) {
			t.Fatalf("%d %s", res.status, res.body)
		}
		clean(t, "normal", 1)
	})

	t.Run("keep-alive", func(t *testing.T) {
		conn, br := dial(t)
		send(t, conn, rawCall("keepalive", short))
		answer(t, br, "first request")
		send(t, conn, rawCall("keepalive", short))
		answer(t, br, "second request on the same connection")
		clean(t, "keepalive", 2)
		// Left idle, the connection is closed by the server's idle timeout:
		// the watcher left no read deadline behind that fasthttp would not
		// reset. (If it did, the read would block until the guard deadline.)
		if n, err := br.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("idle keep-alive connection: read %d bytes, %v; want EOF from the idle timeout", n, err)
		}
	})

	t.Run("pipelined together", func(t *testing.T) {
		conn, br := dial(t)
		send(t, conn, rawCall("pipelined", short)+rawCall("pipelined", short))
		answer(t, br, "first pipelined request")
		answer(t, br, "second pipelined request")
		clean(t, "pipelined", 2)
	})

	t.Run("pipelined during the call", func(t *testing.T) {
		conn, br := dial(t)
		// 50 tokens 20 ms apart: the second request arrives while the first
		// is at the backend, which stops the watch (undecidable, no hang-up).
		send(t, conn, rawCall("pipelined-late", "x-mock-tokens: 50\r\nx-mock-itl-ms: 20\r\n"))
		waitFor(t, "the first call to reach the backend", func() bool { return e.mock.Generating() == 1 })
		send(t, conn, rawCall("pipelined-late", short))
		answer(t, br, "first request")
		answer(t, br, "request sent during the first")
		clean(t, "pipelined-late", 2)
	})

	t.Run("slow client", func(t *testing.T) {
		conn, br := dial(t)
		req := rawCall("slow", short)
		for i := 0; i < len(req); i += 16 { // 16 bytes every 10 ms: the client's pace
			send(t, conn, req[i:min(i+16, len(req))])
			time.Sleep(10 * time.Millisecond) // pacing the deliberately slow client, not a wait
		}
		answer(t, br, "slowly sent request")
		clean(t, "slow", 1)
	})

	if a := e.mock.Aborted(); a != 0 {
		t.Fatalf("the backend aborted %d requests of clients that stayed", a)
	}
}
