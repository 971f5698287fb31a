package gateway_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
)

// TestClientDisconnectMidStream hangs up during a slow stream: the backend
// request is cancelled and the row says the client disconnected.
func TestClientDisconnectMidStream(t *testing.T) {
	storeKinds(t, func(t *testing.T, open func(t *testing.T) export.Store) {
		e := newEnv(t, open(t), nil)
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		body := withStream(chatBody, `"stream":true`)
		fmt.Fprintf(conn, "POST /rollout/dc/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-mock-itl-ms: 100\r\nx-mock-tokens: 200\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		br := bufio.NewReader(conn)
		var span string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("reading response: %v", err)
			}
			if strings.HasPrefix(strings.ToLower(line), "x-request-id:") {
				span = strings.TrimSpace(line[len("x-request-id:"):])
			}
			if strings.Contains(line, "data: ") {
				break // first event arrived: hang up
			}
		}
		conn.Close()
		row := e.waitCalls(span, 1)[0]
		if !strings.Contains(row.Error, "client disconnected") {
			t.Fatalf("row error %q, want client disconnected", row.Error)
		}
		if row.CompletionTokens >= 200 {
			t.Fatalf("backend was not cancelled: %d tokens", row.CompletionTokens)
		}
		// The engine saw the cancellation: its open streams drain to zero.
		deadline := time.Now().Add(5 * time.Second)
		for e.mock.ActiveStreams() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("mock still streaming %d responses after the client left", e.mock.ActiveStreams())
			}
			time.Sleep(20 * time.Millisecond) // polling interval of this wait on ActiveStreams
		}
	})
}
