package gateway

import (
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
)

// nextOrGate runs s.next("r", "a") and returns its id, failing the test if
// the call reaches g's gate instead (it waited for the store).
func nextOrGate(t *testing.T, s *sequences, g *gatedStore, what string) uint64 {
	t.Helper()
	type res struct {
		id  uint64
		err error
	}
	c := make(chan res, 1)
	go func() {
		id, err := s.next("r", "a")
		c <- res{id, err}
	}()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("%s: %v", what, r.err)
		}
		return r.id
	case <-g.entered:
		close(g.release)
		t.Fatalf("%s waited for the store's reservation", what)
	}
	return 0
}

// nextWhileHeld runs s.next("r", "a") while the store is held at its gate
// and returns its id, failing the test if the call does not return (it
// waits for the held store).
func nextWhileHeld(t *testing.T, s *sequences, what string) uint64 {
	t.Helper()
	c := make(chan uint64, 1)
	go func() { id, _ := s.next("r", "a"); c <- id }()
	select {
	case id := <-c:
		return id
	case <-time.After(10 * time.Second):
		t.Fatalf("%s waited for the store's reservation (held at the gate)", what)
	}
	return 0
}

// TestSequenceReservedAhead: the call that takes half of a block starts the
// reservation of the next block in the background; while the store holds
// that reservation, the block's remaining calls still get their ids (none
// waits for it), and once it is reserved, the call that uses the block up
// takes the next id from it without touching the store: ids stay
// contiguous and increasing.
func TestSequenceReservedAhead(t *testing.T) {
	g := newGatedStore(nil) // blocks of 4 ids: the mark is the 3rd
	s := newStoreTable(g, 0)
	for i := uint64(1); i <= 2; i++ {
		if id := nextOrGate(t, s, g, "a call of the first block"); id != i {
			t.Fatalf("call %d got id %d", i, id)
		}
	}
	g.hold.Store(true) // the reservation ahead will wait at the gate
	// The call at the mark starts the reservation ahead, which reaches the
	// gate while (or before) the call returns: nextOrGate cannot tell the
	// two apart, so the call is only required to return while the store
	// is held.
	if id := nextWhileHeld(t, s, "the call at the mark"); id != 3 {
		t.Fatalf("call 3 got id %d", id)
	}
	select {
	case <-g.entered: // the reservation ahead is under way, held
	case <-time.After(10 * time.Second):
		t.Fatal("the call at the block's mark started no reservation ahead")
	}
	// The store is held: the block's last id is still handed out at once.
	if id := nextWhileHeld(t, s, "a call with ids left in its block"); id != 4 {
		t.Fatalf("call 4 got id %d", id)
	}
	close(g.release)
	testenv.WaitFor(t, 10*time.Second, func() string { return "the block reserved ahead" }, func() bool {
		e := s.lookup([]byte("r"), []byte("a"))
		return e != nil && e.ahead.Load() != nil
	})
	// The gate is armed again: a call that reached the store would stop there.
	g.entered, g.release = make(chan struct{}), make(chan struct{})
	g.hold.Store(true)
	if id := nextOrGate(t, s, g, "the call after the used-up block"); id != 5 {
		t.Fatalf("call 5 got id %d, want 5 from the block reserved ahead", id)
	}
	if id := nextOrGate(t, s, g, "the next call"); id != 6 {
		t.Fatalf("call 6 got id %d", id)
	}
}
