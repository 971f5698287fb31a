package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/testkit/gatewaytest"
)

// recordingListener records every write the gateway makes to each client
// connection (what reaches the socket, one entry per write).
type recordingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*recordingConn
	wrote chan struct{} // a send after each write to a client (dropped when one is pending)
}

type recordingConn struct {
	net.Conn
	wrote  chan struct{}
	mu     sync.Mutex
	writes [][]byte
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	rc := &recordingConn{Conn: c, wrote: l.wrote}
	l.mu.Lock()
	l.conns = append(l.conns, rc)
	l.mu.Unlock()
	return rc, nil
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes = append(c.writes, bytes.Clone(p))
	c.mu.Unlock()
	select {
	case c.wrote <- struct{}{}:
	default:
	}
	return c.Conn.Write(p)
}

// taken returns the writes recorded since the last call.
func (c *recordingConn) taken() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.writes
	c.writes = nil
	return w
}

// only returns the one connection the gateway accepted.
func (l *recordingListener) only(t *testing.T) *recordingConn {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) != 1 {
		t.Fatalf("%d client connections accepted, want 1", len(l.conns))
	}
	return l.conns[0]
}

// streamEndEnv starts a gateway on a recording listener, in front of url (a
// test backend) or, when url is "", of the mock configured by mc, with a
// backend read buffer of readBuffer bytes (0: the default).
func streamEndEnv(t *testing.T, url string, mc mock.Config, readBuffer int) (*gatewaytest.Env, *recordingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &recordingListener{Listener: ln, wrote: make(chan struct{}, 1)}
	store, err := sqlite.Open(t.TempDir() + "/end.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := gatewaytest.NewEnvOn(t, rl, store, mc, func(c *gateway.Config) {
		if url != "" {
			c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "b", URL: url, Kind: "openai"}}}}
		}
		c.BackendReadBuffer = readBuffer
	})
	return e, rl
}

// dialGateway opens a raw client connection to e's gateway.
func dialGateway(t *testing.T, e *gatewaytest.Env) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// postRaw writes a JSON POST of body to path on w, with extra header lines
// (each ending in CRLF) after Host.
func postRaw(w io.Writer, path, extra, body string) {
	fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, extra, len(body), body)
}

// rawResponse reads one HTTP response from br and returns its bytes as
// they came (status line to the end of the chunked body) and its body.
func rawResponse(t *testing.T, br *bufio.Reader) (raw []byte, body string, res *http.Response) {
	t.Helper()
	var rec bytes.Buffer
	res, err := http.ReadResponse(bufio.NewReader(io.TeeReader(br, &rec)), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the streamed body: %v (got %q)", err, b)
	}
	return rec.Bytes(), string(b), res
}

// endsAfterCapture checks how a stream's writes end: the last event and
// the last chunk ("0\r\n") in one write, then the empty trailer that
// completes the response alone, once the call was handed to capture (see
// serveStream; TestStreamEndFollowsCapture). fasthttp alone wrote the last
// chunk and the trailer apart from the last event.
func endsAfterCapture(t *testing.T, what string, writes [][]byte) {
	t.Helper()
	if len(writes) < 2 {
		t.Fatalf("%s: %d writes: %q", what, len(writes), writes)
	}
	if last := writes[len(writes)-1]; string(last) != "\r\n" {
		t.Fatalf("%s: the last write is %q, not the empty trailer alone", what, last)
	}
	if end := writes[len(writes)-2]; !bytes.HasSuffix(end, []byte("data: [DONE]\n\n\r\n0\r\n")) {
		t.Fatalf("%s: the write before the trailer ends %q, not the last event with the last chunk", what, end[max(0, len(end)-40):])
	}
	for _, w := range writes {
		if s := string(w); s == "0\r\n" || s == "0\r\n\r\n" {
			t.Fatalf("%s: the last chunk written on its own: %q", what, writes)
		}
	}
}

