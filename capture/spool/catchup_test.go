package spool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// costlySink is a memSink whose every write costs perWrite, as a
// ClickHouse insert does whatever its size.
type costlySink struct {
	*memSink
	perWrite time.Duration
}

func (c costlySink) Write(ctx context.Context, b *export.Batch) error {
	time.Sleep(c.perWrite) // the sink's cost per write, not a wait for a condition
	return c.memSink.Write(ctx, b)
}

// TestReplayCatchesUpUnderLoad: after an outage that spooled 100 batches,
// a producer keeps writing a batch every 5 ms to a sink whose writes cost
// 20 ms each. New batches go behind the spooled ones (order), so the
// backlog shrinks only if the replayer sends more than one batch per
// write: while the producer still runs it must fall to what arrives during
// about two writes (10 batches), and every row be stored once and in
// order. Before, the replayer sent one spooled batch per write (50 a
// second against 200 arriving) and the spool grew for as long as the load
// lasted (drill e: 84 batches at a ClickHouse shard's heal, 145 ten
// seconds later). That the spool then empties under the load is
// TestSpoolEmptiesUnderSteadyLoad.
func TestReplayCatchesUpUnderLoad(t *testing.T) {
	sink := costlySink{memSink: newMemSink(), perWrite: 20 * time.Millisecond}
	cfg := fastConfig(t.TempDir())
	cfg.SyncInterval = time.Second // spilling at the producer's pace; fsync is not under test
	s := open(t, cfg, sink)
	defer closeSpool(t, s)

	sink.setDown(true)
	write(t, s, 0, 100) // the outage: 100 batches spooled
	sink.setDown(false)

	next, stopProducer := steadyProducer(s, 100)
	testenv.WaitFor(t, 20*time.Second, func() string {
		sink.mu.Lock()
		w, r := sink.writes, len(sink.got)
		sink.mu.Unlock()
		return fmt.Sprintf("the backlog down to 10 batches while the producer writes: %d batches spooled after %d written (%d sink writes, %d rows stored)", s.Stats().Records, next(), w, r)
	}, func() bool { return s.Stats().Records <= 10 && next() > 200 })
	if err := stopProducer(); err != nil {
		t.Fatal(err)
	}
	drain(t, s)
	n := int(next())
	if got := sink.rows(); !slices.Equal(got, wantRows(n)) {
		t.Fatalf("stored %d rows, want rows 0..%d once each in order", len(got), 2*n-1)
	}
}

// TestRestartAfterMergedReplays: replay writes that merge several spooled
// batches (a segment's worth at most) are acknowledged batch by batch once
// the sink took them; a restart after two such writes neither sends their
// batches again nor skips any.
func TestRestartAfterMergedReplays(t *testing.T) {
	dir := t.TempDir()
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(dir)
	cfg.SegmentBytes = 3000
	s := open(t, cfg, sink)
	write(t, s, 0, 30)
	sink.mu.Lock()
	sink.down, sink.okLeft = false, 2
	sink.mu.Unlock()
	testenv.WaitFor(t, 20*time.Second, func() string { return fmt.Sprintf("2 replay writes accepted: stats = %+v", s.Stats()) },
		func() bool { sink.mu.Lock(); defer sink.mu.Unlock(); return sink.okLeft == 0 && sink.writes > 2 })
	closeSpool(t, s)
	st := s.Stats()
	stored := len(sink.rows())
	if stored <= 4 || st.Records != 30-stored/2 {
		t.Fatalf("after 2 accepted writes: %d rows stored, stats %+v; want more than 2 batches in those writes and the rest (%d) spooled", stored, st, 30-stored/2)
	}
	s2 := open(t, cfg, sink)
	if got := s2.Stats().Records; got != st.Records {
		t.Fatalf("recovered %d records, want %d", got, st.Records)
	}
	sink.setDown(false)
	drain(t, s2)
	if got := sink.rows(); !slices.Equal(got, wantRows(30)) {
		t.Fatalf("rows = %v\nwant %v", got, wantRows(30))
	}
}

// blockSink stores batches as ClickHouse's replicated tables store
// blocks: a batch identical to one it holds is dropped (block
// deduplication), and WriteOnce reads back nothing, as a replica that has
// not caught up yet does. Each write follows the next step of its script,
// then dflt: "ok", "fail" (nothing stored), "commit-fail" (stored, then
// the answer lost: an error) or "hang" (nothing stored; blocks until its
// context ends or release is closed, then fails).
type blockSink struct {
	mu      sync.Mutex
	script  []string
	dflt    string
	blocks  map[string]bool
	got     []uint64
	writes  int
	hanging int           // writes that hung
	release chan struct{} // closed: hanging writes fail
}

