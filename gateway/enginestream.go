package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// A streamed backend answer is read by the gateway itself (engineStream),
// not by fasthttp's body stream: fasthttp's client holds its connection's
// read buffer (ReadBufferSize, 8 KiB) for the stream's whole life, and an
// engine is silent most of that life (between two tokens). engineStream
// gives the buffer back to the client's pool whenever it has handed out
// every byte in it, and waits for the engine's next bytes without one
// (idleConn.waitReadable: the runtime's poller, then a non-blocking
// MSG_PEEK; for a parked stream, the parker's epoll event, after which the
// read goes straight to the socket), so 1,000 open streams between tokens
// hold no read buffer. On a
// connection that cannot be waited on that way (TLS: bytes on the socket
// are not yet plaintext) it keeps the buffer, as fasthttp did.
//
// The round trip up to the response headers is fasthttp's own steps (the
// HostClient's connection pool, writer and reader pools, header parser), as
// hangupWatch.roundTrip does for non-streamed calls, after fasthttp v1.69's
// transport.RoundTrip (client.go). The body is decoded here: chunked (what
// every engine sends for a stream) or, without a length, until the engine
// closes. A body with a Content-Length (an error answer) is read whole, as
// fasthttp reads any body it does not stream.
//
// Since the gateway owns the buffer, it also tells whether the next read
// would return without touching the socket (ready, endBuffered), which fill
// uses to forward a burst of events in one write.

// streamDeadlines are the deadlines of the streamed calls under way, by
// request: fasthttp hands RoundTrip the request, not the deadline the call
// was made with (DoDeadline keeps it in an unexported field).
type streamDeadlines struct{ m sync.Map } // *fasthttp.Request -> *time.Time

// doStream makes the streamed request req to hc with deadline, reading the
// answer's body with an engineStream.
func (t *hangupTransport) doStream(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) error {
	d := deadline
	t.streams.m.Store(req, &d)
	err := hc.DoDeadline(req, resp, deadline)
	t.streams.m.Delete(req)
	return err
}

// streamRoundTrip sends req and reads the answer's headers; a chunked or
// unbounded body is left to an engineStream (resp's body stream), which
// gives the connection back, or closes it, when it is closed.
func (t *hangupTransport) streamRoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, deadline time.Time) (retry bool, err error) {
	timeout := time.Until(deadline)
	if timeout <= 0 {
		return false, fasthttp.ErrTimeout
	}
	cc, err := hc.AcquireConn(timeout, req.ConnectionClose())
	if err != nil {
		return false, err
	}
	conn := cc.Conn()
	resp.ResetBody()
	resp.ParseNetConn(conn)
	closeAfter, err := sendRequest(hc, conn, cc.CreatedTime(), req, deadline)
	if err != nil {
		hc.CloseConn(cc)
		return true, err
	}
	if hc.DisableHeaderNamesNormalizing {
		resp.Header.DisableNormalizing()
	}
	wait, _ := conn.(*idleConn)
	if wait != nil && !wait.canWait() {
		wait = nil
	}
	if wait != nil {
		// The engine's first bytes (its time to first token) are awaited
		// without a read buffer too.
		if err := wait.waitReadable(); err != nil {
			hc.CloseConn(cc)
			return true, firstByteError(err)
		}
	}
	br := hc.AcquireReader(conn)
	err = resp.Header.Read(br)
	if err == nil && resp.Header.StatusCode() == fasthttp.StatusContinue {
		err = resp.Header.Read(br)
	}
	if err != nil {
		hc.ReleaseReader(br)
		hc.CloseConn(cc)
		return true, err
	}
	keep := !closeAfter && !req.ConnectionClose() && !resp.ConnectionClose()
	code, length := resp.StatusCode(), resp.Header.ContentLength()
	if noBody := req.Header.IsHead() || code < 200 || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified; noBody || length >= 0 {
		if !noBody {
			// Read whole (and bounded), as fasthttp reads a body it
			// does not stream.
			resp.StreamBody = false
			err = resp.ReadBody(br, hc.MaxResponseBodySize)
			resp.StreamBody = true
		}
		hc.ReleaseReader(br)
		if err != nil {
			hc.CloseConn(cc)
			return !errors.Is(err, fasthttp.ErrBodyTooLarge), err
		}
		if keep {
			hc.ReleaseConn(cc)
		} else {
			hc.CloseConn(cc)
		}
		return false, nil
	}
	es := &engineStream{hc: hc, conn: conn, br: br, chunked: length == -1, keep: keep && length == -1}
	if wait != nil && br.Buffered() == 0 {
		// The headers came alone (the engine sends them before its first
		// token): the stream waits for the first token without a buffer
		// too. (Else a wave of calls would each hold one until its
		// stream's goroutine first runs.)
		hc.ReleaseReader(br)
		es.br = nil
	}
	es.end = func(reuse bool) {
		if reuse {
			hc.ReleaseConn(cc)
		} else {
			hc.CloseConn(cc)
		}
	}
	if wait != nil { // not a typed nil in the interface
		es.wait = wait
	}
	resp.SetBodyStream(es, length)
	return false, nil
}