// TestStreamEndsInOneWrite: a streamed response's last event and last
// chunk leave the gateway in one write, and only the empty trailer after
// it (fasthttp alone wrote the last chunk apart). When the whole answer
// reached the gateway in one read, the response is that one write, headers
// included, and the trailer. The connection stays usable: the bytes the
// client read are exactly the bytes written, response after response on
// one keep-alive connection, each call captured whole.
func TestStreamEndsInOneWrite(t *testing.T) {
	const n = 20
	e, rl := streamEndEnv(t, burstBackend(t, n), mock.Config{}, 0)
	conn := dialGateway(t, e)
	br := bufio.NewReader(conn)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for round := range 4 {
		postRaw(conn, "/v1/chat/completions", "", body)
		raw, got, res := rawResponse(t, br)
		if res.StatusCode != 200 || strings.Count(got, "data: ") != n+2 || !strings.HasSuffix(got, "data: [DONE]\n\n") {
			t.Fatalf("round %d: status %d, body:\n%s", round, res.StatusCode, got)
		}
		writes := rl.only(t).taken()
		if joined := bytes.Join(writes, nil); !bytes.Equal(joined, raw) {
			t.Fatalf("round %d: the client read %d bytes, the gateway wrote %d:\nread  %q\nwrote %q", round, len(raw), len(joined), raw, joined)
		}
		if len(writes) != 2 {
			t.Fatalf("round %d: a stream that reached the gateway in one read was written in %d writes, want it and its trailer: %q", round, len(writes), writes)
		}
		endsAfterCapture(t, fmt.Sprintf("round %d", round), writes)
		rows := e.WaitCalls(res.Header.Get("x-request-id"), 1)
		if !strings.Contains(rows[0].ResponseMessage, "t0 t1 ") || rows[0].FinishReason != "stop" || rows[0].Error != "" {
			t.Fatalf("round %d: captured %q finish %q error %q", round, rows[0].ResponseMessage, rows[0].FinishReason, rows[0].Error)
		}
	}
}

// TestStreamEndLeavesWithLastEvent: tokens that arrive one by one leave one
// by one, and the stream's last chunk, when the engine sends its end with
// its last event ([DONE]; vLLM's server writes the end on its own right
// after, so it is often but not always there), leaves with it, then only
// the empty trailer; two requests sent together on one connection
// (pipelined) get both their answers whole, in order.
func TestStreamEndLeavesWithLastEvent(t *testing.T) {
	var events []string
	for i := range 6 {
		s := fmt.Sprintf(`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t%d "},"finish_reason":null}]}`+"\n\n", i)
		events = append(events, fmt.Sprintf("%x\r\n%s\r\n", len(s), s))
	}
	done := "data: [DONE]\n\n"
	last := fmt.Sprintf("%x\r\n%s\r\n", len(done), done) + "0\r\n\r\n"
	// Each token is sent once the gateway has written the one before to
	// its client (wrote), so tokens reach it one by one.
	wrote := make(chan chan struct{}, 1)
	url := rawBackend(t, func(c net.Conn, _ *http.Request) bool {
		w := <-wrote
		wrote <- w
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for _, ev := range events {
			select { // a signal left from before this token is not its write
			case <-w:
			default:
			}
			if _, err := io.WriteString(c, ev); err != nil {
				return false
			}
			select {
			case <-w:
			case <-time.After(10 * time.Second): // bound, not pacing: the test fails on the events
				return false
			}
		}
		_, err := io.WriteString(c, last)
		return err == nil
	})
	e, rl := streamEndEnv(t, url, mock.Config{}, 0)
	wrote <- rl.wrote
	conn := dialGateway(t, e)
	br := bufio.NewReader(conn)
	req := func(i int) string {
		body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi %d"}]}`, i)
		return fmt.Sprintf("POST /rollout/end-%d/attempt/1/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", i, len(body), body)
	}
	check := func(what string, raw []byte, got string, writes [][]byte) {
		t.Helper()
		if strings.Count(got, "data: ") != 7 || !strings.HasSuffix(got, "data: [DONE]\n\n") {
			t.Fatalf("%s: body:\n%s", what, got)
		}
		if joined := bytes.Join(writes, nil); !bytes.Equal(joined, raw) {
			t.Fatalf("%s: the client read %d bytes, the gateway wrote %d:\nread  %q\nwrote %q", what, len(raw), len(joined), raw, joined)
		}
		if len(writes) < 4 {
			t.Fatalf("%s: tokens sent one by one written in %d writes, want one per token", what, len(writes))
		}
		endsAfterCapture(t, what, writes)
	}
	for i := range 2 {
		fmt.Fprint(conn, req(i))
		raw, got, _ := rawResponse(t, br)
		check(fmt.Sprintf("call %d", i), raw, got, rl.only(t).taken())
	}
	// Pipelined: both requests in one write.
	fmt.Fprint(conn, req(2)+req(3))
	raw2, got2, _ := rawResponse(t, br)
	raw3, got3, _ := rawResponse(t, br)
	if !strings.Contains(got2, "data: [DONE]") || !strings.Contains(got3, "data: [DONE]") {
		t.Fatalf("pipelined answers:\n%s\n---\n%s", got2, got3)
	}
	writes := rl.only(t).taken()
	if joined, raw := bytes.Join(writes, nil), append(raw2, raw3...); !bytes.Equal(joined, raw) {
		t.Fatalf("pipelined: the client read %d bytes, the gateway wrote %d:\nread  %q\nwrote %q", len(raw), len(joined), raw, joined)
	}
}

