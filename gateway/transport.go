package gateway

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway/backends"
)

// A non-streamed call waits for its backend's whole answer (for vLLM: the
// whole generation) before anything is written to its client, so a client
// that hangs up meanwhile is noticed by nobody: the backend keeps the GPU
// busy and the call would be captured as a clean success. While such a call
// waits (from hangupGrace on), a hangupWatch peeks at the client's
// connection (without consuming a byte) and, when the client closes or
// resets it, closes the backend connection the call is using: the backend
// sees its connection drop and aborts the generation (vLLM's API server
// cancels a request whose connection closes), and the proxy captures the
// call as 499.
//
// Deadlines of the client connection. fasthttp's server (v1.69.0,
// server.go, Server.serveConn) sets the read deadline itself: before
// reading a request it sets now+ReadTimeout, and on a keep-alive connection
// it first sets now+IdleTimeout (Server.idleTimeout: IdleTimeout, else
// ReadTimeout) before peeking the first byte of the next request; during the
// handler it does not read the connection (the body is read before the
// handler unless StreamRequestBody, which the gateway leaves off). The
// gateway sets both ReadTimeout and IdleTimeout (Config.ClientReadTimeout,
// Config.ClientIdleTimeout), so the watcher may clear the read deadline
// while it waits (otherwise a generation longer than ClientReadTimeout would
// end the watch), stop itself with a deadline in the past and leave the
// deadline zero: the server sets its own before it reads again.
//
// What counts as a hang-up: the peer's FIN (a peeked read of 0 bytes) or an
// error such as ECONNRESET, as for nginx (which peeks the same way and logs
// 499). A client that half-closes its side and still waits for the answer
// is taken for gone, as nginx and Go's net/http (which cancels the request's
// context on EOF) do. Bytes from the client make the hang-up undecidable
// without consuming them: a pipelined request, and on TLS the close_notify
// alert most clients send before closing (its record cannot be told from
// data without decrypting it). The watch then ends and the call goes on as
// without it; over TLS a hang-up is therefore seen only when the client
// closes its socket without close_notify (a killed process, or a client
// library that closes the socket directly).

// errHungUp is returned by a backend call cancelled because its client hung up.
var errHungUp = fmt.Errorf("backend call cancelled: %w", errClientGone)

// aLongTimeAgo is a read deadline in the past, to wake a blocked watcher.
var aLongTimeAgo = time.Unix(1, 0)

// hangupTransport is the RoundTripper of the gateway's backend clients. It
// performs the round trip of a call registered as cancellable (see
// Server.watchHangup) itself, on a connection its hangupWatch can close,
// and that of a streamed call made with doStream (enginestream.go); every
// other request (health checks, probes) goes through
// fasthttp.DefaultTransport unchanged. The zero value is ready to use.
type hangupTransport struct {
	calls   sync.Map // *fasthttp.Request -> *hangupWatch
	streams streamDeadlines
}

// RoundTrip implements fasthttp.RoundTripper.
func (t *hangupTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	if !resp.StreamBody {
		if v, ok := t.calls.Load(req); ok {
			return v.(*hangupWatch).roundTrip(hc, req, resp)
		}
	} else if v, ok := t.streams.m.Load(req); ok {
		return t.streamRoundTrip(hc, req, resp, *v.(*time.Time))
	}
	return fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
}

// hangupGrace is how long a non-streamed call runs before its client
// connection is watched. Most calls to a fast backend (embeddings, short
// answers) end before it and cost only a timer; a client that hangs up
// sooner is seen as soon as the watch starts (the peek finds EOF at once).
const hangupGrace = 20 * time.Millisecond

// hangupWatch is one non-streamed call's watch over its client connection
// and its canceller of the backend call.
type hangupWatch struct {
	t        *hangupTransport
	req      *fasthttp.Request
	conn     net.Conn  // the client connection
	deadline time.Time // the backend call's deadline
	log      *slog.Logger
	timer    *time.Timer // starts the watch after hangupGrace
	gone     atomic.Bool // the client hung up

	mu        sync.Mutex
	watching  bool          // the watcher runs; exited is closed when it returns
	stopped   bool          // stop was called: no watcher may start
	exited    chan struct{} // made by start
	upstream  net.Conn      // the backend connection of the round trip under way
	cancelled bool
}

