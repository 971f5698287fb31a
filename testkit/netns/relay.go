//go:build linux

package netns

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// inNS runs f with the calling goroutine's thread in h's network namespace,
// so the sockets f makes belong to h (a socket keeps its namespace for its
// life, whatever thread uses it later), then puts the thread back in its
// own namespace. A thread that cannot be put back is never handed back to
// the runtime (its goroutine exits still locked). On Root, f runs as is.
//
// Putting it back matters beyond tidiness: the goroutine may run on the
// process's main thread, which the runtime does not end, and whose
// namespace is the one ip netns pids reports for the whole process (Close
// would then kill the test process as one of the host's).
func (h *Host) inNS(f func() error) error {
	if h.NS == "" {
		return f()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("netns: opening the thread's own namespace: %w", err)
			return
		}
		defer home.Close()
		target, err := os.Open(filepath.Join("/var/run/netns", h.NS))
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("netns: opening host %s's namespace: %w", h.Name, err)
			return
		}
		err = unix.Setns(int(target.Fd()), unix.CLONE_NEWNET)
		target.Close()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("netns: entering host %s's namespace: %w", h.Name, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("netns: leaving host %s's namespace: %w", h.Name, err))
			return // still locked: the thread is not reused
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Listen is net.Listen in the host's namespace.
func (h *Host) Listen(network, addr string) (ln net.Listener, err error) {
	err = h.inNS(func() error { ln, err = net.Listen(network, addr); return err })
	return ln, err
}

// ListenPacket is net.ListenPacket in the host's namespace.
func (h *Host) ListenPacket(network, addr string) (pc net.PacketConn, err error) {
	err = h.inNS(func() error { pc, err = net.ListenPacket(network, addr); return err })
	return pc, err
}

// Dial is net.DialTimeout from the host's namespace.
func (h *Host) Dial(network, addr string, timeout time.Duration) (c net.Conn, err error) {
	err = h.inNS(func() error { c, err = net.DialTimeout(network, addr, timeout); return err })
	return c, err
}

// Relay is a TCP relay on a host that delays what it forwards: the
// userspace stand-in for tc netem's delay, which the test kernels lack
// (their kernel has no sch_netem). It runs in the test process, its sockets
// in the host's namespace, so the links to and from its host can be cut or
// made lossy like any other.
//
// The delay is per chunk, not per packet: each read from one side (up to
// 32 KiB, whatever TCP had received) is written to the other side the delay
// after it was read, in order, reads continuing meanwhile (a pipeline, so
// the delay does not cap throughput). A request and its answer crossing the
// relay thus take twice the delay more. Unlike netem, the two TCP
// connections it joins each see the short RTT of their own hop, so a
// packet lost on a hop is resent after the kernel's minimum RTO (200 ms),
// not after an RTO computed from the delayed round trip; and TCP's own
// acknowledgements are not delayed.
type Relay struct {
	// Addr is host:port the relay listens on.
	Addr string

	h      *Host
	target string
	ln     net.Listener
	delay  atomic.Int64 // time.Duration
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// relayChunk is the largest read a relay forwards as one chunk, and
// relayQueue how many chunks may wait per direction: a connection holds at
// most 2 × relayQueue × relayChunk bytes (the reader blocks beyond that).
const (
	relayChunk = 32 << 10
	relayQueue = 64
)

// Relay starts a relay on h:port forwarding every connection to target
// (dialled from h), delaying each chunk by delay each way (SetDelay
// changes it); port 0 picks a free one (Relay.Addr). It stops at the
// test's end (Close).
func (n *Net) Relay(h *Host, port int, target string, delay time.Duration) *Relay {
	n.t.Helper()
	r := &Relay{Addr: h.Addr(port), h: h, target: target, conns: map[net.Conn]struct{}{}}
	r.delay.Store(int64(delay))
	ln, err := h.Listen("tcp", r.Addr)
	if err != nil {
		n.t.Fatalf("netns: relay on %s: %v", r.Addr, err)
	}
	r.ln, r.Addr = ln, ln.Addr().String() // port 0: the one the kernel chose
	n.t.Cleanup(r.Close)
	r.wg.Add(1)
	go r.accept()
	return r
}

// SetDelay changes the delay of chunks read from now on (each way).
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(d)) }

// Close stops the relay and ends every connection through it.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}

// track registers c to be closed by Close; false when closed already.
func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		if !r.track(in) {
			in.Close()
			return
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer r.untrack(in)
			out, err := r.h.Dial("tcp", r.target, 5*time.Second)
			if err != nil {
				return // the client sees its connection closed, as when the target refuses
			}
			if !r.track(out) {
				out.Close()
				return
			}
			defer r.untrack(out)
			var both sync.WaitGroup
			both.Add(2)
			go func() { defer both.Done(); r.pipe(out, in) }()
			go func() { defer both.Done(); r.pipe(in, out) }()
			both.Wait()
		}()
	}
}

// pipe copies src to dst, each chunk written the delay after it was read.
// At src's end it closes dst's write side; on a write error it closes both
// (the other direction then ends too).
func (r *Relay) pipe(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	q := make(chan chunk, relayQueue)
	go func() {
		defer close(q)
		buf := make([]byte, relayChunk)
		for {
			k, err := src.Read(buf)
			if k > 0 {
				q <- chunk{append([]byte(nil), buf[:k]...), time.Now().Add(time.Duration(r.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	failed := false
	for c := range q {
		if failed {
			continue // drain until the reader sees the closed connection
		}
		if wait := time.Until(c.due); wait > 0 {
			time.Sleep(wait) // the chunk's delay: what the relay is for
		}
		if _, err := dst.Write(c.b); err != nil {
			failed = true
			dst.Close()
			src.Close()
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok && !failed {
		_ = tc.CloseWrite()
	}
}
