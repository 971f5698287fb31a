//go:build linux

// Streams are parked on Linux's epoll only; elsewhere each waits on its
// goroutine, and these tests have nothing to check.

package gateway_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/gateway"
)

// TestOpenStreamsWaitWithoutGoroutines: streams between two tokens hold no
// goroutine (the parker, on Linux): 32 streams, each past its first token
// and with its next one 4 s away, have no goroutine anywhere in the
// gateway's stream code; then every stream ends whole and is captured.
func TestOpenStreamsWaitWithoutGoroutines(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	const n = 32
	body := withStream(chatBody, `"stream":true`)
	type open struct {
		conn net.Conn
		br   *bufio.Reader
		span string
	}
	streams := make([]open, n)
	for i := range streams {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /rollout/park-%d/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-mock-itl-ms: 4000\r\nx-mock-tokens: 2\r\nContent-Length: %d\r\n\r\n%s", i, len(body), body)
		streams[i] = open{conn: conn, br: bufio.NewReader(conn)}
	}
	for i := range streams {
		st := &streams[i]
		for {
			line, err := st.br.ReadString('\n')
			if err != nil {
				t.Fatalf("stream %d: reading its first event: %v", i, err)
			}
			if strings.HasPrefix(strings.ToLower(line), "x-request-id:") {
				st.span = strings.TrimSpace(line[len("x-request-id:"):])
			}
			if strings.Contains(line, `"content":`) && strings.HasPrefix(strings.TrimSpace(line), "data: ") {
				break // its first token: the next is 4 s away
			}
		}
	}
	var stacks []byte
	waitFor(t, "no goroutine to hold the open streams", func() bool {
		var buf bytes.Buffer
		if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
			t.Fatal(err)
		}
		stacks = buf.Bytes()
		return streamGoroutines(stacks) == 0 && e.mock.ActiveStreams() == n
	})
	if a := e.mock.ActiveStreams(); a != n {
		t.Fatalf("%d streams open at the engine, want %d: the check ran after they ended", a, n)
	}
	for i := range streams {
		// The rest of the chunked body, to its end (the last chunk and
		// the empty trailer): the connection stays open after it.
		var rest []byte
		for !bytes.HasSuffix(rest, []byte("\r\n0\r\n\r\n")) {
			line, err := streams[i].br.ReadBytes('\n')
			rest = append(rest, line...)
			if err != nil {
				t.Fatalf("stream %d: %v after %q", i, err, rest)
			}
		}
		if !bytes.Contains(rest, []byte("data: [DONE]")) || bytes.Contains(rest, []byte(`"error"`)) {
			t.Fatalf("stream %d did not end whole after waiting parked: %q", i, rest)
		}
		if row := e.waitCalls(streams[i].span, 1)[0]; row.Error != "" || row.CompletionTokens != 2 {
			t.Fatalf("stream %d: row error %q, %d completion tokens (want 2)", i, row.Error, row.CompletionTokens)
		}
	}
}

// streamGoroutines counts the goroutines, in a goroutine dump, that are in
// the gateway's code for a stream's answer (written or read).
func streamGoroutines(dump []byte) int {
	n := 0
	for g := range bytes.SplitSeq(dump, []byte("\n\n")) {
		if bytes.Contains(g, []byte("gateway.(*streamBody)")) || bytes.Contains(g, []byte("gateway.(*engineStream)")) {
			n++
		}
	}
	return n
}

// TestClientsThatStopReadingHoldNoOtherStream: parked streams resume on a
// few workers; a worker blocked writing to a client that stopped reading
// does not count among them, so more such clients than there are workers
// do not hold another client's stream back (until their write timeout, a
// minute here).
func TestClientsThatStopReadingHoldNoOtherStream(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) { c.ClientWriteTimeout = time.Minute })
	k := gateway.ParkWorkers() + 2
	for i := range k {
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.(*net.TCPConn).SetReadBuffer(4096)
		fmt.Fprintf(conn, "POST /rollout/stops-reading-%d/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"x-mock-tokens: 100000\r\nContent-Length: %d\r\n\r\n%s", i, len(longStream), longStream)
		// Never read.
	}
	waitFor(t, fmt.Sprintf("%d workers blocked writing to clients that stopped reading", k), func() bool {
		return gateway.ParkWritersBlocked() >= k
	})
	r := do(t, "POST", e.url+"/v1/chat/completions", withStream(chatBody, `"stream":true`), "x-mock-itl-ms", "20", "x-mock-tokens", "20")
	if r.status != 200 || !strings.Contains(string(r.body), "data: [DONE]") || strings.Contains(string(r.body), `"error"`) {
		t.Fatalf("a stream beside %d blocked ones: %d %s", k, r.status, r.body)
	}
	if b := gateway.ParkWritersBlocked(); b < k {
		t.Fatalf("only %d writers still blocked once the other stream ended, want %d: the check proved nothing", b, k)
	}
}
