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
// engine's next chunk holds no read buffer, reads the chunks as they come,
// and leaves its connection to the next call once read to its end; a
// stream closed before its end closes its connection instead.
func TestEngineStreamWaitsWithoutReadBuffer(t *testing.T) {
	const chunks = 5
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var (
		accepted atomic.Int32
		nexts    sync.Map // X-Call -> chan struct{}: that call's engine sends its next chunk
	)
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
					v, _ := nexts.Load(req.Header.Get("X-Call"))
					next := v.(chan struct{})
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
					for i := range chunks {
						if i > 0 {
							<-next // the gateway waits for this chunk
						}
						ev := fmt.Sprintf("data: %d\n\n", i)
						fmt.Fprintf(c, "%x\r\n%s\r\n", len(ev), ev)
					}
					<-next
					io.WriteString(c, "0\r\n\r\n")
				}
			}()
		}
	}()

	var tr hangupTransport
	hc := &fasthttp.HostClient{
		Addr:      ln.Addr().String(),
		Transport: &tr,
		Dial: func(addr string) (net.Conn, error) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			return &idleConn{Conn: c, idle: time.Minute}, nil
		},
	}
	calls := 0
	call := func(readAll bool) chan struct{} {
		t.Helper()
		calls++
		next := make(chan struct{})
		nexts.Store(fmt.Sprint(calls), next)
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		req.Header.Set("X-Call", fmt.Sprint(calls))
		req.SetRequestURI("http://" + ln.Addr().String() + "/v1/chat/completions")
		req.Header.SetMethod("POST")
		req.SetBodyString(`{"stream":true}`)
		resp.StreamBody = true
		if err := tr.doStream(hc, req, resp, time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		es, ok := resp.BodyStream().(*engineStream)
		if !ok {
			t.Fatalf("body stream %T, want the gateway's engineStream", resp.BodyStream())
		}
		if es.wait == nil {
			t.Fatal("a plain TCP connection to the engine, yet no way to wait without a buffer")
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
		if w.waits != chunks || w.held != 0 {
			t.Fatalf("%d waits for the engine (want %d), %d of them holding a read buffer (want 0)", w.waits, chunks, w.held)
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
