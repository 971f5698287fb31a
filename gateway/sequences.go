package gateway

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollgate/rollgate/gateway/seqstore"
)

const (
	// defaultMaxTrackedAttempts is the default of Config.MaxTrackedAttempts.
	defaultMaxTrackedAttempts = 1 << 16
	// defaultMaxTrackedAttemptBytes is the default of Config.MaxTrackedAttemptBytes.
	defaultMaxTrackedAttemptBytes = 32 << 20

	// seqEntryOverhead bounds what an entry costs on the heap besides its
	// key string and its block: the seqEntry (104 bytes), its slots in the key
	// map and the rollout index (25 bytes each, at a load of 7/16 to 7/8:
	// at most 57 bytes each) and some fragmentation (measured by
	// TestSequenceEntryOverhead, with one rollout per entry, the worst case).
	seqEntryOverhead = 256
	// seqBlockOverhead is what an entry's block costs: the seqBlock and
	// seqReserve (16 + 32 bytes) and the fragmentation of the spans it
	// shares with what its reservation allocated for a while (measured by
	// TestSequenceEntryOverhead).
	seqBlockOverhead = 160
	// seqRetryOverhead is what an entry's memory of its recent calls
	// (retryMemo: retryRecent hashes, sequence ids and span ids, 208
	// bytes) adds to the entry (it takes seqEntry from the 112-byte to the
	// 320-byte size class).
	seqRetryOverhead = 224
	// evictDivisor: an eviction removes at least 1/evictDivisor of the entries.
	evictDivisor = 8
	// defaultSequenceStoreTimeout is the default of Config.SequenceStoreTimeout.
	defaultSequenceStoreTimeout = 5 * time.Second
	// seqKeyBuf is the stack buffer of a key: two ids of at most 128 bytes
	// and the separator fit (longer ids work, at the cost of an allocation).
	seqKeyBuf = 2*128 + 1
)

// sequences allocates per-(rollout, attempt) sequence ids: strictly
// increasing per attempt, never reused, independent of clocks. Ids come from
// blocks a store reserves in the database (package seqstore; setStore, before
// the first call), so they also survive restarts and replicas (see
// seqstore.Postgres for the exact guarantee across gateways). An entry
// holds its attempt's current block: a call takes the block's next id under
// the read lock (a lookup and an atomic increment: no I/O), and the call
// that finds no entry or an exhausted block reserves the next block (under
// the entry's mutex, with storeTimeout; an error is returned, never an id
// outside a reserved block). Its entries also hold the rollout and attempt
// ids as strings, so a call of a known attempt costs no allocation.
//
// The table is bounded. It holds at most maxEntries entries (attempts) and
// at most maxBytes bytes of them, an entry counting its key (rollout id, NUL,
// attempt id, rounded up to 32 bytes; the entry's rollout and attempt
// strings share the key's bytes) plus seqEntryOverhead, seqBlockOverhead
// and seqRetryOverhead (the last retryRecent calls' hashes, for retries); a single entry larger than maxBytes is still admitted
// alone. Inserting past a bound evicts the least recently used entries, at
// least 1/8 of them at once, so that eviction's cost, a pass over the table
// under the write lock (a few milliseconds at 65,536 entries), is amortised
// over many insertions. Recency is a logical clock, the number of insertions
// so far, stored on an entry when it is used and the clock has moved since.
// An evicted or dropped (taken over by another gateway) entry leaves
// nothing behind: the attempt reserves a new block, above every earlier
// one, at its next call. (Rounding keys up to 32 bytes matches Go's
// allocation size classes for keys up to 512 bytes: ids of up to 128 bytes
// are well within.)
//
// Memory is bounded by 1.5 × maxBytes + 1 MiB (49 MiB with the defaults):
// what the table counts, and the heap's fragmentation under churn (evicted
// entries leave holes in spans that younger entries and the reservations'
// short-lived allocations still use), and the maps' and eviction's fixed
// costs: TestSequenceHeapBound measured 1.16 × maxBytes with the defaults
// and up to 1.45 × with bounds of a few MiB, with 128-byte ids.
//
// An id is taken under the read lock, and entries are evicted under the
// write lock; a block is stored in an entry only while the entry is in the
// table (see refill).
type sequences struct {
	mu sync.RWMutex
	m  map[string]*seqEntry // key: rollout + "\x00" + attempt
	// tick is the logical clock: incremented on each insertion (write
	// lock), read on each use (read lock).
	tick uint64

	// The rest is guarded by mu.
	byRollout  map[string]*seqEntry // the first of each rollout's entries (see seqEntry.next)
	bytes      int64                // counted size of the entries (see entrySize)
	maxEntries int
	maxBytes   int64
	evictions  prometheus.Counter // may be nil

	// store reserves the blocks of ids. Set before the first call
	// (setStore).
	store        seqstore.Store
	storeTimeout time.Duration
	// noAhead turns reserveAhead off (tests of the reservation made by the
	// call that uses a block up).
	noAhead bool
}

