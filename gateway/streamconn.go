package gateway

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// A streamed (SSE) answer is written by the gateway itself, on the client
// connection fasthttp hands over (RequestCtx.Hijack, without a response of
// its own), not through fasthttp's response writer.
//
// Through fasthttp, every open stream held a 4 KiB buffered writer and a
// 4 KiB copy buffer for its whole life (writeBodyChunked in fasthttp v1.69's
// http.go blocks in the body's Read with the copy buffer taken), and each
// burst of events was copied twice more (into the copy buffer, then the
// writer). Written here, a stream between two bursts holds no buffer at
// all, and each burst leaves in one write straight from the bytes fill
// made, the last one with the last chunk; the empty trailer that completes
// the response follows once the call was handed to capture (serveStream).
//
// The bytes are those fasthttp would have written: its own response headers
// (ResponseHeader.AppendBytes, after serveConn has set Connection and Server
// on them, as it does before writing a response) and HTTP/1.1 chunked
// framing without trailers. Once the stream ended, the connection goes back
// to fasthttp (Server.ServeConn) for the client's next request, with what
// fasthttp had already read of it (readAhead), unless the response closes
// it (the client asked, the gateway is draining, a write failed).

// streamHeadBufs hold a stream's response headers and first chunk until
// they leave together.
var streamHeadBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// hijackStream hands sb's stream to a hijack of ctx's connection: fasthttp
// sends nothing itself, and the stream is written once the handler returned
// (serveStream).
func (s *Server) hijackStream(ctx *fasthttp.RequestCtx, sb *streamBody) {
	s.streams.Add(1)
	s.openStreams.Add(1)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(hc net.Conn) { s.serveStream(ctx, sb, hc) })
}

// serveStream writes sb's stream on the hijacked connection hc (ctx's, as
// fasthttp wraps it) until it ends or waits parked (runStream).
func (s *Server) serveStream(ctx *fasthttp.RequestCtx, sb *streamBody, hc net.Conn) {
	growStack(0)
	h := &ctx.Response.Header
	ahead, ok := readAhead(hc)
	if !ok || s.draining.Load() {
		h.SetConnectionClose()
	}
	h.SetContentLength(-1) // chunked, as fasthttp sends a body stream
	head := streamHeadBufs.Get().(*[]byte)
	*head = h.AppendBytes((*head)[:0])
	sb.respHead, sb.ahead, sb.closeAfter, sb.ctx = head, ahead, h.ConnectionClose(), ctx
	s.runStream(sb)
}

// streamDone counts a stream written on a hijacked connection as ended.
func (s *Server) streamDone() {
	s.openStreams.Add(-1)
	s.streams.Done()
}

// runStream writes sb's stream, ends the call, and gives the connection
// back to fasthttp for its next request or closes it. It returns early when
// the stream was parked: the goroutine that resumes it runs it on. On a
// parker's worker, it reports whether the worker went on to serve the
// client's connection (it left the workers: parker.retire).
func (s *Server) runStream(sb *streamBody) (retired bool) {
	streaming := true
	defer func() {
		if streaming {
			s.streamDone()
		}
	}()
	werr := sb.writeStream()
	if werr == errParked {
		streaming = false // still under way, on another goroutine
		return false
	}
	conn, ahead, closeAfter, ctx, onWorker := sb.conn, sb.ahead, sb.closeAfter, sb.ctx, sb.onWorker
	sb.CloseWithError(werr)
	if werr == nil {
		// The body's end leaves once the call is handed to capture: a
		// client that has its whole answer (and then reports its rollout
		// finished, which waits for the rollout's calls to be stored:
		// Pipeline.Sync) finds this call among them.
		_, werr = conn.Write([]byte(emptyTrailer))
	}
	keep := werr == nil && !closeAfter
	if ctx != nil {
		// The request's body and the response's headers are not needed
		// any more: fasthttp releases ctx only once the hijack handler
		// returns. (A stream parked once released it then.)
		ctx.Request.Reset()
		ctx.Response.Reset()
	}
	streaming = false
	s.streamDone()
	if !keep {
		conn.Close()
		return false
	}
	kc, ok := conn.(*keptConn)
	if !ok || len(kc.ahead) > 0 {
		kc = &keptConn{Conn: conn, s: s} // once per connection: its next streams reuse it
	}
	kc.ahead = ahead
	if onWorker {
		// The client's next request is awaited on this goroutine (its
		// stack grown already), which stops being one of the parker's
		// workers.
		s.parker.retire()
		retired = true
	}
	if !s.continueConn(kc) {
		kc.Close()
	}
	return retired
}

// streamStack is the stack a stream's goroutine needs: capture's parsing of
// its events and the gateway's stripping, under the writer's loop.
const streamStack = 8 << 10

// growStack grows the calling goroutine's stack to streamStack at once,
// while it is shallow. fasthttp runs each hijack handler on a new goroutine
// (hijackConnHandler), whose stack would otherwise double two or three
// times in a stream's first parse, each time copying every frame under it
// (runtime.copystack: 5 % of a streamed call's CPU in the closed loop).
//
//go:noinline
func growStack(i int) byte {
	var pad [streamStack - 2<<10]byte
	pad[i] = byte(i)
	return pad[(i+1)%len(pad)]
}

