package seqstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// blackhole is a TCP proxy to PostgreSQL that can stop delivering bytes
// without closing anything: a silent network partition as both ends see
// it (what is sent is accepted and vanishes; nothing comes back).
type blackhole struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
}

func newBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		b.mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			b.mu.Lock()
			b.conns = append(b.conns, c, u)
			b.mu.Unlock()
			go b.pipe(u, c)
			go b.pipe(c, u)
		}
	}()
	return b
}

// pipe copies src to dst, dropping what it reads while cut.
func (b *blackhole) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !b.cut.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			dst.Close()
			return
		}
	}
}

// TestSilentPartitionBoundedByLease (PostgreSQL): cut silently from the
// database (no reset, nothing answers), a store drops every attempt within
// SessionLease/2 of its session's last answer and refuses reservations at
// once (counted), instead of waiting for the kernel (minutes); once the
// link is back it reserves again, above.
func TestSilentPartitionBoundedByLease(t *testing.T) {
	dsn, err := testenv.FreshPostgresDatabase(postgresDSN, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	host := dsn[strings.Index(dsn, "@")+1:]
	host = host[:strings.IndexByte(host, '/')]
	bh := newBlackhole(t, host)
	const lease = 2 * time.Second
	s := open(t, strings.Replace(dsn, host, bh.ln.Addr().String(), 1), Options{SessionLease: lease}).(*Postgres)
	dropped := make(chan time.Time, 4)
	s.OnTakeover(func(r, a string) {
		if r == "" && a == "" {
			dropped <- time.Now()
		}
	})
	first := reserve(t, s, "r", "a")

	cutAt := time.Now()
	bh.cut.Store(true)
	select {
	case at := <-dropped:
		if d := at.Sub(cutAt); d > lease/2+250*time.Millisecond {
			t.Fatalf("every attempt dropped %s after the cut, want at most %s (SessionLease/2) and scheduling slack", d, lease/2)
		}
	case <-time.After(lease + 5*time.Second):
		t.Fatalf("no attempt dropped %s after a silent cut (SessionLease %s): the gateway would keep handing out ids", time.Since(cutAt), lease)
	}
	start := time.Now()
	if _, err := s.Reserve(context.Background(), "r", "a"); !errors.Is(err, errNotListening) {
		t.Fatalf("Reserve while cut off: %v, want %v", err, errNotListening)
	}
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Fatalf("Reserve while cut off took %s: it must refuse at once", d)
	}
	if n := testutil.ToFloat64(s.m.sessionLost.WithLabelValues("lease")); n != 1 {
		t.Fatalf("session lost on the lease %v times, want 1", n)
	}
	if n := testutil.ToFloat64(s.m.refused); n < 1 {
		t.Fatalf("%v refusals counted, want at least 1", n)
	}

	bh.cut.Store(false) // the stalled connections stay dead; new ones go through
	var b Block
	testenv.WaitFor(t, 4*lease+10*time.Second, func() string { return "a reservation after the link healed: " + err.Error() }, func() bool {
		b, err = s.Reserve(context.Background(), "r", "a")
		return err == nil
	})
	if b.First <= first.Last {
		t.Fatalf("block %+v after %+v", b, first)
	}
}

// TestKernelTimeoutIsALeaseLapse: a listening session the kernel ended
// because its keepalive probes went unanswered (ETIMEDOUT, as a read on a
// cut link returns it) lapsed like one whose heartbeat went unanswered, so
// it is counted under cause "lease" (the partition alert's series); a reset
// or a deadline of the gateway's own is not.
func TestKernelTimeoutIsALeaseLapse(t *testing.T) {
	read := func(errno error) error {
		return fmt.Errorf("pgconn: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", errno)})
	}
	if err := unanswered(read(syscall.ETIMEDOUT)); !errors.Is(err, errLeaseLost) || !errors.Is(err, syscall.ETIMEDOUT) {
		t.Errorf("ETIMEDOUT read: %v, want errLeaseLost wrapping the cause", err)
	}
	for _, err := range []error{read(syscall.ECONNRESET), os.ErrDeadlineExceeded, io.EOF} {
		if got := unanswered(err); errors.Is(got, errLeaseLost) || got != err {
			t.Errorf("%v: got %v, want it unchanged", err, got)
		}
	}
}