// watchHangup registers req, about to be sent with deadline, as cancellable
// and watches ctx's connection from hangupGrace on until stop. It returns
// nil (and the call runs as before) when the connection cannot be watched:
// a platform without MSG_PEEK or a connection without a socket.
func (s *Server) watchHangup(ctx *fasthttp.RequestCtx, req *fasthttp.Request, deadline time.Time) *hangupWatch {
	if !peekSupported { // forwarded as before the watch existed
		return nil
	}
	conn := ctx.Conn()
	if socketOf(conn) == nil {
		return nil
	}
	w := &hangupWatch{t: &s.transport, req: req, conn: conn, deadline: deadline, log: s.log}
	w.t.calls.Store(req, w)
	w.timer = time.AfterFunc(hangupGrace, w.watch)
	return w
}

// socketOf returns the socket under a client connection (plain or TLS), or nil.
func socketOf(c net.Conn) syscall.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, _ := c.(syscall.Conn)
	return sc
}

// watch (the timer's goroutine) waits until the client hangs up (then
// cancels the backend call), sends bytes, or stop wakes it.
func (w *hangupWatch) watch() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	raw, err := socketOf(w.conn).SyscallConn()
	if err == nil {
		// The watcher waits as long as the backend call: no read deadline.
		err = w.conn.SetReadDeadline(time.Time{})
	}
	if err != nil {
		w.mu.Unlock()
		w.log.Debug("cannot watch the client connection for a hang-up", "err", err)
		return
	}
	w.watching, w.exited = true, make(chan struct{})
	w.mu.Unlock()
	defer close(w.exited)

	gone, err := waitHangup(raw)
	if gone {
		w.gone.Store(true)
		w.cancel()
	} else if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
		// Not stop's doing: the call goes on unwatched.
		w.log.Debug("cannot watch the client connection for a hang-up", "err", err)
	}
}

// stop ends the watch once the backend call has returned, unregisters the
// call and reports whether the client hung up. w may be nil (nothing
// watched).
func (w *hangupWatch) stop() (hungUp bool) {
	if w == nil {
		return false
	}
	w.t.calls.Delete(w.req)
	w.timer.Stop()
	w.mu.Lock()
	w.stopped = true
	watching := w.watching
	if watching {
		// Wake the watcher (after its SetReadDeadline: both hold mu).
		_ = w.conn.SetReadDeadline(aLongTimeAgo)
	}
	w.mu.Unlock()
	if watching {
		// Once it has returned, leave the read deadline zero: fasthttp's
		// server sets its own before reading again (see above).
		<-w.exited
		_ = w.conn.SetReadDeadline(time.Time{})
	}
	return w.gone.Load()
}

// cancel closes the backend connection of the round trip under way (or
// makes the next round trip fail at once), so the backend aborts the call.
func (w *hangupWatch) cancel() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancelled = true
	if w.upstream != nil {
		closeUpstream(w.upstream)
	}
}

// closeUpstream closes a backend connection at once: a TLS connection's
// socket is closed directly, since tls.Conn.Close first sends close_notify
// and may wait for the writer of the request.
func closeUpstream(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	_ = c.Close()
}

// attach records the backend connection of the round trip under way; false
// means the call was cancelled already.
func (w *hangupWatch) attach(c net.Conn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancelled {
		return false
	}
	w.upstream = c
	return true
}

// detach forgets the backend connection (cancel no longer closes it) and
// reports whether the call was cancelled, i.e. the connection closed.
func (w *hangupWatch) detach() (cancelled bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.upstream = nil
	return w.cancelled
}

