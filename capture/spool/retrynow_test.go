package spool

import (
	"context"
	"fmt"
	"github.com/rollgate/rollgate/testkit/testenv"
	"testing"
	"time"
)

// TestRetryNowEndsBackoff: with a backoff of an hour, a spooled batch is
// replayed as soon as RetryNow says the sink is back.
func TestRetryNowEndsBackoff(t *testing.T) {
	sink := newMemSink()
	sink.setDown(true)
	cfg := fastConfig(t.TempDir())
	cfg.RetryMin, cfg.RetryMax = time.Hour, time.Hour
	s := open(t, cfg, sink)
	if err := s.Write(context.Background(), batch(0)); err != nil {
		t.Fatal(err)
	}
	// The direct write failed and the batch was spooled; wait until the
	// replayer has failed once too (it is then in its hour of backoff).
	testenv.WaitFor(t, 20*time.Second, func() string { return fmt.Sprintf("the replayer to try the sink: stats = %+v", s.Stats()) },
		func() bool { return s.Stats().ReplayErrors > 0 })
	sink.setDown(false)
	s.RetryNow()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Drain(ctx); err != nil {
		t.Fatalf("RetryNow did not end the backoff: %v", err)
	}
	if got := sink.rows(); len(got) != 2 {
		t.Fatalf("sink holds %v, want rows 0 and 1", got)
	}
}
