package spool

import (
	"context"
	"fmt"
	"slices"
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
// seconds later). While batches arrive faster than one sink write takes,
// a few stay spooled: the spool goes back to writing directly at the
// first gap in the load.
func TestReplayCatchesUpUnderLoad(t *testing.T) {
	sink := costlySink{memSink: newMemSink(), perWrite: 20 * time.Millisecond}
	cfg := fastConfig(t.TempDir())
	cfg.SyncInterval = time.Second // spilling at the producer's pace; fsync is not under test
	s := open(t, cfg, sink)
	defer closeSpool(t, s)

	sink.setDown(true)
	write(t, s, 0, 100) // the outage: 100 batches spooled
	sink.setDown(false)

	var next atomic.Int64
	next.Store(100)
	stop, done := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
			i := next.Load()
			if err := s.Write(context.Background(), batch(int(i))); err != nil {
				done <- fmt.Errorf("batch %d: %w", i, err)
				return
			}
			next.Add(1)
		}
	}()
	testenv.WaitFor(t, 20*time.Second, func() string {
		sink.mu.Lock()
		w, r := sink.writes, len(sink.got)
		sink.mu.Unlock()
		return fmt.Sprintf("the backlog down to 10 batches while the producer writes: %d batches spooled after %d written (%d sink writes, %d rows stored)", s.Stats().Records, next.Load(), w, r)
	}, func() bool { return s.Stats().Records <= 10 && next.Load() > 200 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	drain(t, s)
	n := int(next.Load())
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
