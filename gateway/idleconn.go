package gateway

import (
	"net"
	"time"
)

// idleConn bounds how long a backend may stay silent: every Read gets a
// deadline of now+idle (capped by the overall deadline the HTTP client set),
// which gives a first-byte timeout and a between-chunk timeout for streams
// with one mechanism, without cutting long streams that keep flowing.
type idleConn struct {
	net.Conn
	idle    time.Duration
	overall time.Time // from the client's SetReadDeadline / SetDeadline
}

// SetReadDeadline records the caller's overall deadline.
func (c *idleConn) SetReadDeadline(t time.Time) error {
	c.overall = t
	return nil
}

// SetDeadline records the read deadline and passes the write deadline on.
func (c *idleConn) SetDeadline(t time.Time) error {
	c.overall = t
	return c.Conn.SetWriteDeadline(t)
}

// Read applies the idle deadline before reading.
func (c *idleConn) Read(p []byte) (int, error) {
	d := time.Now().Add(c.idle)
	if !c.overall.IsZero() && c.overall.Before(d) {
		d = c.overall
	}
	if err := c.Conn.SetReadDeadline(d); err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}