// continueConn hands kc back to fasthttp for the client's next request,
// on this goroutine (its stack grown already), until fasthttp hands it over
// again or closes it. It reports false, and does nothing, once the gateway
// is draining; until the client's next request begins, Shutdown closes kc
// (fasthttp counts a connection it serves anew as idle only 5 s later).
func (s *Server) continueConn(kc *keptConn) bool {
	s.contMu.Lock()
	if s.draining.Load() {
		s.contMu.Unlock()
		return false
	}
	s.conts.Add(1)
	kc.session++
	session := kc.session
	kc.waiting.Store(true)
	s.kept.Store(kc, struct{}{})
	s.contMu.Unlock()
	defer func() {
		// Closed before a next request: no longer kept. (After a hijack,
		// the stream's goroutine may have handed kc back anew already.)
		s.contMu.Lock()
		if kc.session == session && kc.waiting.CompareAndSwap(true, false) {
			s.kept.Delete(kc)
		}
		s.contMu.Unlock()
		s.conts.Done()
	}()
	// fasthttp cleared the deadlines when it handed the connection over, and
	// a connection it serves anew waits for its first request without one:
	// the idle timeout runs from now, as between two requests.
	if d := cmp.Or(s.cfg.ClientIdleTimeout, s.cfg.ClientReadTimeout); d > 0 {
		_ = kc.SetReadDeadline(time.Now().Add(d))
	}
	_ = s.srv.ServeConn(kc) // its errors are the client's: fasthttp logs what it logs for any connection
	return true
}

// closeKept closes the connections handed back after a stream whose next
// request has not begun (Shutdown, once draining).
func (s *Server) closeKept() {
	s.kept.Range(func(k, _ any) bool {
		if kc := k.(*keptConn); kc.waiting.Load() {
			kc.Close()
		}
		return true
	})
}

// readAhead returns what fasthttp has already read from the connection hc
// hands over beyond the request (the client's next requests, pipelined), a
// copy: fasthttp then passes its buffered reader as hc's source, and takes
// that reader back once the hijack handler returns (serveConn and
// hijackConnHandler in fasthttp v1.69's server.go). fasthttp does not export
// it: the reader is found by reflection, read-only (readahead.go). ok is false when hc is
// not laid out so: the connection then closes after the stream rather than
// lose those bytes; TestStreamEndLeavesWithLastEvent fails then, so an
// upgrade that moves them is noticed.
func readAhead(hc net.Conn) (ahead []byte, ok bool) {
	v := reflect.ValueOf(hc)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct || !fasthttpStruct(v.Type(), "hijackConn") {
		return nil, false
	}
	f := v.Elem().FieldByName("r")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return nil, false
	}
	src := f.Elem()
	switch {
	case src.Type() == reflect.TypeFor[*bufio.Reader]() && readerLayout().ok && !src.IsNil():
		return bytes.Clone(bufferedIn(src.Elem())), true
	case src.Type().Implements(reflect.TypeFor[net.Conn]()):
		return nil, true // the connection itself: nothing read ahead
	}
	return nil, false
}

// keptConn is a client connection fasthttp serves again after a stream
// (continueConn): it returns first what fasthttp had read ahead of that
// stream's request (readAhead), and it notes when the client's next request
// begins.
type keptConn struct {
	net.Conn
	ahead   []byte
	s       *Server
	waiting atomic.Bool // handed back, and no byte of a next request read yet
	session int         // how many times it was handed back (under Server.contMu)
}

// Read returns what was read ahead first.
func (c *keptConn) Read(p []byte) (int, error) {
	if len(c.ahead) > 0 {
		n := copy(p, c.ahead)
		c.ahead = c.ahead[n:]
		c.served()
		return n, nil
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.served()
	}
	return n, err
}

// served notes that the client's next request has begun.
func (c *keptConn) served() {
	if c.waiting.CompareAndSwap(true, false) {
		c.s.kept.Delete(c)
	}
}

// SyscallConn is the socket's, for the hang-up watches (socketOf).
func (c *keptConn) SyscallConn() (syscall.RawConn, error) {
	sc := socketOf(c.Conn)
	if sc == nil {
		return nil, errors.New("gateway: the client connection has no socket")
	}
	return sc.SyscallConn()
}

// errClientHungUp is a stream's last write refused because the client had
// closed its side of the connection: it could not get the response's end.
var errClientHungUp = errors.New("gateway: the client closed the connection before the stream's end was written")

// hungUp reports whether the client of conn has closed or reset the
// connection (a non-blocking peek; false when that cannot be known). A
// stream's last chunk and end go in one write, which a socket whose peer
// has closed still accepts: without this, a client that gave up before the
// stream's only write (its tokens all came at once, late) would be counted
// as answered.
func hungUp(conn net.Conn) bool {
	sc := socketOf(conn)
	if sc == nil || !peekSupported {
		return false
	}
	raw, err := sc.SyscallConn()
	return err == nil && peerClosed(raw)
}

// waitGroup waits for wg, or for ctx to end (its error).
func waitGroup(ctx context.Context, wg *sync.WaitGroup) error {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
