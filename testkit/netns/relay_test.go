//go:build linux

package netns

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestLossDropsAboutThePercentage: Loss(a, b, P) drops about P % of the
// packets from b to a (UDP datagrams counted at a's socket, whose buffer
// holds every one of them), and none without it. The bounds are ten
// standard deviations of a binomial count wide: they never flake, but 0 %
// and 100 % fail them.
func TestLossDropsAboutThePercentage(t *testing.T) {
	n := New(t)
	a, b := n.Host("a"), n.Host("b")
	pc, err := a.ListenPacket("udp4", a.Addr(9000))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	raw, err := pc.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	}); err != nil || serr != nil {
		t.Fatalf("growing the receive buffer: %v %v", err, serr)
	}
	out, err := b.Dial("udp4", a.Addr(9000), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()

	const sent = 3000
	// through sends the datagrams of phase and counts those a receives:
	// all of them are in a's buffer once the last send returns (the veth
	// and the bridge deliver within the send), so a read that waits a
	// second more ends the count.
	through := func(phase byte) int {
		msg := make([]byte, 5)
		msg[0] = phase
		for i := range sent {
			binary.BigEndian.PutUint32(msg[1:], uint32(i))
			if _, err := out.Write(msg); err != nil {
				t.Fatal(err)
			}
		}
		got := 0
		buf := make([]byte, 64)
		for {
			pc.SetReadDeadline(time.Now().Add(time.Second))
			k, _, err := pc.ReadFrom(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return got
			}
			if err != nil {
				t.Fatal(err)
			}
			if k == 5 && buf[0] == phase {
				got++
			}
		}
	}
	if got := through(0); got != sent {
		t.Fatalf("without loss %d of %d datagrams arrived: want all (the count itself loses some)", got, sent)
	}
	for _, c := range []struct {
		pct    int
		lo, hi int // mean ± 10 σ of Binomial(sent, 1 - pct/100)
	}{
		{30, 1850, 2350},
		{5, 2730, 2970},
	} {
		n.Loss(a, b, c.pct)
		got := through(byte(c.pct))
		t.Logf("loss %d %%: %d of %d datagrams arrived (%.1f %% lost)", c.pct, got, sent, 100*float64(sent-got)/sent)
		if got < c.lo || got > c.hi {
			t.Errorf("loss %d %%: %d of %d datagrams arrived, want %d..%d", c.pct, got, sent, c.lo, c.hi)
		}
	}
	n.Heal(a, b)
	if got := through(1); got != sent {
		t.Fatalf("after healing %d of %d datagrams arrived: want all", got, sent)
	}
}

// TestRelayAddsLatency: a round trip through a relay of delay d takes at
// least 2d more (a lower bound only: the machine may be slower, never
// faster), what crosses it arrives whole and in order, and SetDelay
// changes the delay of what follows. The relay's host is a host like any
// other: a cut between it and the client stalls the relayed connection.
func TestRelayAddsLatency(t *testing.T) {
	n := New(t)
	a, r := n.Host("a"), n.Host("relay")
	addr := echoOn(t, a, 7000)
	const delay = 100 * time.Millisecond
	relay := n.Relay(r, 7100, addr, delay)

	rtt := func(c net.Conn, payload []byte) time.Duration {
		t.Helper()
		start := time.Now()
		errc := make(chan error, 1)
		go func() { _, err := c.Write(payload); errc <- err }()
		got := make([]byte, len(payload))
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("reading the echo: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, payload) {
			t.Fatalf("the echo of %d bytes differs from what was sent", len(payload))
		}
		return time.Since(start)
	}
	direct, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	c, err := net.DialTimeout("tcp", relay.Addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	small := []byte("ping\n")
	d0 := rtt(direct, small)
	d1 := rtt(c, small)
	t.Logf("round trip: direct %s, through the relay (%s each way) %s", d0, delay, d1)
	if d1 < 2*delay {
		t.Errorf("a round trip through the relay took %s, want at least %s (the delay each way)", d1, 2*delay)
	}

	big := make([]byte, 4<<20) // many chunks, more than the relay's queue holds
	rand.Read(big)
	t.Logf("4 MiB echoed through the relay in %s", rtt(c, big))

	relay.SetDelay(300 * time.Millisecond)
	if d := rtt(c, small); d < 600*time.Millisecond {
		t.Errorf("after SetDelay(300ms) a round trip took %s, want at least 600ms", d)
	}
	relay.SetDelay(0)
	t.Logf("after SetDelay(0): %s", rtt(c, small))

	n.Cut(n.Root(), r)
	if _, err := c.Write(small); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	var ne net.Error
	if _, err := c.Read(make([]byte, 8)); err == nil || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("through a cut relay host: %v; want a read timeout", err)
	}
	n.Heal(n.Root(), r)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, len(small))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("after healing: %q %v", got, err)
	}

	relay.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if k, err := c.Read(make([]byte, 8)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection through a closed relay read %d bytes, %v: want it ended", k, err)
	}
}