// roundTrip sends req and reads the whole response, as fasthttp's own
// transport does for a response that is not streamed, on a connection that
// cancel may close meanwhile. A cancelled call is not retried.
func (w *hangupWatch) roundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (retry bool, err error) {
	timeout := time.Until(w.deadline)
	if timeout <= 0 {
		return false, fasthttp.ErrTimeout
	}
	cc, err := hc.AcquireConn(timeout, req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	if !w.attach(conn) {
		hc.ReleaseConn(cc) // nothing was sent on it
		return false, fmt.Errorf("%s: %w", hc.Addr, errHungUp)
	}
	// fail closes the connection (it may hold a partial exchange) and
	// returns err, or the cancellation when cancel closed the connection.
	fail := func(retry bool, err error) (bool, error) {
		cancelled := w.detach()
		hc.CloseConn(cc)
		if cancelled {
			return false, fmt.Errorf("%s: %w", hc.Addr, errHungUp)
		}
		return retry, err
	}
	resp.ParseNetConn(conn)
	closeAfter, err := sendRequest(hc, conn, cc.CreatedTime(), req, w.deadline)
	if err != nil {
		return fail(true, err)
	}
	if req.Header.IsHead() {
		resp.SkipBody = true
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	br := hc.AcquireReader(conn)
	err = resp.ReadLimitBody(br, hc.MaxResponseBodySize)
	hc.ReleaseReader(br)
	if err != nil {
		// The same answer again would be too large: not worth a retry.
		return fail(!errors.Is(err, fasthttp.ErrBodyTooLarge), err)
	}
	if w.detach() {
		hc.CloseConn(cc)
		return false, fmt.Errorf("%s: %w", hc.Addr, errHungUp)
	}
	if closeAfter || req.ConnectionClose() || resp.ConnectionClose() {
		hc.CloseConn(cc)
	} else {
		hc.ReleaseConn(cc)
	}
	return false, nil
}

// sendRequest writes req on conn, a connection of hc's made at created, as
// fasthttp v1.69's transport.RoundTrip does (client.go), and sets the read
// deadline for the answer. closeAfter reports that the connection is older
// than hc.MaxConnDuration: req went with "Connection: close" and the
// connection must close after the answer. On an error the caller closes the
// connection (it may hold a partial request).
func sendRequest(hc *fasthttp.HostClient, conn net.Conn, created time.Time, req *fasthttp.Request, deadline time.Time) (closeAfter bool, err error) {
	if err := conn.SetWriteDeadline(earliest(deadline, hc.WriteTimeout)); err != nil {
		return false, fmt.Errorf("setting write deadline: %w", err)
	}
	closeAfter = hc.MaxConnDuration > 0 && time.Since(created) > hc.MaxConnDuration && !req.ConnectionClose()
	if closeAfter {
		req.SetConnectionClose()
	}
	bw := hc.AcquireWriter(conn)
	err = req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	hc.ReleaseWriter(bw)
	if closeAfter {
		req.Header.ResetConnectionClose()
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = fasthttp.ErrTimeout
		}
		return closeAfter, err
	}
	if err := conn.SetReadDeadline(earliest(deadline, hc.ReadTimeout)); err != nil {
		return closeAfter, fmt.Errorf("setting read deadline: %w", err)
	}
	return closeAfter, nil
}

// earliest returns deadline, or now+limit when limit is set and earlier.
func earliest(deadline time.Time, limit time.Duration) time.Time {
	if limit > 0 {
		if d := time.Now().Add(limit); d.Before(deadline) {
			return d
		}
	}
	return deadline
}

// statusClientClosed is nginx's 499 "client closed request": the client
// left before any response was sent.
const statusClientClosed = 499

// hungUp captures a non-streamed call whose client hung up before its
// answer (err is how the backend call ended: usually its cancellation). The
// response left to fasthttp goes nowhere; the connection is closed.
func (s *Server) hungUp(ctx *fasthttp.RequestCtx, c *call, r *backends.Upstream, err error) {
	s.log.Debug("client hung up before the response; backend call cancelled", "backend", r.Name(), "err", err)
	if err != nil && c.tr.attempt != nil {
		s.tracing.attemptFailed(c, err, false)
	}
	ctx.SetStatusCode(statusClientClosed)
	ctx.SetConnectionClose()
	c.pend.Meta.HTTPStatus = statusClientClosed
	c.pend.Meta.Error = "client disconnected before the response"
	s.finish(c, time.Now())
}