// firstByteError is what a wait for an answer's first byte that failed
// with err returns: what fasthttp's header reader returns when that read
// fails (ResponseHeader.tryRead in v1.69's header.go): ErrTimeout on a
// timeout, otherwise io.EOF, which the client reports as a connection
// closed before the first response byte.
func firstByteError(err error) error {
	if t, ok := err.(interface{ Timeout() bool }); ok && t.Timeout() {
		return fasthttp.ErrTimeout
	}
	return io.EOF
}

// engineStream is a streamed backend answer's body (see above). Read
// returns at most the rest of the current HTTP chunk, as fasthttp's body
// stream does; ready and endBuffered look at what is buffered. It is not
// safe for concurrent use, and CloseWithError must be called once the
// stream is done with (fasthttp's Response does on Reset).
type engineStream struct {
	hc      *fasthttp.HostClient
	conn    net.Conn
	end     func(reuse bool) // gives the connection back to the pool (true) or closes it
	wait    readWaiter       // nil: the stream keeps its buffer while waiting
	br      *bufio.Reader    // from hc's pool; nil while waiting with nothing buffered
	chunked bool             // else: the body ends when the engine closes
	keep    bool             // the connection may serve another request once the body ended
	left    int              // chunked: bytes of the current chunk not read yet
	eof     bool             // the body ended
	err     error            // the read error that ended the stream (returned again)
	closed  bool
}

// readWaiter waits until a connection has bytes to read, reading none
// (idleConn.waitReadable).
type readWaiter interface{ waitReadable() error }

// errBrokenChunk is what a malformed chunked body from a backend fails with.
var errBrokenChunk = errors.New("malformed chunked body from the backend")

// maxChunkSizeDigits bounds a chunk's size (8 hex digits: < 4 GiB), and
// maxChunkLine its size line with extensions (as Go's net/http does).
const (
	maxChunkSizeDigits = 8
	maxChunkLine       = 4096
)

// parseChunkLine parses a chunk's size line, line feed included: hex
// digits, optional blanks, optional extensions (from ';' on, skipped), CRLF
// (RFC 9112 §7.1). ok is false when it is not one.
func parseChunkLine(line []byte) (size int, ok bool) {
	n := len(line)
	if n < 3 || line[n-2] != '\r' || line[n-1] != '\n' {
		return 0, false
	}
	i := 0
	for ; i < n-2; i++ {
		d := hexDigit(line[i])
		if d < 0 {
			break
		}
		if i >= maxChunkSizeDigits {
			return 0, false
		}
		size = size<<4 | d
	}
	if i == 0 {
		return 0, false
	}
	for ; i < n-2 && (line[i] == ' ' || line[i] == '\t'); i++ {
	}
	if i < n-2 && line[i] != ';' {
		return 0, false
	}
	for ; i < n-2; i++ {
		if line[i] == '\r' || line[i] == '\n' {
			return 0, false
		}
	}
	return size, true
}

