package gateway

import (
	"net"
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
type idleConn struct {
	net.Conn
	idle    time.Duration
	overall time.Time // from the client's SetReadDeadline / SetDeadline
	set     time.Time // the read deadline last set on Conn; zero: set it next Read
}

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

// Read applies the idle deadline before reading.
func (c *idleConn) Read(p []byte) (int, error) {
	d := time.Now().Add(c.idle)
	if !c.overall.IsZero() && c.overall.Before(d) {
		d = c.overall
	}
	if c.set.IsZero() || d.Before(c.set) || d.Sub(c.set) > c.idle/8 {
		if err := c.Conn.SetReadDeadline(d); err != nil {
			return 0, err
		}
		c.set = d
	}
	return c.Conn.Read(p)
}
