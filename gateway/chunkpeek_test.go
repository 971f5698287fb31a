package gateway_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
)

// burstBackend answers every request with a chat stream of n events, each
// in its own HTTP chunk, the whole response written with one write: the
// events reach the gateway together, as a burst from an engine does.
func burstBackend(t *testing.T, n int) string {
	t.Helper()
	var resp strings.Builder
	resp.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := func(s string) { fmt.Fprintf(&resp, "%x\r\n%s\r\n", len(s), s) }
	for i := range n {
		chunk(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t` + strconv.Itoa(i) + ` "},"finish_reason":null}]}` + "\n\n")
	}
	chunk(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\n\n")
	chunk("data: [DONE]\n\n")
	resp.WriteString("0\r\n\r\n")
	raw := []byte(resp.String())
	return rawBackend(t, func(c net.Conn, _ *http.Request) bool {
		_, err := c.Write(raw)
		return err == nil
	})
}

// TestBurstForwardedInOneWrite: 22 events that reach the gateway in one
// read leave it in one chunk (one write), not 22; the client gets every
// byte, and the call is captured whole.
func TestBurstForwardedInOneWrite(t *testing.T) {
	const n = 20
	url := burstBackend(t, n)
	store, err := sqlite.Open(t.TempDir() + "/burst.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := newEnv(t, store, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "burst", URL: url, Kind: "openai"}}}}
	})
	for round := range 3 { // a fresh connection, then reused ones
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode != 200 || len(res.TransferEncoding) == 0 {
			t.Fatalf("status %d, transfer encoding %v", res.StatusCode, res.TransferEncoding)
		}
		// Read the chunked framing by hand to count the chunks.
		var chunks int
		var got strings.Builder
		got.WriteString(readChunks(t, br, func(string, int) { chunks++ }))
		conn.Close()
		events := strings.Count(got.String(), "data: ")
		if events != n+2 || !strings.Contains(got.String(), "t19 ") || !strings.HasSuffix(got.String(), "data: [DONE]\n\n") {
			t.Fatalf("round %d: client got %d events:\n%s", round, events, got.String())
		}
		if chunks > 2 {
			t.Fatalf("round %d: %d events that arrived together were written as %d chunks, want 1 (2 at most)", round, events, chunks)
		}
		rows := e.waitCalls(res.Header.Get("x-request-id"), 1)
		if !strings.Contains(rows[0].ResponseMessage, "t0 t1 ") || rows[0].FinishReason != "stop" || rows[0].Error != "" {
			t.Fatalf("round %d: captured %q finish %q error %q", round, rows[0].ResponseMessage, rows[0].FinishReason, rows[0].Error)
		}
	}
}