// Read reads the body.
func (es *engineStream) Read(p []byte) (int, error) {
	switch {
	case es.err != nil:
		return 0, es.err
	case es.eof || es.closed:
		return 0, io.EOF
	case len(p) == 0:
		return 0, nil
	}
	if !es.chunked {
		if err := es.fill(); err != nil {
			return 0, es.fail(err)
		}
		n, _ := es.br.Read(p) // buffered bytes: no socket read
		return n, nil
	}
	if es.left == 0 {
		size, err := es.chunkSize()
		if err != nil {
			return 0, es.fail(err)
		}
		if size == 0 {
			if err := es.trailer(); err != nil {
				return 0, es.fail(err)
			}
			es.eof = true
			return 0, io.EOF
		}
		es.left = size
	}
	if err := es.fill(); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, es.fail(err)
	}
	n, _ := es.br.Read(p[:min(len(p), es.left)]) // buffered bytes: no socket read
	es.left -= n
	if es.left == 0 {
		if err := es.crlf(); err != nil {
			return n, es.fail(err)
		}
	}
	return n, nil
}

// fill makes sure at least one byte is buffered, reading the socket once
// when none is. With nothing buffered, the read buffer goes back to the
// pool while the stream waits for the engine (when it can wait without it).
func (es *engineStream) fill() error {
	if es.br != nil && es.br.Buffered() > 0 {
		return nil
	}
	if es.wait != nil {
		if es.br != nil {
			es.hc.ReleaseReader(es.br)
			es.br = nil
		}
		if err := es.wait.waitReadable(); err != nil {
			return err
		}
	}
	if es.br == nil {
		es.br = es.hc.AcquireReader(es.conn)
	}
	_, err := es.br.Peek(1)
	return err
}

// chunkSize reads a chunk's size line: hex digits, extensions (skipped),
// CRLF. A body that ends before a size line's first byte ends as fasthttp's
// body stream ends it (io.EOF): the stream is then judged by its events
// (a chat stream without [DONE] is cut short).
func (es *engineStream) chunkSize() (int, error) {
	if err := es.fill(); err != nil {
		return 0, err
	}
	line, err := es.br.ReadSlice('\n')
	if err != nil {
		if err == io.EOF || err == bufio.ErrBufferFull {
			return 0, fmt.Errorf("%w: chunk size line %q: %w", errBrokenChunk, trimQuote(line), err)
		}
		return 0, err
	}
	if len(line) > maxChunkLine {
		return 0, fmt.Errorf("%w: chunk size line longer than %d bytes", errBrokenChunk, maxChunkLine)
	}
	size, ok := parseChunkLine(line)
	if !ok {
		return 0, fmt.Errorf("%w: chunk size line %q", errBrokenChunk, trimQuote(line))
	}
	return size, nil
}

// crlf reads the CRLF that ends a chunk's data.
func (es *engineStream) crlf() error {
	for _, want := range []byte{'\r', '\n'} {
		if err := es.fill(); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if c, _ := es.br.ReadByte(); c != want {
			return fmt.Errorf("%w: %q after a chunk's data, want %q", errBrokenChunk, c, want)
		}
	}
	return nil
}

// maxTrailerBytes bounds the trailer section after the last chunk.
const maxTrailerBytes = 8 << 10

// trailer reads the trailer section after the last chunk (engines send
// none: just its closing CRLF). The engine closing right after the last
// chunk ends the body too, the connection then not reused.
func (es *engineStream) trailer() error {
	total := 0
	for {
		if err := es.fill(); err != nil {
			if err == io.EOF && total == 0 {
				es.keep = false
				return nil
			}
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		line, err := es.br.ReadSlice('\n')
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%w: trailer: %w", errBrokenChunk, err)
		}
		if total += len(line); total > maxTrailerBytes {
			return fmt.Errorf("%w: trailer longer than %d bytes", errBrokenChunk, maxTrailerBytes)
		}
		n := len(line)
		if n < 2 || line[n-2] != '\r' {
			return fmt.Errorf("%w: trailer line %q without CRLF", errBrokenChunk, trimQuote(line))
		}
		if n == 2 {
			return nil
		}
		if colon := bytes.IndexByte(line, ':'); colon <= 0 || bytes.IndexByte(line[:n-2], '\r') >= 0 {
			return fmt.Errorf("%w: trailer line %q", errBrokenChunk, trimQuote(line))
		}
	}
}

