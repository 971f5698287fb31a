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

// TestSequenceReservationBesideEngine: the first call of an attempt (no
// block in memory: the empty-pool path) is sent to the engine while its
// block is still being reserved; it answers only once the reservation is
// committed, with id 1, and counts in rollgate_sequence_waits_total (the
// engine answered first). The next call takes id 2 from the block in
// memory and waits for nothing.
func TestSequenceReservationBesideEngine(t *testing.T) {
	store, _ := openSQLite(t)
	inner, err := seqstore.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "seq.db"), seqstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	held := &heldStore{Store: inner, entered: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, store, func(c *gateway.Config) { c.SequenceStore = held })
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
