package gateway

import (
	"context"
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

	"github.com/rollgate/rollgate/gateway/seqstore"
)

// newTestSequences returns a table with the given bounds (< 1: defaults)
// whose ids come from st.
func newTestSequences(st seqstore.Store, maxEntries int, maxBytes int64) *sequences {
	s := new(sequences)
	s.setLimits(maxEntries, maxBytes, nil)
	if err := s.setStore(st, 0); err != nil {
		panic(err)
	}
	return s
}

// memBlocks is a store in memory that reserves blocks of size ids per
// attempt, each above the attempt's previous one, as seqstore does in its
// table: so that tables under churn reserve often, fast.
type memBlocks struct {
	size uint64
	mu   sync.Mutex
	next map[string]uint64 // rollout + NUL + attempt: the next id not reserved
}

func newMemBlocks(size uint64) *memBlocks {
	return &memBlocks{size: size, next: map[string]uint64{}}
}

func (m *memBlocks) Reserve(_ context.Context, rollout, attempt string) (seqstore.Block, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := rollout + "\x00" + attempt
	first := max(m.next[k], 1)
	m.next[k] = first + m.size
	return seqstore.Block{First: first, Last: first + m.size - 1}, nil
}
func (m *memBlocks) OnTakeover(func(string, string)) {}
func (m *memBlocks) Close() error                    { return nil }

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
}

// has reports whether (rollout, attempt) is a live entry.
func (s *sequences) has(rollout, attempt string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.m[rollout+"\x00"+attempt] != nil
}

// TestSequenceIDsIncreaseUnderChurn: with tiny bounds (entries, then bytes)
// forcing evictions, and small blocks forcing reservations, every attempt's
// ids strictly increase, and its first id is 1.
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
			s := newTestSequences(newMemBlocks(4), tc.maxEntries, tc.maxBytes)
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
			if above1 > 0 {
				t.Fatalf("%d of %d attempts started above 1", above1, len(last))
			}
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
	s := newTestSequences(newMemBlocks(4), 3, 0)
	evictions := prometheus.NewCounter(prometheus.CounterOpts{Name: "evictions"})
	s.evictions = evictions
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
	s := newTestSequences(&hugeBlocks{}, 0, 0)
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

// TestSequenceEntryOverhead measures what an entry and its block cost on
// the heap, and checks seqEntryOverhead and seqBlockOverhead cover it.
func TestSequenceEntryOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a heap measurement of 10^5 entries (seconds); CI runs it")
	}
	const keyLen = 32 // 16-byte rollout id, NUL, 15-byte attempt id: one 32-byte allocation
	r, a := make([]byte, 16), make([]byte, 15)
	for _, n := range []int{20_000, 65_536, 100_000, 150_000} {
		s := newTestSequences(&hugeBlocks{}, n, 1<<40)
		before := heapInuse()
		for i := range n { // one rollout per entry: the rollout index's worst case
			s.assign(putID(r, 'r', i), putID(a, 'a', i))
		}
		per := float64(heapInuse()-before)/float64(n) - keyLen
		t.Logf("%6d entries: %.0f bytes each besides the key", n, per)
		if limit := s.entrySize(0); per > float64(limit) {
			t.Errorf("%d entries: %.0f bytes each besides the key, counted %d", n, per, limit)
		}
		runtime.KeepAlive(s)
	}
}

// TestSequenceHeapBound: inserting many distinct attempts with ids of the
// longest valid length (128 bytes) keeps the table's heap within its
// documented bound, 1.5 × maxBytes + 1 MiB (see sequences): with the default
// bounds, 200,000 attempts; with smaller ones, enough to evict many times
// over.
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
			s := newTestSequences(&hugeBlocks{}, tc.maxEntries, tc.maxBytes)
			bound := seqHeapBound(s.maxBytes)
			r, a := make([]byte, 128), make([]byte, 128)
			before := heapInuse()
			for i := range tc.attempts {
				s.assign(putID(r, 'r', i/4), putID(a, 'a', i))
			}
			grown := heapInuse() - before
			s.check(t)
			t.Logf("%d attempts: heap +%.1f MiB (bound %.1f MiB); %d entries, %.1f MiB counted",
				tc.attempts, float64(grown)/(1<<20), float64(bound)/(1<<20), len(s.m), float64(s.bytes)/(1<<20))
			if grown > bound {
				t.Errorf("heap grew by %d bytes, bound %d", grown, bound)
			}
			// Tighter: what the table counts, with its fragmentation.
			used := seqHeapBound(s.bytes)
			if grown > used {
				t.Errorf("heap grew by %d bytes, more than the %d the table holds (with 1 MiB of slack)", grown, used)
			}
			runtime.KeepAlive(s)
		})
	}
}

// seqHeapBound is the documented bound of the heap of a table counting
// maxBytes (see sequences).
func seqHeapBound(maxBytes int64) int64 { return maxBytes*3/2 + 1<<20 }

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
			s := newTestSequences(&hugeBlocks{}, 0, 0)
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

// nextID is next for tables whose store never fails.
func (s *sequences) nextID(rollout, attempt string) uint64 {
	id, err := s.next(rollout, attempt)
	if err != nil {
		panic(err)
	}
	return id
}
