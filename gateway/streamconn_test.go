package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestShutdownWaitsForStreams: a stream runs on a connection fasthttp has
// handed over (streamconn.go), which fasthttp's own shutdown no longer
// counts. Shutdown still waits for it: the stream started before the drain
// ends whole, its call is stored by the time Shutdown returns, and its
// connection then closes instead of serving another request.
func TestShutdownWaitsForStreams(t *testing.T) {
	first := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a "},"finish_reason":null}]}` + "\n\n"
	rest := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}` + "\n\n" + "data: [DONE]\n\n"
	release := make(chan struct{})
	url := rawBackend(t, func(c net.Conn, _ *http.Request) bool {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(first), first)
		<-release
		_, err := fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(rest), rest)
		return err == nil
	})
	e, _ := streamEndEnv(t, url, mock.Config{}, 0)
	conn := dialGateway(t, e)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	postRaw(conn, "/rollout/drain/attempt/1/v1/chat/completions", "", body)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(first))
	if _, err := io.ReadFull(res.Body, got); err != nil || string(got) != first {
		t.Fatalf("first event: %q, %v", got, err)
	}

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		shut <- e.GW.Shutdown(ctx)
	}()
	// The drain has begun once the gateway takes no connection any more;
	// only then does the engine send the rest of the stream.
	gatewaytest.WaitFor(t, "the gateway's listener closed by Shutdown", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned (%v) while a stream was open", err)
	default:
	}
	close(release)
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// Shutdown has returned: the call is in capture's hands.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := e.Pipe.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := e.Store.Calls(ctx, export.CallFilter{SpanID: res.Header.Get("x-request-id")})
	if err != nil || len(rows) != 1 || rows[0].Error != "" || rows[0].FinishReason != "stop" || !strings.Contains(rows[0].ResponseMessage, `"content":"a b"`) {
		t.Fatalf("after Shutdown: %d rows (%v): %+v", len(rows), err, rows)
	}
	tail, err := io.ReadAll(res.Body)
	if err != nil || string(tail) != rest {
		t.Fatalf("the rest of the stream: %q, %v", tail, err)
	}
	if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the stream, the connection of a draining gateway read %d bytes, %v; want it closed", n, err)
	}
}

// TestIdleTimeoutAfterStream: a connection handed back to fasthttp after a
// stream keeps the client idle timeout (fasthttp cleared its deadlines when
// it handed it over, and serves it anew without one): idle after its
// stream, it is closed once --client-idle-timeout has passed.
func TestIdleTimeoutAfterStream(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	store, err := sqlite.Open(t.TempDir() + "/idle.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	gatewaytest.NewEnvOn(t, ln, store, mock.Config{}, func(c *gateway.Config) {
		c.ClientIdleTimeout = 300 * time.Millisecond
	})
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	postRaw(conn, "/v1/chat/completions", "", body)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(res.Body); err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("stream: %v %q", err, b)
	}
	start := time.Now()
	conn.SetReadDeadline(start.Add(10 * time.Second)) // a bound, not the condition: the gateway must close first
	n, err := br.Read(make([]byte, 1))
	if n != 0 || err != io.EOF {
		t.Fatalf("idle after a stream: read %d bytes, %v after %s; want the gateway to close the connection after 300ms", n, err, time.Since(start))
	}
}

// TestStreamConnectionClose: a client that asks for its connection to be
// closed ("Connection: close") gets its stream whole, told so in the
// response's headers, and then the connection closes; a keep-alive client's
// connection serves its next request after its stream.
func TestStreamConnectionClose(t *testing.T) {
	e, _ := streamEndEnv(t, "", mock.Config{}, 0)
	body := `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	for _, close := range []bool{false, true} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		for i := range 2 {
			hdr := ""
			if close {
				hdr = "Connection: close\r\n"
			}
			postRaw(conn, "/v1/chat/completions", hdr, body)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				if close && i == 1 {
					break // closed after the first answer, as asked
				}
				t.Fatalf("close %v, request %d: %v", close, i, err)
			}
			b, err := io.ReadAll(res.Body)
			if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
				t.Fatalf("close %v, request %d: %v %q", close, i, err, b)
			}
			if res.Close != close {
				t.Fatalf("close %v, request %d: the response says close %v (Connection: %q)", close, i, res.Close, res.Header.Get("Connection"))
			}
			if close {
				conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a bound: the gateway must close first
				if n, err := br.Read(make([]byte, 1)); n != 0 || err != io.EOF {
					t.Fatalf("after a stream asked to close its connection: read %d bytes, %v", n, err)
				}
				break
			}
		}
		conn.Close()
	}
}
