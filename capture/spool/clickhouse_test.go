package spool

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// TestClickHouseOutage runs the spool in front of a real ClickHouse that is
// killed and restarted during the writes, with a restart of the spool itself
// (same directory) in the middle of the outage. Every row must be stored
// exactly once.
func TestClickHouseOutage(t *testing.T) {
	srv, err := testenv.StartRestartableClickHouse()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	store, err := clickhouse.Open(ctx, testenv.FreshDatabase(srv.DSN(), "spool_outage"), clickhouse.Options{DialTimeout: time.Second, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	dir := t.TempDir()
	cfg := Config{Dir: dir, DirectTimeout: 3 * time.Second, ReplayTimeout: 3 * time.Second,
		RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond}
	sink := &ackOrder{Sink: store}
	s, err := New(cfg, sink, "clickhouse", prometheus.NewRegistry(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	write(t, s, 0, 10) // healthy: straight to ClickHouse
	if st := s.Stats(); st.SpilledRows != 0 {
		t.Fatalf("healthy server: stats = %+v", st)
	}

	srv.Kill() // crash: the outage starts
	write(t, s, 10, 30)
	if st := s.Stats(); st.Records != 20 {
		t.Fatalf("during the outage: stats = %+v, want 20 batches spooled", st)
	}
	// The gateway restarts during the outage: close the spool, open it again.
	closeSpool(t, s)
	s, err = New(cfg, sink, "clickhouse", prometheus.NewRegistry(), quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	if st := s.Stats(); st.Records != 20 {
		t.Fatalf("after the spool restart: stats = %+v, want the 20 batches back", st)
	}
	write(t, s, 30, 40)

	if err := srv.Start(); err != nil { // the outage ends
		t.Fatal(err)
	}
	write(t, s, 40, 50) // queued behind the backlog while it replays
	drain(t, s)
	st := s.Stats()
	closeSpool(t, s)

	if acked := sink.rows(); !slices.Equal(acked, wantRows(50)) {
		t.Fatalf("ClickHouse acknowledged rows in this order: %v\nwant 0..99 once each, in order", acked)
	}
	calls, err := store.Calls(ctx, export.CallFilter{RolloutID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]uint64, len(calls))
	for i, c := range calls {
		got[i] = c.SequenceID
		if c.SpanID != batch(int(c.SequenceID / 2)).Calls[c.SequenceID%2].SpanID || len(c.PromptTokenIDs) != 4 {
			t.Fatalf("row %d stored as %+v", c.SequenceID, c)
		}
	}
	if !slices.Equal(got, wantRows(50)) {
		t.Fatalf("stored rows (sorted by sequence id) = %v\nwant each of 0..99 exactly once", got)
	}
	t.Logf("ClickHouse outage: 40 batches (80 rows) written while it was down or catching up, %d rows replayed, %d replay attempts failed, 100/100 rows stored once",
		st.ReplayedRows, st.ReplayErrors)
}

// ackOrder records the rows of every batch its Sink acknowledged, in order.
type ackOrder struct {
	export.Sink
	mu  sync.Mutex
	got []uint64
}

func (a *ackOrder) Write(ctx context.Context, b *export.Batch) error {
	if err := a.Sink.Write(ctx, b); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range b.Calls {
		a.got = append(a.got, c.SequenceID)
	}
	return nil
}

// WriteOnce is the sink's WriteOnce (the spool replays through it), recorded like Write.
func (a *ackOrder) WriteOnce(ctx context.Context, b *export.Batch) error {
	if err := export.WriteAgain(ctx, a.Sink, b); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range b.Calls {
		a.got = append(a.got, c.SequenceID)
	}
	return nil
}

func (a *ackOrder) rows() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.got)
}

// lostAnswers is a real ClickHouse store whose answers get lost: the first
// writeFails Writes and the first onceFails WriteOnces store the batch and
// then report an error, as when the server commits an insert and the
// connection drops before its answer arrives.
type lostAnswers struct {
	*clickhouse.Store
	mu                    sync.Mutex
	writeFails, onceFails int
}

var errAnswerLost = errors.New("read: connection reset by peer (after the server committed)")

func (l *lostAnswers) Write(ctx context.Context, b *export.Batch) error {
	return l.answer(l.Store.Write(ctx, b), &l.writeFails)
}

func (l *lostAnswers) WriteOnce(ctx context.Context, b *export.Batch) error {
	return l.answer(l.Store.WriteOnce(ctx, b), &l.onceFails)
}

// answer is what the caller hears of a write that returned err: the error,
// or errAnswerLost while *fails is positive.
func (l *lostAnswers) answer(err error, fails *int) error {
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if *fails > 0 {
		*fails--
		return errAnswerLost
	}
	return nil
}

// TestClickHouseLostAnswerStoredOnce: batches whose insert ClickHouse
// committed without the spool hearing so (a direct write, then replays of
// it) are replayed and still stored exactly once.
func TestClickHouseLostAnswerStoredOnce(t *testing.T) {
	dsn, stop, err := testenv.StartClickHouse()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ctx := context.Background()
	dsn = testenv.FreshDatabase(dsn, "spool_lost_answer")
	if err := testenv.DropDatabase(ctx, dsn); err != nil {
		t.Fatal(err)
	}
	store, err := clickhouse.Open(ctx, dsn, clickhouse.Options{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sink := &lostAnswers{Store: store, writeFails: 3, onceFails: 2}
	s := open(t, fastConfig(t.TempDir()), sink)
	write(t, s, 0, 10)
	drain(t, s)
	st := s.Stats()
	if st.SpilledRows == 0 || st.ReplayErrors != 2 {
		t.Fatalf("stats = %+v: want spilled rows and 2 failed replays", st)
	}
	calls, err := store.Calls(ctx, export.CallFilter{RolloutID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]uint64, len(calls))
	for i, c := range calls {
		got[i] = c.SequenceID
	}
	if !slices.Equal(got, wantRows(10)) {
		t.Fatalf("stored rows (sorted by sequence id) = %v\nwant each of 0..19 exactly once", got)
	}
}