// TestLateBurstEndsWithItsLastChunk: when the end comes in a burst larger
// than 4 KiB (a 64 KiB backend read buffer takes the whole burst at once),
// the burst leaves in one write with the last chunk, then the trailer.
func TestLateBurstEndsWithItsLastChunk(t *testing.T) {
	next := make(chan struct{})
	e, rl := streamEndEnv(t, lateBurstBackend(t, 300, next), mock.Config{}, 64<<10)
	conn := dialGateway(t, e)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	postRaw(conn, "/v1/chat/completions", "", body)
	var rec bytes.Buffer
	br := bufio.NewReader(io.TeeReader(conn, &rec))
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1)
	if _, err := io.ReadFull(res.Body, first); err != nil {
		t.Fatal(err)
	}
	close(next) // the burst follows the first event
	rest, err := io.ReadAll(res.Body)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") || strings.Count(string(rest), "data: ") != 302 {
		t.Fatalf("err %v, body ends %q", err, rest[max(0, len(rest)-200):])
	}
	writes := rl.only(t).taken()
	if joined := bytes.Join(writes, nil); !bytes.Equal(joined, rec.Bytes()[:len(joined)]) || len(joined) != rec.Len()-br.Buffered() {
		t.Fatalf("the client read %d bytes, the gateway wrote %d", rec.Len()-br.Buffered(), len(joined))
	}
	endsAfterCapture(t, "late burst", writes)
	if last := writes[len(writes)-2]; len(last) <= 4096 {
		t.Fatalf("the burst's last write is %d bytes: want more than 4 KiB, the burst with its last chunk", len(last))
	}
}

// TestStreamFromFragmentedBackend: a backend whose chunked stream arrives a
// few bytes at a time (each piece its own write, TCP_NODELAY) (sizes lines, events and CRLFs cut anywhere) reaches
// the client event for event, ending with the body's end; a stream waits
// for such bytes on one byte, without a read buffer (streamBody.readBurst).
func TestStreamFromFragmentedBackend(t *testing.T) {
	var stream strings.Builder
	var events []string
	for i := range 12 {
		ev := fmt.Sprintf(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"w%d "},"finish_reason":null}]}`, i)
		if i == 11 {
			ev = `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`
		}
		events = append(events, ev)
	}
	events = append(events, "[DONE]")
	for _, ev := range events {
		s := "data: " + ev + "\n\n"
		fmt.Fprintf(&stream, "%x\r\n%s\r\n", len(s), s)
	}
	stream.WriteString("0\r\n\r\n")
	raw := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" + stream.String()
	url := rawBackend(t, func(c net.Conn, _ *http.Request) bool {
		for at, k := 0, 0; at < len(raw); k++ {
			n := min(1+k%7, len(raw)-at) // pieces of 1 to 7 bytes
			if _, err := io.WriteString(c, raw[at:at+n]); err != nil {
				return false
			}
			at += n
		}
		return true
	})
	e, _ := streamEndEnv(t, url, mock.Config{}, 0)
	for round := range 2 {
		r := gatewaytest.Do(t, "POST", e.URL+"/rollout/frag/attempt/1/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
		got := gatewaytest.SSEData(r.Body)
		if r.Status != 200 || strings.Join(got, "\n") != strings.Join(events, "\n") {
			t.Fatalf("round %d: status %d, events:\n%s\nwant:\n%s", round, r.Status, strings.Join(got, "\n"), strings.Join(events, "\n"))
		}
		rows := e.WaitCalls(r.Header.Get("x-request-id"), 1)
		if rows[0].ResponseMessage == "" || !strings.Contains(rows[0].ResponseMessage, "w0 w1 w2") || rows[0].FinishReason != "stop" || rows[0].Error != "" {
			t.Fatalf("round %d: captured %q finish %q error %q", round, rows[0].ResponseMessage, rows[0].FinishReason, rows[0].Error)
		}
	}
}

// TestStreamEndFollowsCapture: a client that has read a stream to its end
// finds the call among those stored when it then waits for capture
// (Pipeline.Sync, what the control plane does before it reports a rollout
// finished), however soon it asks: the response's last bytes leave only
// once the call was handed to capture. The engine sends its answer in one
// burst of 400 events, so that capture has many events to take in after
// the last write: a response whose end left first is all but sure to be
// seen before its call is captured.
func TestStreamEndFollowsCapture(t *testing.T) {
	next := make(chan struct{})
	close(next)
	e, _ := streamEndEnv(t, lateBurstBackend(t, 400, next), mock.Config{}, 64<<10)
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 20 {
		res, err := http.Post(e.URL+"/rollout/sync/attempt/1/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
			t.Fatalf("call %d: %v, body ends %q", i, err, b[max(0, len(b)-100):])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		err = e.Pipe.Sync(ctx)
		var rows []export.Call
		if err == nil {
			rows, err = e.Store.Calls(ctx, export.CallFilter{SpanID: res.Header.Get("x-request-id")})
		}
		cancel()
		if err != nil || len(rows) != 1 {
			t.Fatalf("call %d: answered, then %d rows stored after Sync (%v): its end left before its capture", i, len(rows), err)
		}
	}
}
