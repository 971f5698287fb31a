package gateway

import (
	"hash/maphash"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

func TestRetryMemo(t *testing.T) {
	var m retryMemo
	span := func(b byte) (s [16]byte) { s[0] = b; return s }
	m.remember(10, 0, 1, span('a'))
	m.remember(20, 0, 2, span('b'))
	f := func(name string, body uint64, sig retrySignal, wantSeq uint64, wantTries uint16) {
		t.Helper()
		got, ok := m.match(body, sig)
		if wantSeq == 0 {
			if ok {
				t.Errorf("%s: matched %+v, want no match", name, got)
			}
			return
		}
		if !ok || got.seq != wantSeq || got.tries != wantTries {
			t.Errorf("%s: %+v %v, want seq %d try %d", name, got, ok, wantSeq, wantTries)
		}
	}
	f("no signal", 10, retrySignal{}, 0, 0)
	f("retry of the first", 10, retrySignal{count: 1}, 1, 1)
	f("its second retry", 10, retrySignal{count: 2}, 1, 2)
	f("retry of the second", 20, retrySignal{count: 1}, 2, 1)
	f("unknown body", 30, retrySignal{count: 1}, 0, 0)
	f("a key never seen", 10, retrySignal{key: 7}, 0, 0)
	m.remember(30, 7, 3, span('c'))
	f("the same key", 99, retrySignal{key: 7}, 3, 1)
	// Four newer calls push the first out: its retry is a new call.
	for i := uint64(0); i < retryRecent; i++ {
		m.remember(100+i, 0, 4+i, span('d'))
	}
	f("forgotten", 10, retrySignal{count: 1}, 0, 0)
	f("still remembered", 100+retryRecent-1, retrySignal{count: 1}, 4+retryRecent-1, 1)
}

func TestReadRetrySignal(t *testing.T) {
	f := func(count, key string, wantCount uint64, wantKey bool) {
		t.Helper()
		var h fasthttp.RequestHeader
		if count != "" {
			h.Set("X-Stainless-Retry-Count", count)
		}
		if key != "" {
			h.Set("idempotency-key", key)
		}
		sig := readRetrySignal(&h)
		if sig.count != wantCount || (sig.key != 0) != wantKey {
			t.Errorf("%q %q: %+v, want count %d key %v", count, key, sig, wantCount, wantKey)
		}
	}
	f("", "", 0, false)
	f("0", "", 0, false)
	f("2", "", 2, false)
	f("-1", "", 0, false)
	f("x", "", 0, false)
	f("99999999999999999999999", "", 0, false)
	f("", "k", 0, true)
}

// TestRetryPathDoesNotAllocate: reading the retry headers, looking the
// attempt up, matching and remembering a call cost no allocation (the
// sequence table's fast path stays allocation-free with retries on).
func TestRetryPathDoesNotAllocate(t *testing.T) {
	s := newTestSequences(&hugeBlocks{}, 0, 0)
	rollout, attempt := []byte(strings.Repeat("r", 128)), []byte(strings.Repeat("a", 128))
	s.assign(rollout, attempt)
	var h fasthttp.RequestHeader
	h.Set("x-stainless-retry-count", "1")
	h.Set("Idempotency-Key", "k")
	body := strings.Repeat("b", 4096)
	if allocs := testing.AllocsPerRun(100, func() {
		sig := readRetrySignal(&h)
		e := s.lookup(rollout, attempt)
		sum := maphash.String(retrySeed, body)
		if _, ok := e.retries.match(sum, sig); !ok {
			e.retries.remember(sum, sig.key, 1, [16]byte{})
		}
	}); allocs != 0 {
		t.Errorf("%v allocations per call", allocs)
	}
}
