package gateway

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// newTestSequences returns a table with the given bounds (< 1: defaults).
func newTestSequences(maxEntries int, maxBytes int64) *sequences {
	s := new(sequences)
	s.setLimits(maxEntries, maxBytes, nil)
	return s
}

// check verifies the table's invariants: within its bounds, byte count
// exact, rollout index consistent with the map.
func (s *sequences) check(t testing.TB) {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.m) > s.maxEntries {
		t.Fatalf("%d entries, bound %d", len(s.m), s.maxEntries)
	}
	var bytes int64
	for k, e := range s.m {
		if k != e.key || k != e.rollout+"\x00"+e.attempt {
			t.Fatalf("entry %q has key %q (%q, %q)", k, e.key, e.rollout, e.attempt)
		}
		bytes += s.entrySize(len(k))
	}
	if bytes != s.bytes {
		t.Fatalf("counted %d bytes, entries take %d", s.bytes, bytes)
	}
	if s.bytes > s.maxBytes && len(s.m) > 1 {
		t.Fatalf("%d bytes in %d entries, bound %d", s.bytes, len(s.m), s.maxBytes)
	}
	linked := 0
	for r, first := range s.byRollout {
		if first.prev != nil {
			t.Fatalf("rollout %q: first entry has a predecessor", r)
		}
		for e := first; e != nil; e = e.next {
			if e.rollout != r || s.m[e.key] != e || (e.next != nil && e.next.prev != e) {
				t.Fatalf("rollout %q: bad link at %q", r, e.key)
			}
			linked++
		}
	}
	if linked != len(s.m) {
		t.Fatalf("%d entries linked by rollout, %d in the table", linked, len(s.m))
	}
	if g := max(s.maxTombs/2, 1); len(s.tombs) > g || len(s.oldTombs) > g {
		t.Fatalf("%d + %d tombstones, bound %d per generation", len(s.tombs), len(s.oldTombs), g)
	}
}

// has reports whether (rollout, attempt) is a live entry.
func (s *sequences) has(rollout, attempt string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[rollout+"\x00"+attempt] != nil
}

// TestSequenceResumesAfterEviction: an evicted attempt resumes from its
// tombstone, and once its tombstone is dropped from its floor; ids start at 1
// until then.
func TestSequenceResumesAfterEviction(t *testing.T) {
	s := newTestSequences(4, 0)
	for want := uint64(1); want <= 3; want++ {
		if got := s.nextID("r", "a"); got != want {
			t.Fatalf("id %d, want %d", got, want)
		}
	}
	for i := range 4 { // evicts ("r", "a"), the least recently used
		if got := s.nextID("other", strconv.Itoa(i)); got != 1 {
			t.Fatalf("new attempt %d starts at %d", i, got)
		}
		s.check(t)
	}
	if s.has("r", "a") {
		t.Fatal("the least recently used attempt was not evicted")
	}
	if got := s.nextID("r", "a"); got != 4 {
		t.Fatalf("resumed at %d, want 4 (from the tombstone)", got)
	}

	// One entry, 8 tombstones: 20 attempts of 5 calls drop most tombstones.
	s = newTestSequences(1, 0)
	for i := range 20 {
		for want := uint64(1); want <= 5; want++ {
			if got := s.nextID("r", strconv.Itoa(i)); i < 9 && got != want {
				t.Fatalf("attempt %d: id %d before any tombstone was dropped, want %d", i, got, want)
			}
		}
		s.check(t)
	}
	if s.floors == nil {
		t.Fatal("no tombstone was dropped")
	}
	if got := s.nextID("r", "0"); got <= 5 {
		t.Fatalf("attempt 0 resumed at %d after its tombstone was dropped, want > 5", got)
	}
}

// TestSequenceIDsIncreaseUnderChurn: with tiny bounds (entries, then bytes)
// forcing evictions, tombstone drops and floors, every attempt's ids strictly
// increase.
func TestSequenceIDsIncreaseUnderChurn(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxEntries int
		maxBytes   int64
	}{
		{"entries", 4, 0},
		{"bytes", 100, 6 * (&sequences{}).entrySize(40)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestSequences(tc.maxEntries, tc.maxBytes)
			rng := rand.New(rand.NewPCG(1, 2))
			last := map[string]uint64{}
			above1 := 0
			for i := range 100_000 {
				// 300 attempts of 10 rollouts; ids of varied lengths.
				r := "rollout-" + strconv.Itoa(rng.IntN(10)) + strings.Repeat("x", rng.IntN(20))
				a := strconv.Itoa(rng.IntN(30))
				id := s.nextID(r, a)
				k := r + "/" + a
				if id <= last[k] {
					t.Fatalf("op %d: %s got id %d after %d", i, k, id, last[k])
				}
				if last[k] == 0 && id > 1 {
					above1++
				}
				last[k] = id
				if i%97 == 0 {
					s.check(t)
				}
			}
			s.check(t)
			if s.floors == nil {
				t.Fatal("no tombstone was dropped: the test does not exercise the floors")
			}
			t.Logf("%d attempts, %d started above 1", len(last), above1)
		})
	}
}