// seqReserve serialises the reservations of an entry: the mutex of the call
// reserving the next block, how many reservations were tried, and the
// error of the last (guarded by mu).
type seqReserve struct {
	mu       sync.Mutex
	tries    atomic.Uint64
	lastFail error
}

// seqBlock is a block of ids reserved in the store: n is the last id handed
// out (it passes last when the block is exhausted). The call that takes id
// mark (half the block) starts the reservation of the next block in the
// background (reserveAhead).
type seqBlock struct {
	n    atomic.Uint64
	last uint64
	mark uint64
}

// newSeqBlock is the block of blk, whose first id is handed out by n.Add.
func newSeqBlock(blk seqstore.Block) *seqBlock {
	b := &seqBlock{last: blk.Last, mark: blk.First + (blk.Last-blk.First+1)/2}
	b.n.Store(blk.First - 1)
	return b
}

// seqEntry is one (rollout, attempt): its block of ids, its ids, and the
// task id registered for it (through the API) once known. An evicted entry
// stays valid for the calls holding it, but gives no more ids.
type seqEntry struct {
	used    atomic.Uint64 // sequences.tick when last used
	key     string        // rollout + "\x00" + attempt
	rollout string        // key's prefix
	attempt string        // key's suffix
	task    atomic.Pointer[string]
	looked  atomic.Bool // the rollout registry was consulted for the task id

	// The current block (nil until reserved), the next one when reserved
	// ahead (reserveAhead), and how the next is reserved (made with the
	// entry).
	blk   atomic.Pointer[seqBlock]
	ahead atomic.Pointer[seqBlock]
	rs    *seqReserve

	// prev and next link the entries of one rollout (guarded by sequences.mu).
	prev, next *seqEntry

	// retries remembers the attempt's recent calls, so that a client's
	// retry of one takes its sequence id (retries.go).
	retries retryMemo
}

// lruCandidate is an entry and its last use, while choosing whom to evict.
type lruCandidate struct {
	used uint64
	e    *seqEntry
}

// setLimits sets the table's bounds (values < 1 take the defaults) and the
// counter of evicted entries (nil: none).
func (s *sequences) setLimits(maxEntries int, maxBytes int64, evictions prometheus.Counter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxEntries, s.maxBytes, s.evictions = maxEntries, maxBytes, evictions
	s.initLocked()
}

// initLocked fills unset bounds with the defaults and makes the maps.
func (s *sequences) initLocked() {
	if s.maxEntries < 1 {
		s.maxEntries = defaultMaxTrackedAttempts
	}
	if s.maxBytes < 1 {
		s.maxBytes = defaultMaxTrackedAttemptBytes
	}
	if s.m == nil {
		s.m, s.byRollout = map[string]*seqEntry{}, map[string]*seqEntry{}
	}
}

// errNoSequenceStore is setStore's error without a store.
var errNoSequenceStore = errors.New("no sequence store: set Config.SequenceStore (seqstore.Open; " +
	"rollgate serve opens the --queue database, else a file beside --db)")

// setStore makes the table take ids from blocks the store reserves, each
// reservation bounded by timeout (< 1: defaultSequenceStoreTimeout), and
// drop the attempts other gateways take over. Call it before the first id.
func (s *sequences) setStore(st seqstore.Store, timeout time.Duration) error {
	if st == nil {
		return errNoSequenceStore
	}
	if timeout < 1 {
		timeout = defaultSequenceStoreTimeout
	}
	s.mu.Lock()
	s.store, s.storeTimeout = st, timeout
	s.mu.Unlock()
	st.OnTakeover(s.drop)
	return nil
}