func (s *blockSink) Write(ctx context.Context, b *export.Batch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	step := s.dflt
	if len(s.script) > 0 {
		step, s.script = s.script[0], s.script[1:]
	}
	switch step {
	case "fail":
		return errDown
	case "hang":
		s.hanging++
		release := s.release
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-release:
		}
		s.mu.Lock()
		return errors.Join(errDown, ctx.Err())
	}
	var key []byte
	for _, c := range b.Calls {
		key = fmt.Appendf(key, "%d,", c.SequenceID)
	}
	if !s.blocks[string(key)] {
		s.blocks[string(key)] = true
		for _, c := range b.Calls {
			s.got = append(s.got, c.SequenceID)
		}
	}
	if step == "commit-fail" {
		return errors.New("committed, then the answer was lost")
	}
	return nil
}

// WriteOnce reads back no stored row (a lagging replica) and writes b.
func (s *blockSink) WriteOnce(ctx context.Context, b *export.Batch) error { return s.Write(ctx, b) }

func (s *blockSink) set(dflt string, script ...string) {
	s.mu.Lock()
	s.dflt, s.script = dflt, script
	s.mu.Unlock()
}

func (s *blockSink) stored() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	got := slices.Clone(s.got)
	slices.Sort(got)
	return got
}

// TestMergedReplaysStoreCommittedWritesOnce: a write the sink committed
// but answered with an error is sent again as the same write, so the
// sink's block deduplication drops it even when the rows cannot be read
// back (a lagging replica): the batch whose direct write failed so is
// replayed alone, not merged with the batches spooled behind it; a merged
// replay write that failed so is retried as it was, also after a restart.
// Merging them into other writes stored their rows twice (drill e, full
// form: 8 rows duplicated in the Distributed table).
func TestMergedReplaysStoreCommittedWritesOnce(t *testing.T) {
	t.Run("direct write committed", func(t *testing.T) {
		sink := &blockSink{blocks: map[string]bool{}}
		sink.set("fail", "commit-fail") // batch 0's direct write commits and fails; then the sink is down
		s := open(t, fastConfig(t.TempDir()), sink)
		defer closeSpool(t, s)
		write(t, s, 0, 10)
		sink.set("ok")
		drain(t, s)
		if got := sink.stored(); !slices.Equal(got, wantRows(10)) {
			t.Fatalf("stored rows %v\nwant each of %v once", got, wantRows(10))
		}
	})
	t.Run("merged replay committed, then a restart", func(t *testing.T) {
		dir := t.TempDir()
		sink := &blockSink{blocks: map[string]bool{}}
		sink.set("fail")
		s := open(t, fastConfig(dir), sink)
		write(t, s, 0, 10)
		// Batch 0 (its direct write failed) alone, then batches 1-9 merged:
		// committed, answered with an error; the sink down again.
		sink.set("fail", "ok", "commit-fail")
		testenv.WaitFor(t, 10*time.Second, func() string { return "the merged replay write sent" }, func() bool {
			sink.mu.Lock()
			defer sink.mu.Unlock()
			return len(sink.script) == 0 && sink.writes >= 13
		})
		write(t, s, 10, 13) // spooled behind: a merged write now would carry them too
		closeSpool(t, s)
		if got := len(sink.stored()); got != 20 {
			t.Fatalf("%d rows stored before the restart, want 20 (batches 0-9, the merged write committed)", got)
		}
		sink.set("ok")
		s2 := open(t, fastConfig(dir), sink)
		defer closeSpool(t, s2)
		drain(t, s2)
		if got := sink.stored(); !slices.Equal(got, wantRows(13)) {
			t.Fatalf("stored rows %v\nwant each of %v once", got, wantRows(13))
		}
	})
}

