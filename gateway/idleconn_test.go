package gateway

import (
	"net"
	"testing"
	"time"
)

// deadlineConn counts read deadlines set on it; its reads succeed at once.
type deadlineConn struct {
	net.Conn
	set  int
	last time.Time
}

func (c *deadlineConn) SetReadDeadline(t time.Time) error { c.set++; c.last = t; return nil }
func (c *deadlineConn) Read(p []byte) (int, error)        { return len(p), nil }

// TestIdleConnMovesDeadlineRarely: back-to-back reads keep the deadline set
// by the first one (it would move by far less than idle/8); a new overall
// deadline from the HTTP client is applied at the next read, and caps it.
func TestIdleConnMovesDeadlineRarely(t *testing.T) {
	inner := &deadlineConn{}
	c := &idleConn{Conn: inner, idle: time.Hour}
	buf := make([]byte, 8)
	before := time.Now()
	for range 100 {
		if _, err := c.Read(buf); err != nil {
			t.Fatal(err)
		}
	}
	if inner.set != 1 {
		t.Fatalf("100 quick reads set the deadline %d times, want 1", inner.set)
	}
	if d := inner.last.Sub(before); d < time.Hour || d > time.Hour+time.Minute {
		t.Fatalf("deadline %v after the first read, want idle (1h)", d)
	}
	overall := time.Now().Add(time.Second)
	if err := c.SetReadDeadline(overall); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); err != nil {
		t.Fatal(err)
	}
	if inner.set != 2 || !inner.last.Equal(overall) {
		t.Fatalf("after SetReadDeadline: %d deadlines, last %v; want 2, the overall %v", inner.set, inner.last, overall)
	}
	// Clearing the overall deadline applies again at the next read; then a
	// deadline set idle/4 ago (as after a silence) is moved, quick reads after
	// it are not.
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	c.Read(buf)
	c.set = c.set.Add(-time.Hour / 4)
	c.Read(buf)
	c.Read(buf)
	if inner.set != 4 {
		t.Fatalf("%d deadlines set, want 4", inner.set)
	}
}
