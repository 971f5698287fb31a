package gateway_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// TestStreamWrittenAfterClientLeftIsNotAnswered: a client gives up while
// the engine is silent after its response headers; then every token comes
// at once. The stream's only write (its last chunk with the body's end, see
// writeChunk) would be accepted by the socket, the peer's close
// notwithstanding: the gateway looks first, and the row says the client
// disconnected instead of counting the call as answered.
func TestStreamWrittenAfterClientLeftIsNotAnswered(t *testing.T) {
	got, send := make(chan struct{}), make(chan struct{})
	var body strings.Builder
	for _, ev := range []string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"late "},"finish_reason":null}]}`,
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
		"[DONE]",
	} {
		s := "data: " + ev + "\n\n"
		fmt.Fprintf(&body, "%x\r\n%s\r\n", len(s), s)
	}
	body.WriteString("0\r\n\r\n")
	url := rawBackend(t, func(c net.Conn, _ *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		close(got)
		<-send
		io.WriteString(c, body.String())
		return true
	})
	// A plain listener: the peek needs the socket itself (a recording
	// wrapper would hide it).
	store, _ := openSQLite(t)
	e := gatewaytest.NewEnv(t, store, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "b", URL: url, Kind: "openai"}}}}
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	req := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /rollout/left/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(req), req)
	<-got // the engine has the call and sent its headers: the gateway waits for tokens
	client := conn.LocalAddr().(*net.TCPAddr).Port
	conn.Close()
	_, gwPort, _ := net.SplitHostPort(strings.TrimPrefix(e.URL, "http://"))
	gatewaytest.WaitFor(t, "the gateway's side of the client connection in CLOSE_WAIT", func() bool {
		return tcpState(t, gwPort, client) == "08"
	})
	close(send)
	var rows []export.Call
	gatewaytest.WaitFor(t, "the call's row", func() bool {
		rows = e.StoredCalls(export.CallFilter{RolloutID: "left"})
		return len(rows) == 1
	})
	if rows[0].Answered() || !strings.Contains(rows[0].Error, "client disconnected") {
		t.Fatalf("a stream whose client had left: status %d, error %q (want client disconnected, not answered)", rows[0].HTTPStatus, rows[0].Error)
	}
}

// tcpState returns the state (hex, as in /proc/net/tcp: 08 is CLOSE_WAIT)
// of the loopback socket with local port local and remote port remote, or
// "" when there is none.
func tcpState(t *testing.T, local string, remote int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	var lp int
	fmt.Sscanf(local, "%d", &lp)
	want := fmt.Sprintf("0100007F:%04X 0100007F:%04X ", lp, remote)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 3 && strings.Contains(line, want) {
			return f[3]
		}
	}
	return ""
}
