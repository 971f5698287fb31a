package gateway

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync"
	"syscall"
)

// clientListener wraps every plain-TCP client connection in a clientConn.
// (TLS connections are not wrapped: their writes are records, not the
// response's bytes.)
type clientListener struct{ net.Listener }

// Accept wraps the accepted connection.
func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &clientConn{Conn: c}, nil
}

// clientConn lets a streamed response end in one write.
//
// fasthttp ends a chunked body with three writes after the last event: the
// last chunk (flushed), the terminating chunk "0\r\n" (flushed), and the
// empty trailer "\r\n", flushed only once the handler's body stream is
// closed, i.e. after the call's capture bookkeeping (streamBody's
// CloseWithError). A client sees its response end at that third write;
// nginx sends the last chunk and the terminator together. (writeBodyChunked,
// writeChunk and writeTrailer in fasthttp v1.69's http.go and header.go,
// the final Flush in server.go's serveConn.)
//
// A streamBody about to return its last bytes (the backend's stream has
// ended) says so first, with their count (endAfter): what fasthttp writes
// next, that chunk (and the response headers when they were not sent yet),
// is held. When fasthttp then writes the terminating chunk, and what is
// held ends with exactly that chunk's framing, the held bytes, the
// terminating chunk and the empty trailer go out in one write, and the
// trailer fasthttp writes afterwards is dropped. A streamBody that writes
// its last chunk itself sends the body's end with it (writeEnd), and
// fasthttp's end is dropped. Anything else sends what is held as it is and
// goes on unchanged; bytes that differ from those to drop close the
// connection (errEndFraming), so a different fasthttp fails
// TestStreamEndsInOneWrite, never silently a response. Only the
// connection's own goroutine writes, but Close may come from another one
// (shutdown): a mutex guards the state.
type clientConn struct {
	net.Conn
	mu      sync.Mutex
	holding bool   // the response's last chunk is being held (endAfter)
	last    int    // its length of data
	headed  bool   // the response headers come first in it
	held    []byte // what fasthttp wrote since endAfter
	drop    string // bytes fasthttp writes next that already went out
}

// Bytes fasthttp writes to end a chunked body without trailers.
const (
	lastChunk    = "0\r\n"
	emptyTrailer = "\r\n"
	chunkedEnd   = lastChunk + emptyTrailer
)

// maxHeld bounds what a clientConn holds: the last Read of a stream returns
// at most fasthttp's 4 KiB copy buffer, with its chunk framing and, when it
// is the first, the response headers.
const maxHeld = 64 << 10

var heldBufs = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// errEndFraming is returned when fasthttp writes something other than the
// rest of a chunked body's end after that end already went out.
var errEndFraming = errors.New("gateway: a streamed response's end was sent, then other bytes than the end fasthttp writes came; closing the client connection")

// endAfter says that fasthttp's next chunk is the response's last one,
// with n bytes of data, and whether the response headers (not sent yet)
// come before it (see clientConn).
func (c *clientConn) endAfter(n int, headers bool) {
	c.mu.Lock()
	if !c.holding && c.drop == "" {
		b := heldBufs.Get().(*[]byte)
		c.holding, c.last, c.headed, c.held = true, n, headers, (*b)[:0]
	}
	c.mu.Unlock()
}

// writeEnd writes p, the response's last chunk followed by the body's end
// (chunkedEnd), in one write; the end fasthttp writes next is dropped.
func (c *clientConn) writeEnd(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sendHeldLocked(); err != nil {
		return err
	}
	if c.hungUp() {
		return errClientHungUp
	}
	if _, err := c.Conn.Write(p); err != nil {
		return err
	}
	c.drop = chunkedEnd
	return nil
}

