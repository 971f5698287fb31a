//go:build linux

// Streams are parked on Linux's epoll only; elsewhere each waits on its
// goroutine, and these tests have nothing to check.

package gateway_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/gateway"
)

// TestOpenStreamsWaitWithoutGoroutines: streams between two tokens hold no
// goroutine (the parker, on Linux): 32 streams, each past its first token
// and with its next one 4 s away, have no goroutine anywhere in the
// gateway's stream code; then every stream ends whole and is captured.
func TestOpenStreamsWaitWithoutGoroutines(t *testing.T) {
	defer gateway.ParkAbove(0)()
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	const n = 32
	streams := make([]*slowStream, n)
	for i := range streams {
		streams[i] = startSlowStream(t, e, fmt.Sprintf("park-%d", i))
	}
	for _, st := range streams {
		st.firstToken(t)
	}
	waitStreamGoroutines(t, e, 0, n)
	for _, st := range streams {
		st.endsWhole(t, e)
	}
}

// TestFewStreamsWaitOnGoroutines: a stream parks only when more streams are
// open than parkAbove (8 here); up to that many wait on goroutines of their
// own, as the runtime's poller wakes them without the parker's two
// hand-offs. Twelve streams opened one after another, each past its first
// token with its next one 4 s away: the first eight hold a goroutine each,
// the other four none; then every stream ends whole and is captured.
func TestFewStreamsWaitOnGoroutines(t *testing.T) {
	const above, n = 8, 12
	defer gateway.ParkAbove(above)()
	s, _ := openSQLite(t)
	e := newEnv(t, s, nil)
	streams := make([]*slowStream, n)
	for i := range streams {
		streams[i] = startSlowStream(t, e, fmt.Sprintf("few-%d", i))
		streams[i].firstToken(t)
		// Each stream has made its choice before the next one opens.
		waitStreamGoroutines(t, e, min(i+1, above), i+1)
	}
	for _, st := range streams {
		st.endsWhole(t, e)
	}
}

// slowStream is a streamed call sent on a connection of its own, two tokens
// 4 s apart, read by hand.
type slowStream struct {
	conn net.Conn
	br   *bufio.Reader
	span string
}

// startSlowStream sends a streamed call of rollout id whose second token
// comes 4 s after its first.
func startSlowStream(t *testing.T, e *env, id string) *slowStream {
	t.Helper()
	body := withStream(chatBody, `"stream":true`)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /rollout/%s/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-mock-itl-ms: 4000\r\nx-mock-tokens: 2\r\nContent-Length: %d\r\n\r\n%s", id, len(body), body)
	return &slowStream{conn: conn, br: bufio.NewReader(conn)}
}

// firstToken reads the stream's head and its events up to its first token
// (the next one is 4 s away).
func (st *slowStream) firstToken(t *testing.T) {
	t.Helper()
	for {
		line, err := st.br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading a stream's first event: %v", err)
		}
		if strings.HasPrefix(strings.ToLower(line), "x-request-id:") {
			st.span = strings.TrimSpace(line[len("x-request-id:"):])
		}
		if strings.Contains(line, `"content":`) && strings.HasPrefix(strings.TrimSpace(line), "data: ") {
			return
		}
	}
}

// endsWhole reads the rest of the chunked body, to its end (the last chunk
// and the empty trailer: the connection stays open after it), and checks
// that the stream ended whole and its call was captured.
func (st *slowStream) endsWhole(t *testing.T, e *env) {
	t.Helper()
	var rest []byte
	for !bytes.HasSuffix(rest, []byte("\r\n0\r\n\r\n")) {
		line, err := st.br.ReadBytes('\n')
		rest = append(rest, line...)
		if err != nil {
			t.Fatalf("stream %s: %v after %q", st.span, err, rest)
		}
	}
	if !bytes.Contains(rest, []byte("data: [DONE]")) || bytes.Contains(rest, []byte(`"error"`)) {
		t.Fatalf("stream %s did not end whole after waiting: %q", st.span, rest)
	}
	if row := e.waitCalls(st.span, 1)[0]; row.Error != "" || row.CompletionTokens != 2 {
		t.Fatalf("stream %s: row error %q, %d completion tokens (want 2)", st.span, row.Error, row.CompletionTokens)
	}
}

// waitStreamGoroutines waits until exactly want goroutines are in the
// gateway's stream code while open streams are open at the engine (all of
// them between their two tokens).
func waitStreamGoroutines(t *testing.T, e *env, want, open int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d goroutines to hold %d open streams", want, open), func() bool {
		var buf bytes.Buffer
		if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
			t.Fatal(err)
		}
		return streamGoroutines(buf.Bytes()) == want && e.mock.ActiveStreams() == int64(open)
	})
	if a := e.mock.ActiveStreams(); a != int64(open) {
		t.Fatalf("%d streams open at the engine, want %d: the check ran after some ended", a, open)
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
	defer gateway.ParkAbove(0)()
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

// TestParkedStreamCutByEngine: a parked stream whose engine closes or
// resets the connection between two tokens is resumed by its socket's
// event and reads the end straight away (it does not look at the socket
// first, streamBody.resume): the client gets an error event and no [DONE],
// its response still ends, and the call is stored as an error row.
func TestParkedStreamCutByEngine(t *testing.T) {
	defer gateway.ParkAbove(0)()
	const first = `{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"w0"},"finish_reason":null}]}`
	for _, how := range []string{"close", "reset"} {
		t.Run(how, func(t *testing.T) {
			cut := make(chan struct{})
			url := rawBackend(t, func(c net.Conn, _ *http.Request) bool {
				ev := "data: " + first + "\n\n"
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
				<-cut
				if how == "reset" {
					_ = c.(*net.TCPConn).SetLinger(0) // the close sends RST
				}
				return false // rawBackend closes c
			})
			e, _ := streamEndEnv(t, url, mock.Config{}, 0)
			conn := dialGateway(t, e)
			body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			fmt.Fprintf(conn, "POST /rollout/cut-%s/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", how, len(body), body)
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second)) // bound, not pacing
			st := &slowStream{conn: conn, br: bufio.NewReader(conn)}
			st.firstToken(t)
			waitFor(t, "the stream to wait parked, without a goroutine", func() bool {
				var buf bytes.Buffer
				if err := pprof.Lookup("goroutine").WriteTo(&buf, 2); err != nil {
					t.Fatal(err)
				}
				return streamGoroutines(buf.Bytes()) == 0
			})
			close(cut)
			// The response ends with its last chunk, or the connection with
			// it.
			var rest []byte
			for !bytes.HasSuffix(rest, []byte("\r\n0\r\n\r\n")) {
				line, err := st.br.ReadBytes('\n')
				rest = append(rest, line...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%s: reading the rest: %v after %q", how, err, rest)
				}
			}
			if !bytes.Contains(rest, []byte(`"error"`)) || bytes.Contains(rest, []byte("data: [DONE]")) {
				t.Fatalf("%s: the client's rest of the stream %q: want an error event and no [DONE]", how, rest)
			}
			if row := e.WaitCalls(st.span, 1)[0]; row.Error == "" || !strings.Contains(row.ResponseMessage, "w0") {
				t.Fatalf("%s: row error %q, message %q: want an error row holding the first token", how, row.Error, row.ResponseMessage)
			}
		})
	}
}