// TestSpoolEmptiesUnderSteadyLoad: after an outage that spooled 300
// batches, a producer keeps writing a batch every 5 ms to a sink whose
// writes cost 20 ms each, more often than one sink write takes. The spool
// must empty while the producer still writes (and the producer go on
// writing after it did), every row stored once and in order. Merging
// replayed batches alone is not enough: each replay write leaves behind
// the batches spooled while it ran, so a few stay spooled for as long as
// the load lasts, every batch goes through the disk and a replay, and
// RollgateExportBacklog fires after 15 minutes of a healthy sink. Once
// what is spooled fits in one replay write and the replayer keeps up, a
// Write waits for the drain and writes directly.
func TestSpoolEmptiesUnderSteadyLoad(t *testing.T) {
	sink := costlySink{memSink: newMemSink(), perWrite: 20 * time.Millisecond}
	cfg := fastConfig(t.TempDir())
	cfg.SyncInterval = time.Second // spilling at the producer's pace; fsync is not under test
	cfg.ReplayMaxRecords = 100     // the backlog takes several merged writes before a Write waits
	cfg.DirectTimeout = 5 * time.Second
	s := open(t, cfg, sink)
	defer closeSpool(t, s)

	sink.setDown(true)
	write(t, s, 0, 300) // the outage: 300 batches spooled
	sink.setDown(false)

	next, stopProducer := steadyProducer(s, 300)
	progress := func(what string) func() string {
		return func() string {
			sink.mu.Lock()
			w, r := sink.writes, len(sink.got)
			sink.mu.Unlock()
			return fmt.Sprintf("%s: %d batches spooled after %d written (%d sink writes, %d rows stored)", what, s.Stats().Records, next(), w, r)
		}
	}
	testenv.WaitFor(t, 20*time.Second, progress("the spool empty while the producer writes"),
		func() bool { return s.Stats().Records == 0 && next() > 310 })
	emptyAt := next()
	testenv.WaitFor(t, 20*time.Second, progress("the producer writing on after the spool emptied"),
		func() bool { return next() >= emptyAt+20 })
	if err := stopProducer(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Records != 0 {
		t.Fatalf("%d batches spooled again under steady load with a healthy sink (stats %+v)", st.Records, st)
	}
	n := int(next())
	if got := sink.rows(); !slices.Equal(got, wantRows(n)) {
		t.Fatalf("stored %d rows, want rows 0..%d once each in order", len(got), 2*n-1)
	}
}

// TestCatchUpWaitIsBounded: a Write that waits for a nearly drained spool
// (TestSpoolEmptiesUnderSteadyLoad) while the sink hangs again gives up
// after DirectTimeout and spools its batch, and the Writes after it spool
// at once until a replay write succeeds: a sink that fails again costs
// one wait, as it costs one failed direct write. Rows stay in order, once.
func TestCatchUpWaitIsBounded(t *testing.T) {
	sink := &blockSink{blocks: map[string]bool{}, release: make(chan struct{})}
	sink.set("fail")
	cfg := fastConfig(t.TempDir())
	cfg.DirectTimeout = 2 * time.Second
	s := open(t, cfg, sink)
	defer closeSpool(t, s)
	free := sync.OnceFunc(func() { close(sink.release) })
	defer free()      // before closeSpool, also when the test fails
	write(t, s, 0, 3) // the outage
	// Batch 0 (its direct write failed) is replayed alone and stored; the
	// merged write of batches 1-2 hangs.
	sink.set("hang", "ok")
	testenv.WaitFor(t, 10*time.Second, func() string { return fmt.Sprintf("the merged replay write hanging: stats %+v", s.Stats()) }, func() bool {
		sink.mu.Lock()
		defer sink.mu.Unlock()
		return sink.hanging > 0
	})
	began := time.Now()
	write(t, s, 3, 4)
	if took := time.Since(began); took < cfg.DirectTimeout {
		t.Fatalf("a Write behind a replayer that had just succeeded returned after %s, want a wait of DirectTimeout (%s) for the drain", took, cfg.DirectTimeout)
	}
	began = time.Now()
	write(t, s, 4, 5)
	if took := time.Since(began); took >= cfg.DirectTimeout/2 {
		t.Fatalf("the next Write took %s: it waited again for a replayer that had not caught up (DirectTimeout %s)", took, cfg.DirectTimeout)
	}
	if st := s.Stats(); st.Records != 4 {
		t.Fatalf("stats %+v, want batches 1-4 spooled", st)
	}
	sink.set("ok")
	free()
	drain(t, s)
	if got := sink.stored(); !slices.Equal(got, wantRows(5)) {
		t.Fatalf("stored rows %v\nwant each of %v once", got, wantRows(5))
	}
}

// steadyProducer writes batch i, i+1, … to s every 5 ms from a goroutine,
// as a gateway's capture does under steady load, starting at from. next
// returns the index of the batch it writes next (from..next()-1 are
// written); stop ends the producer and returns its first error.
func steadyProducer(s *Spool, from int) (next func() int64, stop func() error) {
	var n atomic.Int64
	n.Store(int64(from))
	quit, done := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				done <- nil
				return
			case <-tick.C:
			}
			i := n.Load()
			if err := s.Write(context.Background(), batch(int(i))); err != nil {
				done <- fmt.Errorf("batch %d: %w", i, err)
				return
			}
			n.Add(1)
		}
	}()
	return n.Load, func() error { close(quit); return <-done }
}
