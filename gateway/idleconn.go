package gateway

import (
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// idleConn bounds how long a backend may stay silent: every Read gets a
// deadline of now+idle (capped by the overall deadline the HTTP client set),
// which gives a first-byte timeout and a between-chunk timeout for streams
// with one mechanism, without cutting long streams that keep flowing.
//
// Moving a deadline costs a runtime timer update, and a stream reads once
// per token: the deadline is moved only when it would move by more than
// idle/8, so a backend is cut after between 7/8 of idle and idle of silence.
//
// A first-byte timeout is not retried as a rule (the engine may still be
// generating), except when the request itself was never acknowledged by
// the replica's host (see unacknowledged): then Read returns
// errUnacknowledged, which is not a timeout, and fasthttp hands the call
// back as a connection that closed before the first response byte — which
// the proxy retries on another replica, as it does a failed dial. This is
// what a replica whose host is cut off looks like on a pooled keep-alive
// connection: the dial is skipped, the request goes into the socket
// buffer, and nothing comes back.
type idleConn struct {
	net.Conn
	idle    time.Duration
	overall time.Time // from the client's SetReadDeadline / SetDeadline
	set     time.Time // the read deadline last set on Conn; zero: set it next Read
	// awaiting: bytes were written since the last byte read, i.e. the
	// answer to a request is awaited and none of it came yet.
	awaiting atomic.Bool
	// unacked is called when Read returns errUnacknowledged (nil: nothing).
	unacked func()
	raw     syscall.RawConn // Conn's, for waitReadable (set by canWait)
	// expired: the stream reading it waited parked (parker) past its
	// deadline; the next waitReadable fails as a read past it would.
	expired bool
	// readable: the stream reading it was resumed by its socket's event
	// (parker): a read returns at once (bytes, the end, or the error), so
	// the next waitReadable does not look first.
	readable bool
}

// errUnacknowledged is what Read returns when the first byte of an answer
// is overdue and the replica's host has not even acknowledged the request.
var errUnacknowledged = errors.New("the replica's host did not acknowledge the request within idle_timeout (host down or cut off); no response byte came")

// SetReadDeadline records the caller's overall deadline.
func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.overall, c.set = t, time.Time{}
	return nil
}

// SetDeadline records the read deadline and passes the write deadline on.
func (c *idleConn) SetDeadline(t time.Time) error {
	c.overall, c.set = t, time.Time{}
	return c.Conn.SetWriteDeadline(t)
}

// Write marks the answer as awaited. A readiness noted for the previous
// answer (readable) says nothing about this one.
func (c *idleConn) Write(p []byte) (int, error) {
	if !c.awaiting.Load() {
		c.awaiting.Store(true)
	}
	c.readable = false
	return c.Conn.Write(p)
}

// Read applies the idle deadline before reading.
func (c *idleConn) Read(p []byte) (int, error) {
	if err := c.moveDeadline(); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if c.awaiting.Load() {
			c.awaiting.Store(false)
		}
	} else if err != nil {
		err = c.readError(err)
	}
	return n, err
}

// moveDeadline sets the read deadline of the next read (see idleConn).
func (c *idleConn) moveDeadline() error {
	d := time.Now().Add(c.idle)
	if !c.overall.IsZero() && c.overall.Before(d) {
		d = c.overall
	}
	if c.set.IsZero() || d.Before(c.set) || d.Sub(c.set) > c.idle/8 {
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return err
		}
		c.set = d
	}
	return nil
}

// readError is what a read that failed with err returns: errUnacknowledged
// when an awaited answer's first byte is overdue and the request was never
// acknowledged (see idleConn).
func (c *idleConn) readError(err error) error {
	if c.awaiting.Load() && errors.Is(err, os.ErrDeadlineExceeded) && unacknowledged(c.Conn) {
		if c.unacked != nil {
			c.unacked()
		}
		return errUnacknowledged
	}
	return err
}

// canWait reports whether waitReadable can wait on this connection: a
// socket, on a platform with a non-blocking MSG_PEEK.
func (c *idleConn) canWait() bool {
	if !peekSupported {
		return false
	}
	if c.raw == nil {
		sc, ok := c.Conn.(syscall.Conn)
		if !ok {
			return false
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return false
		}
		c.raw = raw
	}
	return true
}

// waitReadable waits, under the deadline Read would set and reading
// nothing, until the backend's next bytes are in or it closed or reset the
// connection; the next Read then returns without waiting (engineStream
// waits so, without a read buffer). Only after canWait reported true.
func (c *idleConn) waitReadable() error {
	if c.expired {
		c.expired = false
		return c.readError(&net.OpError{Op: "read", Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.ErrDeadlineExceeded})
	}
	if err := c.moveDeadline(); err != nil {
		return err
	}
	if c.readable {
		c.readable = false
		return nil
	}
	if err := waitReadable(c.raw); err != nil {
		return c.readError(err)
	}
	return nil
}

// parkDue is the deadline a wait for the backend's next bytes starting
// now has: the one moveDeadline would set.
func (c *idleConn) parkDue() time.Time {
	d := time.Now().Add(c.idle)
	if !c.overall.IsZero() && c.overall.Before(d) {
		d = c.overall
	}
	return d
}

// unreachedHosts remembers when each backend host last left a request
// unacknowledged (errUnacknowledged). fasthttp reports that call as a
// connection closed before the first response byte (it keeps no error of
// the first read but a timeout); the proxy looks here to name the real
// cause in the call's error and status. The zero value is ready to use.
type unreachedHosts struct {
	m sync.Map // host -> *atomic.Int64: unix nanoseconds of the last one
}

// note records that host left a request unacknowledged now.
func (u *unreachedHosts) note(host string) {
	v, ok := u.m.Load(host)
	if !ok {
		v, _ = u.m.LoadOrStore(host, new(atomic.Int64))
	}
	v.(*atomic.Int64).Store(time.Now().UnixNano())
}

// since reports whether host left a request unacknowledged after t.
func (u *unreachedHosts) since(host string, t time.Time) bool {
	v, ok := u.m.Load(host)
	return ok && v.(*atomic.Int64).Load() > t.UnixNano()
}

// hostOf is addr without its port.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
