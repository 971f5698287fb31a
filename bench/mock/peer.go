package mock

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// errClientLeft is returned by waits interrupted because the client closed its connection.
var errClientLeft = errors.New("mock vLLM: client closed the connection; request aborted")

// peerWatch notices when the client of a non-streaming request closes its connection
// while the request is generating, as vLLM does: its API server listens for the ASGI
// http.disconnect message during a request and aborts the generation when it comes.
// Nothing is read from the connection: the watcher peeks (MSG_PEEK) and stops at the
// first byte of a pipelined request, which uvicorn would buffer rather than take for
// a disconnect.
type peerWatch struct {
	conn   net.Conn
	left   chan struct{} // closed when the client closed or reset the connection
	exited chan struct{} // closed when the watcher returns
}

// watchPeer starts watching c, or returns nil when c has no socket to peek at (an
// in-memory connection) or the platform cannot peek.
func watchPeer(c net.Conn) *peerWatch {
	if !peekSupported {
		return nil
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	// fasthttp reads nothing during the handler; the watch may wait without deadline.
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		return nil
	}
	w := &peerWatch{conn: c, left: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(w.exited)
		if peerClosed(raw) {
			close(w.left)
		}
	}()
	return w
}

// leftCh returns a channel closed when the client leaves (nil for a nil watch: never).
func (w *peerWatch) leftCh() <-chan struct{} {
	if w == nil {
		return nil
	}
	return w.left
}

// stop ends the watch. The read deadline is left zero, as the mock's server (no
// ReadTimeout or IdleTimeout) keeps it.
func (w *peerWatch) stop() {
	if w == nil {
		return
	}
	_ = w.conn.SetReadDeadline(time.Unix(1, 0))
	<-w.exited
	_ = w.conn.SetReadDeadline(time.Time{})
}
