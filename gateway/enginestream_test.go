package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// recordingWaiter notes, on the reading goroutine itself, whether its
// stream held a read buffer each time it waited for the engine, and lets
// the engine send its next chunk only then.
type recordingWaiter struct {
	inner readWaiter
	es    *engineStream
	next  chan<- struct{}
	waits int
	held  int
}

func (w *recordingWaiter) waitReadable() error {
	w.waits++
	if w.es.br != nil {
		w.held++
	}
	w.next <- struct{}{}
	return w.inner.waitReadable()
}

// TestEngineStreamWaitsWithoutReadBuffer: a stream waiting for its
// engine's first or next chunk holds no read buffer, reads the chunks as
// they come, and leaves its connection to the next call once read to its
// end; a stream closed before its end closes its connection instead.
func TestEngineStreamWaitsWithoutReadBuffer(t *testing.T) {
	const chunks = 5
	var (
		tr    hangupTransport
		nexts sync.Map // X-Call -> chan struct{}: that call's engine sends its next chunk
	)
	addr, accepted, hc := engineOn(t, &tr, func(c net.Conn, req *http.Request) bool {
		v, _ := nexts.Load(req.Header.Get("X-Call"))
		next := v.(chan struct{})
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		for i := range chunks {
			<-next // the gateway waits for this chunk
			ev := fmt.Sprintf("data: %d\n\n", i)
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
		}
		<-next
		_, err := io.WriteString(c, "0\r\n\r\n")
		return err == nil
	})
	calls := 0
	call := func(readAll bool) chan struct{} {
		t.Helper()
		calls++
		next := make(chan struct{})
		nexts.Store(fmt.Sprint(calls), next)
		resp := streamCall(t, &tr, hc, addr, "X-Call", fmt.Sprint(calls))
		es, ok := resp.BodyStream().(*engineStream)
		if !ok {
			t.Fatalf("body stream %T, want the gateway's engineStream", resp.BodyStream())
		}
		if es.wait == nil {
			t.Fatal("a plain TCP connection to the engine, yet no way to wait without a buffer")
		}
		if es.br != nil { // nothing else has run on es yet
			t.Fatal("the headers came alone, yet the stream holds a read buffer until its first token")
		}
		w := &recordingWaiter{inner: es.wait, es: es, next: next}
		es.wait = w
		if !readAll {
			buf := make([]byte, 64)
			if n, err := es.Read(buf); err != nil || string(buf[:n]) != "data: 0\n\n" {
				t.Fatalf("first chunk %q, %v", buf[:n], err)
			}
			abortResponse(resp, errClientGone)
			return next
		}
		got, err := io.ReadAll(es)
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		for i := range chunks {
			want += fmt.Sprintf("data: %d\n\n", i)
		}
		if string(got) != want {
			t.Fatalf("read %q, want %q", got, want)
		}
		if w.waits != chunks+1 || w.held != 0 {
			t.Fatalf("%d waits for the engine (want %d), %d of them holding a read buffer (want 0)", w.waits, chunks+1, w.held)
		}
		fasthttp.ReleaseResponse(resp)
		return next
	}
	call(true)
	call(true)
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections for two streams read to their end, want 1 (kept alive)", n)
	}
	// The aborted stream's connection is closed (the engine is told to
	// stop so): the next call needs a new one. (Its engine, waiting to send
	// the second chunk, is let go.)
	close(call(false))
	call(true)
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections after an aborted stream, want 2 (its connection closed, not reused)", n)
	}
}

// TestEngineStreamBrokenChunk: a malformed chunk ends the stream with an
// error naming it, and the connection is not reused.
func TestEngineStreamBrokenChunk(t *testing.T) {
	for name, body := range map[string]string{
		"size not hex":       "zz\r\ndata\r\n0\r\n\r\n",
		"no CRLF after data": "5\r\nhelloXX0\r\n\r\n",
		"bare LF size line":  "5\nhello\r\n0\r\n\r\n",
		"size too large":     "123456789\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			var reused bool
			es := testStream([]byte(body), &reused)
			_, err := io.ReadAll(es)
			if !errors.Is(err, errBrokenChunk) {
				t.Fatalf("error %v, want errBrokenChunk", err)
			}
			es.CloseWithError(nil)
			if reused {
				t.Fatal("connection reused after a broken chunk")
			}
		})
	}
}

// TestEngineStreamBodies: a streamed call's answer in each framing an
// engine may use reads as sent, and its connection is reused exactly when
// the framing allows: a JSON error with a Content-Length (read whole),
// a chunked body with a trailer, and a body that ends when the engine
// closes (never reused).
func TestEngineStreamBodies(t *testing.T) {
	answers := map[string]string{
		"length":  "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{\"error\":\"bad\"}",
		"trailer": "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n0\r\nX-Checksum: 1\r\n\r\n",
		"close":   "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: a\n\ndata: b\n\n", // no length, no chunks: until the engine closes
	}
	var tr hangupTransport
	addr, accepted, hc := engineOn(t, &tr, func(c net.Conn, req *http.Request) bool {
		mode := req.Header.Get("X-Mode")
		_, err := io.WriteString(c, answers[mode])
		return err == nil && mode != "close"
	})
	call := func(mode string, wantStatus int, want string) {
		t.Helper()
		resp := streamCall(t, &tr, hc, addr, "X-Mode", mode)
		got, err := readAll(resp, 1<<20)
		if err != nil || resp.StatusCode() != wantStatus || string(got) != want {
			t.Fatalf("%s: %d %q, %v; want %d %q", mode, resp.StatusCode(), got, err, wantStatus, want)
		}
		fasthttp.ReleaseResponse(resp)
	}
	call("length", 400, `{"error":"bad"}`)
	call("trailer", 200, "data: a\n\n")
	call("length", 400, `{"error":"bad"}`)
	if n := accepted.Load(); n != 1 {
		t.Fatalf("%d connections for three answers with a length or chunks, want 1", n)
	}
	call("close", 200, "data: a\n\ndata: b\n\n")
	call("trailer", 200, "data: a\n\n")
	if n := accepted.Load(); n != 2 {
		t.Fatalf("%d connections after a body that ended with its connection, want 2", n)
	}
}

// engineOn starts a fake engine on loopback: answer writes the answer to
// each request on its connection (false: close it). It returns the
// engine's address, a count of the connections it accepted, and a client
// of it whose streamed calls go through tr, over idleConn as the gateway's.
func engineOn(t *testing.T, tr *hangupTransport, answer func(c net.Conn, req *http.Request) bool) (string, *atomic.Int32, *fasthttp.HostClient) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					if !answer(c, req) {
						return
					}
				}
			}()
		}
	}()
	hc := &fasthttp.HostClient{
		Addr:      ln.Addr().String(),
		Transport: tr,
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return &idleConn{Conn: c, idle: time.Minute}, nil
		},
	}
	return ln.Addr().String(), accepted, hc
}

// streamCall makes a streamed call to addr through tr, with header
// X-Call (or X-Mode) set to v.
func streamCall(t *testing.T, tr *hangupTransport, hc *fasthttp.HostClient, addr, header, v string) *fasthttp.Response {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://" + addr + "/v1/chat/completions")
	req.Header.SetMethod("POST")
	req.Header.Set(header, v)
	req.SetBodyString(`{"stream":true}`)
	resp.StreamBody = true
	if err := tr.doStream(hc, req, resp, time.Now().Add(time.Minute)); err != nil {
		t.Fatalf("%s %s: %v", header, v, err)
	}
	return resp
}
