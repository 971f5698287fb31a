package clickhouse

import (
	"context"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// count returns the number of rows of table.
func count(t *testing.T, s *Store, table string) string {
	t.Helper()
	res, err := s.Query(context.Background(), "SELECT count() FROM "+table)
	if err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return res.Rows[0][0]
}

// TestWriteOnceSkipsStoredRows: a batch sent again after a write that stored
// part of it (here: only its llm_calls, as when the rewards insert fails) is
// completed, not duplicated, and a batch sent a third time adds nothing.
func TestWriteOnceSkipsStoredRows(t *testing.T) {
	for _, ext := range []bool{false, true} {
		t.Run(map[bool]string{false: "batch", true: "external"}[ext], func(t *testing.T) {
			ctx := context.Background()
			s := openStore(t, Options{ExternalInsert: ext})
			full := &export.Batch{
				Calls: []export.Call{storetest.FullCall("r1", "a1", 1, 0), storetest.FullCall("r1", "a1", 1, 1), storetest.FullCall("r1", "a1", 2, 0)},
				Rewards: []export.Reward{
					{RolloutID: "r1", AttemptID: "a1", Name: "score", Value: 1, Source: "api", TimeUnixNano: 10},
					{RolloutID: "r1", AttemptID: "a1", SequenceID: 2, Name: "air", Value: -0.5, Source: "air_length", TimeUnixNano: 10},
				},
				Rollouts: []export.Rollout{{RolloutID: "r1", AttemptID: "a1", Status: "running", Metadata: "{}", CreatedUnixNano: 5, UpdatedUnixNano: 7}},
				Spans:    []export.Span{{RolloutID: "r1", AttemptID: "a1", TraceID: "0123456789abcdef0123456789abcdef", SpanID: "0123456789abcdef", Name: "tool", Attributes: "{}"}},
			}
			// Two choices of one request share their span id (FullCall's is per sequence id).
			if err := s.Write(ctx, &export.Batch{Calls: full.Calls[:2]}); err != nil {
				t.Fatalf("Write (partial): %v", err)
			}
			for try := 1; try <= 2; try++ {
				if err := s.WriteOnce(ctx, full); err != nil {
					t.Fatalf("WriteOnce try %d: %v", try, err)
				}
				for table, want := range map[string]string{"llm_calls": "3", "rewards": "2", "rollouts": "1", "agent_spans": "1"} {
					if got := count(t, s, table); got != want {
						t.Errorf("try %d: %s has %s rows, want %s", try, table, got, want)
					}
				}
			}
			got, err := s.Calls(ctx, export.CallFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if d := storetest.EqualCalls(got, full.Calls); d != "" {
				t.Errorf("stored calls differ: %s", d)
			}

			// A reward that differs from a stored one only in its value, and a
			// later state of the same rollout, are new rows.
			more := &export.Batch{
				Rewards:  []export.Reward{{RolloutID: "r1", AttemptID: "a1", Name: "score", Value: 2, Source: "api", TimeUnixNano: 10}},
				Rollouts: []export.Rollout{{RolloutID: "r1", AttemptID: "a1", Status: "succeeded", Metadata: "{}", CreatedUnixNano: 5, UpdatedUnixNano: 7}},
			}
			if err := s.WriteOnce(ctx, more); err != nil {
				t.Fatalf("WriteOnce: %v", err)
			}
			if got := count(t, s, "rewards"); got != "3" {
				t.Errorf("rewards: %s rows, want 3", got)
			}
			if got := count(t, s, "rollouts"); got != "2" {
				t.Errorf("rollouts: %s rows, want 2", got)
			}
		})
	}
}

// TestWriteAgainUsesWriteOnce: the helper the spool and the capture retries
// call picks WriteOnce for ClickHouse.
func TestWriteAgainUsesWriteOnce(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	b := &export.Batch{Calls: []export.Call{storetest.FullCall("r1", "a1", 1, 0)}}
	for i := 0; i < 3; i++ {
		if err := export.WriteAgain(ctx, s, b); err != nil {
			t.Fatal(err)
		}
	}
	if got := count(t, s, "llm_calls"); got != "1" {
		t.Errorf("llm_calls: %s rows after three WriteAgain of one call, want 1", got)
	}
}

// TestWriteOnceStoresARowTwiceInTheBatchOnce: one batch holding the same
// rows twice (a spool replay merging two spooled copies of a call: its
// direct write timed out after ClickHouse committed it, and capture's WAL
// replayed it after a restart) stores each row once.
func TestWriteOnceStoresARowTwiceInTheBatchOnce(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	call := storetest.FullCall("r1", "a1", 1, 0)
	reward := export.Reward{RolloutID: "r1", AttemptID: "a1", Name: "score", Value: 1, Source: "api", TimeUnixNano: 10}
	b := &export.Batch{Calls: []export.Call{call, storetest.FullCall("r1", "a1", 2, 0), call}, Rewards: []export.Reward{reward, reward}}
	if err := s.WriteOnce(ctx, b); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]string{"llm_calls": "2", "rewards": "1"} {
		if got := count(t, s, table); got != want {
			t.Errorf("%s has %s rows after one WriteOnce of a batch holding a row twice, want %s", table, got, want)
		}
	}
}