// Write passes p on, except at a response's end (see clientConn).
func (c *clientConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drop != "" {
		k := 0
		for k < len(p) && k < len(c.drop) && p[k] == c.drop[k] {
			k++
		}
		if k < len(p) && k < len(c.drop) {
			c.drop = ""
			c.Conn.Close()
			return 0, errEndFraming
		}
		c.drop = c.drop[k:]
		if k == len(p) {
			return len(p), nil
		}
		n, err := c.Conn.Write(p[k:])
		return k + n, err
	}
	if !c.holding {
		return c.Conn.Write(p)
	}
	total := c.total()
	if string(p) == lastChunk && len(c.held) == total && heldLastChunk(c.held, c.last, c.headed) {
		if c.hungUp() {
			c.putHeld()
			return 0, errClientHungUp
		}
		c.held = append(c.held, chunkedEnd...)
		_, err := c.Conn.Write(c.held)
		c.putHeld()
		if err != nil {
			return 0, err
		}
		c.drop = emptyTrailer
		return len(p), nil
	}
	// More of the last chunk (a full write buffer cuts it, anywhere: a
	// piece may even read "0\r\n"), as long as it is within what fasthttp
	// writes for it; anything else is not the end expected: everything
	// goes as it came.
	if n := len(c.held) + len(p); n <= maxHeld && (total < 0 || n <= total) {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	if err := c.sendHeldLocked(); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

// total is the length of what fasthttp writes for the last chunk: its size
// line, its data and CRLF, after the response headers when they come first
// (then -1 until their blank line is held).
func (c *clientConn) total() int {
	n := c.last + 2 + len(strconv.AppendInt(make([]byte, 0, 16), int64(c.last), 16)) + 2
	if !c.headed {
		return n
	}
	if i := bytes.Index(c.held, []byte("\r\n\r\n")); i >= 0 {
		return i + 4 + n
	}
	return -1
}

// errClientHungUp is a stream's last write refused because the client had
// closed its side of the connection: it could not get the response's end.
var errClientHungUp = errors.New("gateway: the client closed the connection before the stream's end was written")

// hungUp reports whether the client has closed or reset the connection (a
// non-blocking peek). A stream's last chunk and end go in one write, which
// a socket whose peer has closed still accepts: without this, a client
// that gave up before the stream's only write (its tokens all came at
// once, late) would be counted as answered.
func (c *clientConn) hungUp() bool {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	return err == nil && peerClosed(raw)
}

// heldLastChunk reports whether held is the whole last chunk (its size
// line, n bytes and CRLF), after the headers (ending with a blank line)
// when they come first (headed). A "0\r\n" written before that is the chunk's
// own tail, split off by a full write buffer (its data ends with "0"): what
// is held then is 3 bytes short, and neither a chunk alone (too short) nor
// headers and a chunk (the size line would start right after "\r\n\r\n",
// 3 bytes back, which is inside that blank line).
func heldLastChunk(held []byte, n int, headed bool) bool {
	var hex [16]byte
	size := strconv.AppendInt(hex[:0], int64(n), 16)
	at := len(held) - n - 2 - len(size) - 2
	if at < 0 || headed && (at < 4 || string(held[at-4:at]) != "\r\n\r\n") || !headed && at != 0 {
		return false
	}
	return string(held[at:at+len(size)]) == string(size) &&
		string(held[at+len(size):at+len(size)+2]) == "\r\n" && string(held[len(held)-2:]) == "\r\n"
}

// sendHeldLocked sends what is held as it is and stops holding.
func (c *clientConn) sendHeldLocked() error {
	if !c.holding {
		return nil
	}
	var err error
	if len(c.held) > 0 {
		_, err = c.Conn.Write(c.held)
	}
	c.putHeld()
	return err
}

// putHeld stops holding and pools the buffer.
func (c *clientConn) putHeld() {
	b := c.held[:0]
	c.holding, c.held = false, nil
	if cap(b) <= maxHeld {
		heldBufs.Put(&b)
	}
}

// Close sends what is held first.
func (c *clientConn) Close() error {
	c.mu.Lock()
	c.sendHeldLocked() //nolint:errcheck // closing anyway
	c.drop = ""
	c.mu.Unlock()
	return c.Conn.Close()
}

// SyscallConn is the socket's, for the hang-up watch (socketOf).
func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("gateway: the client connection has no socket")
	}
	return sc.SyscallConn()
}
