//go:build linux

package gateway

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/netns"
)

// TestIdleConnTellsUnacknowledgedFromSilent: a backend that took the
// request and says nothing times out as before (the engine may be
// generating); a backend whose host was cut off after the connection was
// made — the request never acknowledged — gives errUnacknowledged, which
// the proxy retries elsewhere (TestUnreachedReplicaRetried).
func TestIdleConnTellsUnacknowledgedFromSilent(t *testing.T) {
	n := netns.New(t)
	h := n.Host("engine")
	ln, err := h.Listen("tcp", h.Addr(8001))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts and reads, never answers
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	raw, err := net.DialTimeout("tcp", h.Addr(8001), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	noted := 0
	c := &idleConn{Conn: raw, idle: 400 * time.Millisecond, unacked: func() { noted++ }}
	defer c.Close()
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 2\r\n\r\n{}")
	buf := make([]byte, 64)

	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("silent but reachable backend: Read gave %v, want a deadline timeout (not retried: the engine has the request)", err)
	}
	if noted != 0 {
		t.Fatalf("silent but reachable backend noted as unreached %d times", noted)
	}

	n.Cut(n.Root(), h)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(buf); !errors.Is(err, errUnacknowledged) {
		t.Fatalf("backend host cut off: Read gave %v, want errUnacknowledged", err)
	}
	if noted != 1 {
		t.Fatalf("backend host cut off: noted %d times, want 1", noted)
	}
	if !retryable(errUnacknowledged) || !staleConn(errUnacknowledged) {
		t.Fatal("errUnacknowledged must be retried and close the replica's other idle connections")
	}
	if st, typ := upstreamStatus(errUnacknowledged); st != 504 || typ != errTimeout {
		t.Fatalf("upstreamStatus(errUnacknowledged) = %d %s, want 504 %s", st, typ, errTimeout)
	}
}