// next returns the next sequence id of (rollout, attempt).
func (s *sequences) next(rollout, attempt string) (uint64, error) {
	_, id, err := s.assign([]byte(rollout), []byte(attempt))
	return id, err
}

// assign returns the entry of (rollout, attempt) and its next sequence id,
// creating the entry on first use (or after its eviction). It does not
// allocate for a known attempt, nor touch the store while the attempt's
// block lasts. The error says the store could not reserve a block in time:
// the call must be refused.
func (s *sequences) assign(rollout, attempt []byte) (*seqEntry, uint64, error) {
	var kb [seqKeyBuf]byte
	key, e, id := s.fastID(&kb, rollout, attempt)
	switch {
	case id != 0:
		return e, id, nil
	case e != nil:
		return s.refill(e)
	}
	return s.insert(key, len(rollout))
}

// fastID is what assign and take do first: the key of (rollout, attempt)
// in kb, its entry and the next id of its block (lookupID), starting the
// reservation of the next block when the id is the block's mark.
func (s *sequences) fastID(kb *[seqKeyBuf]byte, rollout, attempt []byte) (key []byte, e *seqEntry, id uint64) {
	key = append(append(append(kb[:0], rollout...), 0), attempt...)
	e, id, ahead := s.lookupID(key)
	if ahead {
		go s.reserveAhead(e)
	}
	return key, e, id
}

// lookupID is the fast path of assign and take: the entry of key and the
// next id of its block, under the read lock; id 0 when the block is
// exhausted (and no block was reserved ahead) or not reserved yet, e nil
// when the table has no entry. An exhausted block gives way to the block
// reserved ahead, if any. ahead true: the id is its block's mark, the caller
// starts reserveAhead.
func (s *sequences) lookupID(key []byte) (e *seqEntry, id uint64, ahead bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if e = s.m[string(key)]; e == nil {
		return nil, 0, false
	}
	if t := s.tick; e.used.Load() != t {
		e.used.Store(t)
	}
	for {
		b := e.blk.Load()
		if b == nil {
			return e, 0, false
		}
		if id = b.n.Add(1); id <= b.last {
			return e, id, id == b.mark && !s.noAhead
		}
		nb := e.ahead.Load()
		if nb == nil {
			return e, 0, false
		}
		// Stored while e is in the table (under the read lock held here,
		// so no drop comes between): one caller moves e to it.
		e.blk.CompareAndSwap(b, nb)
		e.ahead.CompareAndSwap(nb, nil)
	}
}

// reserveAhead reserves e's next block while its current one still has
// ids, so that the call using it up does not wait for the store. It runs
// under e's reservation mutex, so blocks are stored in the order the store
// reserved them; a failure is left to that call (which then reserves itself,
// and counts as a wait), and a block whose entry left the table meanwhile is
// abandoned (a gap, as a restart leaves).
func (s *sequences) reserveAhead(e *seqEntry) {
	rs := e.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if e.ahead.Load() != nil || !s.holds(e) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.storeTimeout)
	blk, err := s.store.Reserve(ctx, e.rollout, e.attempt)
	cancel()
	if err != nil {
		return // seqstore counted it; the call that needs the block retries
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.m[e.key] == e {
		e.ahead.Store(newSeqBlock(blk))
	}
}

// seqTicket is a reservation of a block under way for a call that did not
// wait for it (take): the call goes on meanwhile (its request is sent to
// the engine) and waits for the ticket only before its id is needed (the
// answer's headers, its row): the database's commit runs beside the
// engine's work instead of before it.
type seqTicket struct {
	done chan struct{}
	e    *seqEntry // the attempt's entry (set before done is closed)
	id   uint64
	err  error
}

// wait returns the ticket's entry and id, or the reservation's error. The
// calls that find the reservation still under way are counted in waits
// (nil: not counted).
func (t *seqTicket) wait(waits prometheus.Counter) (*seqEntry, uint64, error) {
	select {
	case <-t.done:
	default:
		if waits != nil {
			waits.Inc()
		}
		<-t.done
	}
	return t.e, t.id, t.err
}

