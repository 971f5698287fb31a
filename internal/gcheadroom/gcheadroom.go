// Package gcheadroom bounds the garbage collector's headroom: how far the
// heap may grow past what the last collection found live before the next
// collection starts.
//
// Go's default pacing (GOGC=100) lets the heap grow by as much again as it
// holds live (stacks and globals included), so the resident set follows
// about twice the live heap. For a gateway whose live heap grows with the
// streams it holds open, that doubles the memory each stream costs. With a
// headroom H, after every collection the GC percent is set to
//
//	min(base, max(Floor, 100 × H / (live heap + stacks + globals)))
//
// where base is the GC percent in force when Start ran (GOGC, default 100):
// a small heap is paced as before, a large one grows by about H (more GC
// cycles, each marking the same live heap), and never by less than Floor %
// of it, so a live heap above 4H does not make the collector run
// back-to-back. Go's soft memory limit (GOMEMLIMIT, debug.SetMemoryLimit)
// still applies on top.
package gcheadroom

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Floor is the lowest GC percent Percent returns.
const Floor = 25

// Percent is the GC percent that lets a heap with scannable memory
// (live heap + goroutine stacks + globals, as the runtime counts them) grow
// by about headroom bytes before the next collection: never above base,
// never below Floor (unless base is lower). base < 0 (collection off) and
// headroom 0 return base.
func Percent(scannable, headroom uint64, base int) int {
	if base < 0 || headroom == 0 {
		return base
	}
	if scannable == 0 {
		return base
	}
	p := float64(headroom) * 100 / float64(scannable)
	if p >= float64(base) {
		return base
	}
	if p < Floor {
		return min(base, Floor)
	}
	return int(math.Floor(p))
}

// sample names what the runtime reports after each collection.
var sample = []metrics.Sample{
	{Name: "/gc/heap/live:bytes"},
	{Name: "/gc/scan/stack:bytes"},
	{Name: "/gc/scan/globals:bytes"},
}

// scannable reads the live heap, stacks and globals of the last collection.
func scannable() uint64 {
	s := make([]metrics.Sample, len(sample))
	copy(s, sample)
	metrics.Read(s)
	var n uint64
	for _, v := range s {
		if v.Value.Kind() == metrics.KindUint64 {
			n += v.Value.Uint64()
		}
	}
	return n
}

// gcPercent is the GC percent in force (GOGC, or debug.SetGCPercent's).
func gcPercent() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// Pacer keeps the GC percent at Percent after every collection, until Stop.
// The percent is the process's: while several Pacers run (tests start
// several gateways in one process), the smallest headroom among them
// applies, and the last one stopped restores the percent the first one
// found.
type Pacer struct {
	headroom uint64
	stopped  atomic.Bool
	changes  atomic.Int64
}

// pacing is the process's GC percent under the running Pacers.
var pacing struct {
	mu      sync.Mutex
	running map[*Pacer]struct{}
	base    int // the percent in force when the first of them started (GOGC)
	current int // what they set last
}

// sentinel is garbage the collector finds at every cycle: its finalizer
// runs once per collection, adjusts the percent and sets itself again.
type sentinel struct {
	p   *Pacer
	pad [2]uintptr // not a tiny allocation: finalizers need an object of its own
}

// Start paces the GC with headroom bytes (see the package doc) from the
// next collection on. headroom 0 returns a Pacer that does nothing. The GC
// percent in force when no Pacer runs (GOGC) is the most it sets, and the
// last Pacer stopped restores it.
func Start(headroom uint64) *Pacer {
	p := &Pacer{headroom: headroom}
	if headroom == 0 {
		p.stopped.Store(true)
		return p
	}
	pacing.mu.Lock()
	if len(pacing.running) == 0 {
		pacing.running = map[*Pacer]struct{}{}
		pacing.base = gcPercent()
		pacing.current = pacing.base
	}
	pacing.running[p] = struct{}{}
	off := pacing.base < 0
	pacing.mu.Unlock()
	if !off {
		p.arm(&sentinel{p: p})
	}
	return p
}

// arm sets s's finalizer: the collection that finds s unreachable queues it.
func (p *Pacer) arm(s *sentinel) {
	runtime.SetFinalizer(s, func(s *sentinel) {
		if s.p.stopped.Load() {
			return
		}
		s.p.adjust()
		s.p.arm(s)
	})
}

// adjust sets the GC percent for the heap the last collection left, under
// the smallest headroom of the running Pacers.
func (p *Pacer) adjust() {
	pacing.mu.Lock()
	defer pacing.mu.Unlock()
	if p.stopped.Load() {
		return
	}
	h := p.headroom
	for q := range pacing.running {
		h = min(h, q.headroom)
	}
	want := Percent(scannable(), h, pacing.base)
	if want != pacing.current {
		debug.SetGCPercent(want)
		pacing.current = want
		p.changes.Add(1)
	}
}

// GCPercent is the percent the running Pacers set last (GOGC until they
// changed it, or when none runs).
func GCPercent() int {
	pacing.mu.Lock()
	defer pacing.mu.Unlock()
	if len(pacing.running) == 0 {
		return gcPercent()
	}
	return pacing.current
}

// Changes counts how often this Pacer changed the GC percent.
func (p *Pacer) Changes() int64 { return p.changes.Load() }

// Stop stops this Pacer; the last one running restores the percent the
// first one found.
func (p *Pacer) Stop() {
	pacing.mu.Lock()
	defer pacing.mu.Unlock()
	if p.stopped.Swap(true) {
		return
	}
	delete(pacing.running, p)
	if len(pacing.running) == 0 && pacing.current != pacing.base {
		debug.SetGCPercent(pacing.base)
		pacing.current = pacing.base
	}
}