// fail ends the stream with err (returned by every later Read).
func (es *engineStream) fail(err error) error {
	if err == io.EOF {
		es.eof = true
		es.keep = false
		return err
	}
	es.err = err
	return err
}

// CloseWithError ends the stream: the connection goes back to the pool
// when the body was read to its end with nothing extra after it, err is nil
// and the engine keeps it alive; otherwise it is closed (which is how an
// engine is told to stop generating). Calls after the first do nothing.
func (es *engineStream) CloseWithError(err error) error {
	if es.closed {
		return nil
	}
	es.closed = true
	reuse := err == nil && es.eof && es.err == nil && es.keep
	if es.br != nil {
		if es.br.Buffered() > 0 {
			reuse = false // bytes the engine sent after its answer
		}
		es.hc.ReleaseReader(es.br)
		es.br = nil
	}
	es.end(reuse)
	return nil
}

// parkable reports whether the next Read would wait for the engine on a
// socket the stream can be parked on (parker): nothing buffered, the body
// not ended, the wait made without a buffer. Then the read buffer goes
// back to the pool, as the wait itself would give it back (fill).
func (es *engineStream) parkable() (*idleConn, bool) {
	if es.closed || es.eof || es.err != nil || es.br != nil && es.br.Buffered() > 0 {
		return nil, false
	}
	ic, ok := es.wait.(*idleConn)
	if !ok || ic.raw == nil {
		return nil, false
	}
	if es.br != nil {
		es.hc.ReleaseReader(es.br)
		es.br = nil
	}
	return ic, true
}

// buffered returns the bytes read off the socket and not returned yet.
func (es *engineStream) buffered() []byte {
	if es.br == nil || es.closed {
		return nil
	}
	b, _ := es.br.Peek(es.br.Buffered()) // never reads the socket
	return b
}

// ready reports whether the next Read returns without reading the socket:
// the rest of the current chunk and its CRLF, or a whole next chunk (size
// line, data, CRLF), is buffered. The last chunk (size 0) is never reported:
// reading it reads the trailer section, which may want more bytes.
//
// Engines send one SSE event per chunk. When several arrive together (the
// first tokens, the finish and usage events with [DONE], any burst), fill
// reads on while ready and forwards them in one chunk and one write, as
// nginx, reading the socket, does; it never waits for bytes that have not
// arrived.
func (es *engineStream) ready() bool {
	if es.err != nil || es.eof || es.closed {
		return false
	}
	b := es.buffered()
	if !es.chunked {
		return len(b) > 0
	}
	return chunkReady(b, es.left)
}

// chunkReady reports whether b, what is buffered of a chunked body with
// left bytes of the current chunk unread, holds the rest of that chunk and
// its CRLF or, at a chunk boundary, a whole chunk of size > 0.
func chunkReady(b []byte, left int) bool {
	n := len(b)
	if n == 0 {
		return false
	}
	if left > 0 {
		return n >= left+2
	}
	eol := bytes.IndexByte(b, '\n')
	if eol < 0 || eol >= maxChunkLine {
		return false
	}
	size, ok := parseChunkLine(b[:eol+1])
	if !ok || size == 0 {
		return false
	}
	return n >= eol+1+size+2
}

// endBuffered reports whether the body's end, the last chunk without
// trailers ("0\r\n\r\n"), is what is buffered next: the next Read returns
// io.EOF without reading the socket.
func (es *engineStream) endBuffered() bool {
	return es.chunked && es.left == 0 && !es.closed && es.err == nil && !es.eof &&
		bytes.HasPrefix(es.buffered(), []byte(lastChunk+emptyTrailer))
}

// hexDigit is c's value as a hex digit, or -1.
func hexDigit(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// trimQuote shortens a line quoted in an error.
func trimQuote(b []byte) []byte {
	if len(b) > 32 {
		return b[:32]
	}
	return b
}