// take is assign for a call that need not wait for the store: the entry
// and the next id of (rollout, attempt) when the attempt's block has one
// (no I/O, no allocation for a known attempt), otherwise the entry and a
// ticket of the reservation, started in the background, whose id the call
// takes with wait. The ticket's entry may differ from the one returned (the
// attempt's entry was dropped or evicted meanwhile); both have the same
// rollout and attempt.
func (s *sequences) take(rollout, attempt []byte) (*seqEntry, uint64, *seqTicket) {
	var kb [seqKeyBuf]byte
	key, e, id := s.fastID(&kb, rollout, attempt)
	switch {
	case id != 0:
		return e, id, nil
	case e == nil:
		s.mu.Lock()
		e = s.insertLocked(key, len(rollout))
		s.mu.Unlock()
	}
	t := &seqTicket{done: make(chan struct{}), e: e}
	go func() {
		t.e, t.id, t.err = s.refill(e)
		close(t.done)
	}()
	return e, 0, t
}

// refill reserves the next block of e's attempt in the store and returns
// its first id (or an id of a block another call reserved meanwhile). A call
// that waited while another's reservation failed fails with it, so that
// calls queued on a down store wait one timeout, not one each.
//
// A call whose entry left the table (dropped or evicted) before its
// reservation returned takes its id from the attempt's current entry
// instead, as a call arriving now would, and the block it reserved is
// abandoned: the store orders concurrent reservations, not their arrival,
// so that block may be above one reserved meanwhile for the attempt's new
// entry, whose lower ids the table would then hand out after this call's
// higher one, to the same sequential caller.
func (s *sequences) refill(e *seqEntry) (*seqEntry, uint64, error) {
	id, err := s.reserve(e)
	if err == errEntryRemoved {
		return s.assign([]byte(e.rollout), []byte(e.attempt))
	}
	return e, id, err
}

// errEntryRemoved tells refill that its entry left the table.
var errEntryRemoved = errors.New("gateway: sequence entry removed")

// reserve is refill on e alone: an id of e's block, or of a block it
// reserves and stores in e while e is in the table (errEntryRemoved once
// e is not).
func (s *sequences) reserve(e *seqEntry) (uint64, error) {
	rs := e.rs
	tried := rs.tries.Load()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if b := e.blk.Load(); b != nil {
		if id := b.n.Add(1); id <= b.last {
			return id, nil
		}
	}
	if id, ok := s.takeAhead(e); ok { // reserved ahead while this call waited
		return id, nil
	}
	if rs.tries.Load() != tried && rs.lastFail != nil {
		return 0, rs.lastFail
	}
	if !s.holds(e) { // no reservation for a removed entry (see refill)
		return 0, errEntryRemoved
	}
	rs.tries.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), s.storeTimeout)
	blk, err := s.store.Reserve(ctx, e.rollout, e.attempt)
	cancel()
	if rs.lastFail = err; err != nil {
		return 0, err // seqstore's errors name the attempt and what to check
	}
	b := newSeqBlock(blk)
	b.n.Store(blk.First)
	// Stored under the read lock, so no removal comes between the check
	// and the store: an entry inserted after e's removal reserves after
	// this block.
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.m[e.key] != e {
		return 0, errEntryRemoved
	}
	e.blk.Store(b)
	return blk.First, nil
}

// takeAhead moves e (in the table) to its block reserved ahead and returns
// that block's first id; ok false when there is none. Called under e's
// reservation mutex.
func (s *sequences) takeAhead(e *seqEntry) (id uint64, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	nb := e.ahead.Swap(nil)
	if nb == nil || s.m[e.key] != e {
		return 0, false
	}
	e.blk.Store(nb)
	return nb.n.Add(1), true
}

// holds tells whether e is (still) in the table.
func (s *sequences) holds(e *seqEntry) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[e.key] == e
}

// drop forgets (rollout, attempt), or every attempt when both are "": the
// store says another gateway took it over (or it cannot tell). The next
// call of the attempt reserves a new block. Calls already past the lookup
// may still take ids of the old block: they arrived before the takeover;
// none reserves a new block for the old entry (see refill).
func (s *sequences) drop(rollout, attempt string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rollout == "" && attempt == "" {
		for _, e := range s.m {
			s.remove(e)
		}
		return
	}
	if e := s.m[rollout+"\x00"+attempt]; e != nil {
		s.remove(e)
	}
}

