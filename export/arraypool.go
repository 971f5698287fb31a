package export

import (
	"math"
	"sync"
)

// ArrayPool keeps blocks of memory that held the id and logprob arrays of
// calls a bulk read returned (ReadOptions.Arrays), once their reader holds
// none of those arrays any more, for the next reads to decode into instead
// of allocating: a reader that decodes arrays in blocks (ClickHouse's
// native reader) takes its blocks from the pool. Safe for concurrent use.
type ArrayPool struct {
	// Poison, for tests, fills each block given back with a pattern no
	// capture holds (0xFFFFFFFF ids, NaN logprobs with that payload), so
	// that a reader of released memory reads garbage rather than the data
	// it expected or a later read's.
	Poison bool

	mu  sync.Mutex
	u32 [][]uint32
	f32 [][]float32
}

// maxPooled bounds the blocks of each type a pool keeps (the largest); the
// others are left to the garbage collector. A bulk read's first block of
// each column is new memory (the reader has no column before it), so a
// pool gains a block per column per read: without a bound it would grow to
// hold more than the reads in flight need.
const maxPooled = 6

// Lease starts recording the blocks of one bulk read.
func (p *ArrayPool) Lease() *ArrayLease { return &ArrayLease{pool: p} }

// ArrayLease is the memory of one bulk read's arrays: every array of the
// calls it returned lies in a block the lease records, and in no block of
// another lease. A nil lease records nothing and hands out no memory.
type ArrayLease struct {
	pool *ArrayPool
	u32  [][]uint32
	f32  [][]float32
}

// Uint32s returns a block for a reader to append an Array(UInt32) column's
// elements to: empty, with the capacity of a pooled block (the smallest of
// at least want elements, else the largest), or nil. The reader records
// what it filled with KeepUint32s.
func (l *ArrayLease) Uint32s(want int) []uint32 {
	return lend(l, func(p *ArrayPool) *[][]uint32 { return &p.u32 }, want)
}

// Float32s is Uint32s for an Array(Float32) column.
func (l *ArrayLease) Float32s(want int) []float32 {
	return lend(l, func(p *ArrayPool) *[][]float32 { return &p.f32 }, want)
}

// lend takes a block from the free list of l's pool that free picks.
func lend[T any](l *ArrayLease, free func(*ArrayPool) *[][]T, want int) []T {
	if l == nil || l.pool == nil {
		return nil
	}
	l.pool.mu.Lock()
	defer l.pool.mu.Unlock()
	return take(free(l.pool), want)
}

// KeepUint32s records a block whose elements the read's calls refer to.
func (l *ArrayLease) KeepUint32s(b []uint32) {
	if l != nil && cap(b) > 0 {
		l.u32 = append(l.u32, b)
	}
}

// KeepFloat32s is KeepUint32s for an Array(Float32) column.
func (l *ArrayLease) KeepFloat32s(b []float32) {
	if l != nil && cap(b) > 0 {
		l.f32 = append(l.f32, b)
	}
}

// Release gives the lease's blocks back to its pool, for later reads to
// overwrite. The caller promises that nothing refers to the arrays of the
// calls the read returned any more: no call, sample, emitted row or
// writer's buffer. Releasing twice is releasing once.
func (l *ArrayLease) Release() {
	if l == nil || l.pool == nil {
		return
	}
	p := l.pool
	if p.Poison {
		for _, b := range l.u32 {
			b = b[:cap(b)]
			for i := range b {
				b[i] = math.MaxUint32
			}
		}
		for _, b := range l.f32 {
			b = b[:cap(b)]
			for i := range b {
				b[i] = math.Float32frombits(math.MaxUint32)
			}
		}
	}
	p.mu.Lock()
	for _, b := range l.u32 {
		give(&p.u32, b[:0])
	}
	for _, b := range l.f32 {
		give(&p.f32, b[:0])
	}
	p.mu.Unlock()
	l.u32, l.f32 = nil, nil
}

// give adds b to free, or, when free holds maxPooled blocks, puts it in
// the place of the smallest if it is larger.
func give[T any](free *[][]T, b []T) {
	if len(*free) < maxPooled {
		*free = append(*free, b)
		return
	}
	small := 0
	for i, f := range *free {
		if cap(f) < cap((*free)[small]) {
			small = i
		}
	}
	if cap(b) > cap((*free)[small]) {
		(*free)[small] = b
	}
}

// take removes from free the smallest block of at least want elements, else
// the largest, and returns it (nil when free is empty).
func take[T any](free *[][]T, want int) []T {
	better := func(b, than []T) bool {
		if fits := cap(b) >= want; fits != (cap(than) >= want) {
			return fits
		} else if fits {
			return cap(b) < cap(than)
		}
		return cap(b) > cap(than)
	}
	best := -1
	for i, b := range *free {
		if best < 0 || better(b, (*free)[best]) {
			best = i
		}
	}
	if best < 0 {
		return nil
	}
	b := (*free)[best]
	last := len(*free) - 1
	(*free)[best], (*free)[last] = (*free)[last], nil
	*free = (*free)[:last]
	return b
}
