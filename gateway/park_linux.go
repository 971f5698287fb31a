//go:build linux

package gateway

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// parkSupported: streams can wait for their engine without a goroutine
// (an epoll set of the gateway's own).
const parkSupported = true

// parker holds the streams that wait for their engine's next bytes
// without a goroutine (see streamBody.park). Each waiting stream's engine
// socket is in the parker's epoll set, armed for one event (EPOLLONESHOT),
// under a key of its own. The parker's goroutine waits on the set in the
// runtime's poller (the set's descriptor is itself pollable) and queues
// each stream whose socket turned readable (or closed or failed) for a
// worker. A stream's deadline is a timer of its own (streamBody.parkTimer):
// whichever of the event and the timer removes the stream from waiting
// resumes it, once.
//
// A goroutine parked in the runtime's poller holds its stack (8 KiB for a
// stream, streamStack) and, through the garbage collector's pacing (GOGC
// counts stacks), as much heap headroom again: 16 KiB of memory for each
// open stream, most of whose life is spent waiting for the engine's next
// token. A parked stream holds only its streamBody.
type parker struct {
	epfd   int
	file   *os.File // epfd, in the runtime's poller
	mu     sync.Mutex
	next   uint64
	parked map[uint64]*streamBody
	events [128]syscall.EpollEvent // the waiting goroutine's only

	// Resumed streams queue for a few workers (their stacks grown once,
	// streamStack) rather than each getting a goroutine: a wave of
	// thousands of streams resumed together (an engine's decoding step
	// ends for its whole batch at once) would otherwise start thousands of
	// goroutines every step, each growing a stack. A worker blocked in a
	// write to a slow client does not count (blocked): another one starts
	// then, so slow clients cannot hold the others' streams back.
	qmu     sync.Mutex
	cond    sync.Cond     // idle workers wait on it (under qmu)
	queue   []*streamBody // resumed, not yet taken by a worker
	head    int           // queue[head:] are waiting
	running int           // workers not idle (under qmu)
	idle    int           // workers waiting on cond (under qmu)
	blocked atomic.Int32  // workers inside a write to a client
	queued  atomic.Int32  // len(queue) - head, read without qmu
}

// parkWorkers is how many workers run resumed streams at once, besides
// those blocked writing to clients; maxIdleWorkers how many wait for more
// work (8 KiB of stack each) before a worker ends.
var (
	parkWorkers    = 2 * runtime.GOMAXPROCS(0)
	maxIdleWorkers = 2 * runtime.GOMAXPROCS(0)
)

var (
	parkerOnce sync.Once
	theParker  *parker
	parkerErr  error
)

// streamParker returns the process's parker, started on first use; nil
// when it could not be (the error is logged once by the caller's server,
// streams then wait on their goroutine as before).
func streamParker() (*parker, error) {
	parkerOnce.Do(func() { theParker, parkerErr = newParker() })
	return theParker, parkerErr
}

func newParker() (*parker, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("stream parker: epoll_create1: %w (streams wait on their own goroutines)", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("stream parker: set the epoll descriptor non-blocking: %w (streams wait on their own goroutines)", err)
	}
	p := &parker{epfd: fd, file: os.NewFile(uintptr(fd), "rollgate-stream-parker"), parked: make(map[uint64]*streamBody)}
	p.cond.L = &p.qmu
	raw, err := p.file.SyscallConn()
	if err != nil {
		p.file.Close()
		return nil, fmt.Errorf("stream parker: %w (streams wait on their own goroutines)", err)
	}
	go p.run(raw)
	return p, nil
}

// run waits for the parked streams' sockets and resumes each stream whose
// socket has an event. It never returns: the parker lives as long as the
// process.
func (p *parker) run(raw syscall.RawConn) {
	for {
		var n int
		err := raw.Read(func(fd uintptr) bool {
			for {
				var err error
				n, err = syscall.EpollWait(int(fd), p.events[:], 0)
				if errors.Is(err, syscall.EINTR) {
					continue
				}
				return n > 0 || err != nil
			}
		})
		if err != nil {
			// Never expected (the descriptor is never closed): fail loudly
			// rather than leave streams waiting until their deadlines.
			panic(fmt.Sprintf("rollgate stream parker: waiting on its epoll set: %v", err))
		}
		for i := range n {
			ev := &p.events[i]
			key := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			if sb := p.take(key); sb != nil {
				p.dispatch(sb)
			}
		}
	}
}

// dispatch queues sb for a worker: an idle one is woken, or a new one
// started when fewer than parkWorkers run (not counting those blocked
// writing to clients).
func (p *parker) dispatch(sb *streamBody) {
	p.qmu.Lock()
	p.queue = append(p.queue, sb)
	p.queued.Add(1)
	start := false
	switch {
	case p.idle > 0:
		p.cond.Signal()
	case p.short():
		p.running++
		start = true
	}
	p.qmu.Unlock()
	if start {
		go p.worker()
	}
}