// TestSequenceConcurrentNoRepeat: many goroutines taking ids of a few
// attempts from a table that holds fewer (run it with -race) never get an
// id twice, and each sees its ids of an attempt increase.
func TestSequenceConcurrentNoRepeat(t *testing.T) {
	const (
		goroutines = 8
		calls      = 4000
		attempts   = 24
	)
	s := new(sequences)
	evictions := prometheus.NewCounter(prometheus.CounterOpts{Name: "evictions"})
	s.setLimits(3, 0, evictions)
	got := make([]map[int][]uint64, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		got[g] = map[int][]uint64{}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range calls {
				a := rng.IntN(attempts)
				e, id, _ := s.assign([]byte("r"+strconv.Itoa(a%4)), []byte(strconv.Itoa(a)))
				if e.attempt != strconv.Itoa(a) {
					t.Errorf("entry of attempt %q for %d", e.attempt, a)
					return
				}
				ids := got[g][a]
				if len(ids) > 0 && id <= ids[len(ids)-1] {
					t.Errorf("attempt %d: id %d after %d", a, id, ids[len(ids)-1])
					return
				}
				got[g][a] = append(ids, id)
			}
		})
	}
	wg.Go(func() { // the API registering rollouts meanwhile
		task := "task"
		for i := range calls {
			s.forRollout("r"+strconv.Itoa(i%4), func(e *seqEntry) { e.task.Store(&task) })
		}
	})
	wg.Wait()
	s.check(t)
	if s.floors == nil {
		t.Fatal("no tombstone was dropped: the test does not exercise the floors")
	}
	if n := testutil.ToFloat64(evictions); n < goroutines*calls/attempts {
		t.Fatalf("%v evictions counted", n)
	}
	seen := map[[2]uint64]bool{}
	for _, byAttempt := range got {
		for a, ids := range byAttempt {
			for _, id := range ids {
				k := [2]uint64{uint64(a), id}
				if seen[k] {
					t.Fatalf("attempt %d: id %d given twice", a, id)
				}
				seen[k] = true
			}
		}
	}
	if len(seen) != goroutines*calls {
		t.Fatalf("%d ids, want %d", len(seen), goroutines*calls)
	}
}

// TestSequenceAssignDoesNotAllocate: a call of a known attempt, ids of the
// longest valid length included, costs no allocation.
func TestSequenceAssignDoesNotAllocate(t *testing.T) {
	s := newTestSequences(0, 0)
	for _, n := range []int{8, 128} {
		rollout, attempt := []byte(strings.Repeat("r", n)), []byte(strings.Repeat("a", n))
		s.assign(rollout, attempt)
		if allocs := testing.AllocsPerRun(100, func() { s.assign(rollout, attempt) }); allocs != 0 {
			t.Errorf("%d-byte ids: %v allocations per call", n, allocs)
		}
	}
}

// heapInuse returns the heap in use after a collection.
func heapInuse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// putID writes i in decimal at the end of id, padded with 'x' (an id of len(id) bytes).
func putID(id []byte, prefix byte, i int) []byte {
	for j := range id {
		id[j] = 'x'
	}
	id[0] = prefix
	b := strconv.AppendInt(nil, int64(i), 10)
	copy(id[len(id)-len(b):], b)
	return id
}

