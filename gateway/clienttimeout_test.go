package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// TestSlowClientsAreBounded: with one-second client timeouts, a slowloris
// client that sends its headers a byte at a time is disconnected while other
// clients are served; a client that stops reading a long stream is
// disconnected, its backend call cancelled and its row captured with the
// error; a healthy stream lasting longer than the write timeout completes.
func TestSlowClientsAreBounded(t *testing.T) {
	store, _ := openSQLite(t)
	e := newEnv(t, store, func(c *gateway.Config) {
		c.ClientReadTimeout = time.Second
		c.ClientWriteTimeout = time.Second
	})
	addr := strings.TrimPrefix(e.url, "http://")

	t.Run("slowloris", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		closed := make(chan error, 1)
		go func() {
			head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Padding: " + strings.Repeat("a", 200)
			for i := 0; i < len(head); i++ {
				if _, err := conn.Write([]byte{head[i]}); err != nil {
					closed <- err
					return
				}
				time.Sleep(100 * time.Millisecond) // the slowloris client's pace, not a wait
			}
			closed <- nil
		}()
		// Meanwhile a normal client is served.
		if r := do(t, "POST", e.url+"/v1/chat/completions", chatBody); r.status != 200 {
			t.Fatalf("normal client during slowloris: %d %s", r.status, r.body)
		}
		_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
		b, err := io.ReadAll(conn) // returns when the gateway closes the connection
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("slowloris connection still open after 15 s (read %q)", b)
		}
		if strings.Contains(string(b), " 200 ") {
			t.Fatalf("slowloris request was answered: %q", b)
		}
	})

	t.Run("client stops reading", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.(*net.TCPConn).SetReadBuffer(4096)
		body := longStream
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"x-rollout-id: stalled\r\nx-attempt-id: 1\r\nx-mock-tokens: 100000\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// Never read. The gateway must give up, cancel the backend and capture the call.
		deadline := time.Now().Add(30 * time.Second)
		for {
			rows, err := e.store.Calls(context.Background(), export.CallFilter{RolloutID: "stalled"})
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) == 1 {
				if rows[0].Error != "client disconnected mid-stream" {
					t.Fatalf("row of the stalled client: error %q", rows[0].Error)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no row for the stalled client after 30 s (%d rows)", len(rows))
			}
			time.Sleep(50 * time.Millisecond) // polling interval of this wait on the stored row
		}
		for e.mock.ActiveStreams() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("the backend still streams %d responses for a client that left", e.mock.ActiveStreams())
			}
			time.Sleep(20 * time.Millisecond) // polling interval of this wait on ActiveStreams
		}
	})

	t.Run("healthy long stream", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		body := longStream
		// 40 tokens 75 ms apart: 3 s, three times the write timeout.
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"Connection: close\r\nx-mock-tokens: 40\r\nx-mock-itl-ms: 75\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		b, err := io.ReadAll(bufio.NewReader(conn))
		if !strings.Contains(string(b), "data: [DONE]") {
			t.Fatalf("stream did not complete (%v): ...%q", err, tail(string(b), 300))
		}
	})
}

// longStream asks for a stream as long as the x-mock-tokens header says.
const longStream = `{"model":"mock-model","messages":[{"role":"user","content":"Tell me a long story"}],"stream":true}`

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