// worker resumes queued streams until none is left and maxIdleWorkers
// others wait already.
func (p *parker) worker() {
	growStack(0)
	p.qmu.Lock()
	for {
		for p.head == len(p.queue) {
			if p.idle >= maxIdleWorkers {
				p.running--
				p.qmu.Unlock()
				return
			}
			p.queue, p.head = p.queue[:0], 0
			p.running--
			p.idle++
			p.cond.Wait()
			p.idle--
			p.running++
		}
		sb := p.queue[p.head]
		p.queue[p.head] = nil
		p.head++
		p.queued.Add(-1)
		p.qmu.Unlock()
		sb.onWorker = true
		if sb.resume() {
			return // it serves a client connection now (retire)
		}
		p.qmu.Lock()
	}
}

// retire takes the calling worker out of the workers: it goes on to serve
// a client connection (runStream).
func (p *parker) retire() {
	p.qmu.Lock()
	p.running--
	p.startIfShort()
	p.qmu.Unlock()
}

// enterWrite notes that a worker is about to write to a client, which may
// block it (a slow client): with streams queued and no idle worker, another
// worker starts unless parkWorkers others run. leaveWrite ends it.
func (p *parker) enterWrite() {
	p.blocked.Add(1)
	if p.queued.Load() == 0 {
		return
	}
	p.qmu.Lock()
	p.startIfShort()
	p.qmu.Unlock()
}

// short reports whether fewer than parkWorkers workers run, not counting
// those blocked writing to clients (under qmu).
func (p *parker) short() bool { return p.running-int(p.blocked.Load()) < parkWorkers }

// startIfShort starts a worker when streams are queued, none waits idle and
// the workers are short (under qmu).
func (p *parker) startIfShort() {
	if p.head < len(p.queue) && p.idle == 0 && p.short() {
		p.running++
		go p.worker()
	}
}

func (p *parker) leaveWrite() { p.blocked.Add(-1) }

// writersBlocked is how many workers are inside a write to a client.
func (p *parker) writersBlocked() int { return int(p.blocked.Load()) }

// take removes the stream waiting under key and returns it (nil: none:
// its timer resumed it already).
func (p *parker) take(key uint64) *streamBody {
	p.mu.Lock()
	sb := p.parked[key]
	if sb != nil {
		delete(p.parked, key)
	}
	p.mu.Unlock()
	return sb
}

// park makes sb wait, without a goroutine, until raw (its engine's socket)
// is readable, closed or failed, or until due (zero: no deadline); then a
// worker runs sb.resume. With true, sb belongs to that worker from now on
// (it may be running already): the caller must not touch it.
// With false nothing was changed: the caller waits itself (as when due has
// passed already).
//
// The stream is registered under p.mu, which the event and timer paths
// take before resuming it: neither can resume it before its socket is
// armed, its timer set and its fields written.
func (p *parker) park(sb *streamBody, raw syscall.RawConn, due time.Time) bool {
	if !due.IsZero() && !time.Now().Before(due) {
		return false
	}
	if sb.parkTimer == nil {
		sb.parkTimer = time.AfterFunc(time.Hour, sb.parkExpired)
		sb.parkTimer.Stop()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	key := p.next
	sb.parkKey, sb.parkDue, sb.parkExpiredNow = key, due, false
	var cerr error
	err := raw.Control(func(fd uintptr) {
		ev := syscall.EpollEvent{
			Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT,
			Fd:     int32(uint32(key)),
			Pad:    int32(uint32(key >> 32)),
		}
		// A socket parked before stays in the set, disarmed: re-arm it.
		cerr = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_MOD, int(fd), &ev)
		if errors.Is(cerr, syscall.ENOENT) {
			cerr = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev)
		}
	})
	if err != nil || cerr != nil {
		return false // not armed: no event can name key
	}
	p.parked[key] = sb
	// The timer is moved only when it would fire after due: a stream's
	// deadline moves on with every token, and expire sets it again when it
	// fires before it (once per idle timeout rather than once per token).
	if !due.IsZero() && (sb.parkTimerAt.IsZero() || sb.parkTimerAt.After(due)) {
		sb.parkTimer.Reset(time.Until(due))
		sb.parkTimerAt = due
	}
	return true
}

// expire removes sb from waiting because its deadline passed, and reports
// whether it did (its timer's function). When sb is not waiting (its
// socket's event came first) the timer is noted as stopped; when its
// deadline has not passed (it moved on since the timer was set), the timer
// is set for it.
func (p *parker) expire(sb *streamBody) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := sb.parkKey
	if p.parked[key] != sb || sb.parkDue.IsZero() {
		sb.parkTimerAt = time.Time{}
		return false
	}
	if now := time.Now(); now.Before(sb.parkDue) {
		sb.parkTimer.Reset(sb.parkDue.Sub(now))
		sb.parkTimerAt = sb.parkDue
		return false
	}
	delete(p.parked, key)
	sb.parkExpiredNow, sb.parkTimerAt = true, time.Time{}
	return true
}

// stopTimer stops sb's timer (its stream ended).
func (p *parker) stopTimer(sb *streamBody) {
	if sb.parkTimer == nil {
		return
	}
	p.mu.Lock()
	sb.parkTimer.Stop()
	sb.parkTimerAt = time.Time{}
	p.mu.Unlock()
}