// TestSequenceEntryOverhead measures what an entry and a tombstone cost on
// the heap, and checks seqEntryOverhead and seqTombstoneBytes cover it.
func TestSequenceEntryOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a heap measurement of 10^5 entries (seconds); CI runs it")
	}
	const keyLen = 32 // 16-byte rollout id, NUL, 15-byte attempt id: one 32-byte allocation
	r, a := make([]byte, 16), make([]byte, 15)
	for _, withStore := range []bool{false, true} { // with a store, an entry also holds its block
		for _, n := range []int{20_000, 65_536, 100_000, 150_000} {
			s := newTestSequences(n, 1<<40)
			if withStore {
				s.setStore(&hugeBlocks{}, 0)
			}
			before := heapInuse()
			for i := range n { // one rollout per entry: the rollout index's worst case
				s.assign(putID(r, 'r', i), putID(a, 'a', i))
			}
			per := float64(heapInuse()-before)/float64(n) - keyLen
			t.Logf("store %v, %6d entries: %.0f bytes each besides the key", withStore, n, per)
			if limit := s.entrySize(0); per > float64(limit) {
				t.Errorf("store %v, %d entries: %.0f bytes each besides the key, counted %d", withStore, n, per, limit)
			}
			runtime.KeepAlive(s)
		}
	}
	for _, n := range []int{100_000, 300_000, 524_288} {
		s := newTestSequences(n/tombstonesPerEntry, 0)
		before := heapInuse()
		for i := range 3 * n { // the last 2n drop tombstones
			s.bury(rand.Uint64(), uint64(i))
			if i == n-1 || i == 3*n-1 {
				used := heapInuse() - before
				if s.floors != nil {
					used -= 8 << floorBits
				}
				per := float64(used) / float64(n)
				t.Logf("%6d tombstones (%d buried): %.1f bytes each", n, i+1, per)
				if per > seqTombstoneBytes {
					t.Errorf("%d tombstones: %.1f bytes each, seqTombstoneBytes %d", n, per, seqTombstoneBytes)
				}
			}
		}
		runtime.KeepAlive(s)
	}
}

// seqMemoryBound is the documented bound of a table's memory (see sequences).
func seqMemoryBound(maxEntries int, maxBytes int64) int64 {
	return maxBytes + int64(tombstonesPerEntry*maxEntries*seqTombstoneBytes) + 8<<floorBits
}

// TestSequenceHeapBound: inserting many distinct attempts with ids of the
// longest valid length (128 bytes) keeps the table's heap within its
// documented bound: with the default bounds, 200,000 attempts (tombstones
// accumulate); with smaller ones, enough to drop tombstones many times over.
func TestSequenceHeapBound(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a heap measurement of 10^5 entries (seconds); CI runs it")
	}
	for _, tc := range []struct {
		maxEntries, attempts int
		maxBytes             int64
	}{
		{0, 200_000, 0},
		{4096, 300_000, 3 << 20},
		{1 << 20, 100_000, 4 << 20}, // the byte bound first
	} {
		t.Run(fmt.Sprint(tc.maxEntries, "/", tc.maxBytes), func(t *testing.T) {
			s := newTestSequences(tc.maxEntries, tc.maxBytes)
			bound := seqMemoryBound(s.maxEntries, s.maxBytes)
			r, a := make([]byte, 128), make([]byte, 128)
			before := heapInuse()
			for i := range tc.attempts {
				s.assign(putID(r, 'r', i/4), putID(a, 'a', i))
			}
			grown := heapInuse() - before
			s.check(t)
			t.Logf("%d attempts: heap +%.1f MiB (bound %.1f MiB); %d entries, %.1f MiB counted, %d tombstones",
				tc.attempts, float64(grown)/(1<<20), float64(bound)/(1<<20), len(s.m), float64(s.bytes)/(1<<20), len(s.tombs)+len(s.oldTombs))
			if grown > bound {
				t.Errorf("heap grew by %d bytes, bound %d", grown, bound)
			}
			// Tighter: what the table counts, and its tombstones and floors.
			used := s.bytes + int64(len(s.tombs)+len(s.oldTombs))*seqTombstoneBytes + 1<<20
			if s.floors != nil {
				used += 8 << floorBits
			}
			if grown > used {
				t.Errorf("heap grew by %d bytes, more than the %d the table holds (with 1 MiB of slack)", grown, used)
			}
			runtime.KeepAlive(s)
		})
	}
}

// BenchmarkSequenceAssign measures the hot path: the sequence id of a call
// of a known attempt, from parallel goroutines each with its own attempt,
// with typical ids (a UUID rollout id, a short attempt id) and with ids of
// the longest valid length (128 bytes each).
func BenchmarkSequenceAssign(b *testing.B) {
	for _, bc := range []struct {
		name        string
		rollout, at int
	}{{"uuid", 36, 8}, {"max", 128, 128}} {
		b.Run(bc.name, func(b *testing.B) {
			var s sequences
			var g atomic.Int64
			rollout := []byte(strings.Repeat("r", bc.rollout))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				n := strconv.FormatInt(g.Add(1), 10)
				attempt := []byte(strings.Repeat("a", bc.at-len(n)) + n)
				s.assign(rollout, attempt)
				for pb.Next() {
					s.assign(rollout, attempt)
				}
			})
		})
	}
}

// nextID is next for tables without a store, which never fail.
func (s *sequences) nextID(rollout, attempt string) uint64 {
	id, err := s.next(rollout, attempt)
	if err != nil {
		panic(err)
	}
	return id
}