// insert is assign's slow path: it makes the entry of key, whose rollout id
// is key[:rolloutLen], evicting entries first if the table is full, then
// reserves the entry's first block.
func (s *sequences) insert(key []byte, rolloutLen int) (*seqEntry, uint64, error) {
	s.mu.Lock()
	e := s.insertLocked(key, rolloutLen)
	s.mu.Unlock()
	return s.refill(e)
}

// insertLocked is insert under the write lock: the entry, without a block.
func (s *sequences) insertLocked(key []byte, rolloutLen int) *seqEntry {
	if e := s.m[string(key)]; e != nil { // made meanwhile
		e.used.Store(s.tick)
		return e
	}
	if s.m == nil || s.maxEntries < 1 {
		s.initLocked()
	}
	size := s.entrySize(len(key))
	if len(s.m) >= s.maxEntries || s.bytes+size > s.maxBytes {
		s.evict(size)
	}
	k := string(key)
	e := &seqEntry{key: k, rollout: k[:rolloutLen], attempt: k[rolloutLen+1:], rs: &seqReserve{}}
	s.tick++
	e.used.Store(s.tick)
	s.m[k] = e
	s.bytes += size
	if first := s.byRollout[e.rollout]; first != nil {
		e.prev, e.next = first, first.next
		if first.next != nil {
			first.next.prev = e
		}
		first.next = e
	} else {
		s.byRollout[e.rollout] = e
	}
	return e
}

// entrySize is the counted size of an entry whose key is keyLen bytes long.
func (s *sequences) entrySize(keyLen int) int64 {
	return int64(keyLen+31)&^31 + seqEntryOverhead + seqBlockOverhead + seqRetryOverhead
}

// forRollout calls fn with each entry of the rollout, under the read lock:
// fn must not call the table.
func (s *sequences) forRollout(rolloutID string, fn func(*seqEntry)) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for e := s.byRollout[rolloutID]; e != nil; e = e.next {
		fn(e)
	}
}

// evict removes the least recently used entries, at least 1/evictDivisor
// of them, and more until an entry of size bytes fits both bounds.
func (s *sequences) evict(size int64) {
	c := make([]lruCandidate, 0, len(s.m))
	for _, e := range s.m {
		c = append(c, lruCandidate{e.used.Load(), e})
	}
	k := max(len(c)/evictDivisor, 1)
	evicted := 0
	for rest := c; len(rest) > 0; rest = rest[k:] {
		k = min(k, len(rest))
		selectOldest(rest, k)
		for _, x := range rest[:k] {
			s.remove(x.e)
		}
		evicted += k
		if len(s.m) < s.maxEntries && s.bytes+size <= s.maxBytes {
			break
		}
	}
	if s.evictions != nil {
		s.evictions.Add(float64(evicted))
	}
}

// remove takes e out of the table.
func (s *sequences) remove(e *seqEntry) {
	delete(s.m, e.key)
	s.bytes -= s.entrySize(len(e.key))
	if e.next != nil {
		e.next.prev = e.prev
	}
	switch {
	case e.prev != nil:
		e.prev.next = e.next
	case e.next != nil: // e was its rollout's first: key the index by a live entry's string
		delete(s.byRollout, e.rollout)
		s.byRollout[e.next.rollout] = e.next
	default:
		delete(s.byRollout, e.rollout)
	}
	e.prev, e.next = nil, nil
}

// selectOldest reorders c so that c[:k] are its k least recently used
// entries (quickselect: linear on average).
func selectOldest(c []lruCandidate, k int) {
	lo, hi := 0, len(c)-1
	for lo < hi {
		// Median of three as the pivot, then Hoare's partition.
		mid := lo + (hi-lo)/2
		if c[mid].used < c[lo].used {
			c[mid], c[lo] = c[lo], c[mid]
		}
		if c[hi].used < c[lo].used {
			c[hi], c[lo] = c[lo], c[hi]
		}
		if c[hi].used < c[mid].used {
			c[hi], c[mid] = c[mid], c[hi]
		}
		p := c[mid].used
		i, j := lo, hi
		for i <= j {
			for c[i].used < p {
				i++
			}
			for c[j].used > p {
				j--
			}
			if i <= j {
				c[i], c[j] = c[j], c[i]
				i++
				j--
			}
		}
		// Now c[lo..j] <= p <= c[i..hi], and c[j+1..i-1] == p.
		switch {
		case k-1 <= j:
			hi = j
		case k-1 >= i:
			lo = i
		default:
			return
		}
	}
}
