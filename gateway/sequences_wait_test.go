package gateway_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
)

// heldStore is a sequence store whose next reservation, once hold is set,
// waits (entered is signalled) until release is closed.
type heldStore struct {
	seqstore.Store
	hold    atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func (h *heldStore) Reserve(ctx context.Context, r, a string) (seqstore.Block, error) {
	if h.hold.CompareAndSwap(true, false) {
		h.entered <- struct{}{}
		<-h.release
	}
	return h.Store.Reserve(ctx, r, a)
}

// heldEnv is a gateway over a SQLite sequence store wrapped in a heldStore.
func heldEnv(t *testing.T) (*env, *heldStore) {
	t.Helper()
	store, _ := openSQLite(t)
	inner, err := seqstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "seq.db"), seqstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	held := &heldStore{Store: inner, entered: make(chan struct{}), release: make(chan struct{})}
	return newEnv(t, store, func(c *gateway.Config) { c.SequenceStore = held }), held
}

// TestSequenceReservationBesideEngine: the first call of an attempt (no
// block in memory: the empty-pool path) is sent to the engine while its
// block is still being reserved; it answers only once the reservation is
// committed, with id 1, and counts in rollgate_sequence_waits_total (the
// engine answered first). The next call takes id 2 from the block in
// memory and waits for nothing.
func TestSequenceReservationBesideEngine(t *testing.T) {
	e, held := heldEnv(t)
	url := e.url + "/rollout/ro-w/attempt/at-1/v1/chat/completions"

	held.hold.Store(true)
	done := make(chan resp, 1)
	go func() { done <- do(t, "POST", url, chatBody) }()
	select {
	case <-held.entered:
	case r := <-done:
		t.Fatalf("answered without a reservation: %d %s", r.status, r.body)
	}
	waitFor(t, "the engine to get the call while its block is being reserved", func() bool { return e.mock.RequestsTo("/v1/chat/completions") == 1 })
	select {
	case r := <-done:
		t.Fatalf("answered before its sequence id was reserved: %d %v", r.status, r.header)
	default:
	}
	close(held.release)
	r := <-done
	if r.status != 200 || r.header.Get("x-sequence-id") != "1" || r.header.Get("x-rollout-id") != "ro-w" {
		t.Fatalf("first call: %d %v %s", r.status, r.header, r.body)
	}
	if n := testutil.ToFloat64(e.m.SequenceWaits); n != 1 {
		t.Fatalf("rollgate_sequence_waits_total = %v after a call that waited for its reservation, want 1", n)
	}
	if r := do(t, "POST", url, chatBody); r.status != 200 || r.header.Get("x-sequence-id") != "2" {
		t.Fatalf("second call: %d %v %s", r.status, r.header, r.body)
	}
	if n := testutil.ToFloat64(e.m.SequenceWaits); n != 1 {
		t.Fatalf("rollgate_sequence_waits_total = %v after a call whose block was in memory, want 1", n)
	}
	if rows := e.storedCalls(export.CallFilter{RolloutID: "ro-w"}); len(rows) != 2 || rows[0].SequenceID+rows[1].SequenceID != 3 {
		t.Fatalf("stored %+v, want the calls with ids 1 and 2", rows)
	}
}

// TestRetryWhileFirstTryReserves: an SDK retry that arrives while its
// first try's id is still being reserved (the attempt's first call, a
// slow store) is the same call: both tries answer x-sequence-id 1, and the
// retry's row says retry_count 1. (Before the retry memo kept the pending
// reservation, the retry was a new call with id 2.)
func TestRetryWhileFirstTryReserves(t *testing.T) {
	e, held := heldEnv(t)
	url := e.url + "/rollout/ro-r/attempt/at-1/v1/chat/completions"

	held.hold.Store(true)
	first, retry := make(chan resp, 1), make(chan resp, 1)
	go func() { first <- do(t, "POST", url, chatBody, "x-stainless-retry-count", "0") }()
	<-held.entered
	waitFor(t, "the engine to get the first try", func() bool { return e.mock.RequestsTo("/v1/chat/completions") == 1 })
	go func() { retry <- do(t, "POST", url, chatBody, "x-stainless-retry-count", "1") }()
	waitFor(t, "the engine to get the retry", func() bool { return e.mock.RequestsTo("/v1/chat/completions") == 2 })
	close(held.release)
	for name, ch := range map[string]chan resp{"first try": first, "retry": retry} {
		if r := <-ch; r.status != 200 || r.header.Get("x-sequence-id") != "1" {
			t.Errorf("%s: %d x-sequence-id %q, want 200 and 1", name, r.status, r.header.Get("x-sequence-id"))
		}
	}
	var rows []export.Call
	waitFor(t, "two rows", func() bool { rows = e.storedCalls(export.CallFilter{RolloutID: "ro-r"}); return len(rows) == 2 })
	tries := map[uint16]uint64{}
	for _, r := range rows {
		tries[r.RetryCount] = r.SequenceID
	}
	if len(tries) != 2 || tries[0] != 1 || tries[1] != 1 {
		t.Fatalf("rows (retry_count → sequence_id) %v, want 0 → 1 and 1 → 1", tries)
	}
}
