package sqlite

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

func openTemp(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "sub dir", "rollgate?#%.db"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) export.Store { return openTemp(t) })
}

// TestDeploySQL runs every saved query in deploy/sql on SQLite too.
func TestDeploySQL(t *testing.T) {
	s := openTemp(t)
	defer s.Close()
	storetest.RunQueryFiles(t, s, "../../deploy/sql")
}

func TestOpenTwiceKeepsData(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "x.db")
	s1, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	call := storetest.FullCall("r1", "a1", 1, 0)
	if err := s1.Write(ctx, &export.Batch{Calls: []export.Call{call}}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	s2, err := Open(path)
	if err != nil {
		t.Fatalf("second Open: %v", err)
	}
	defer s2.Close()
	if err := s1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got, err := s2.Calls(ctx, export.CallFilter{})
	if err != nil {
		t.Fatalf("Calls: %v", err)
	}
	if d := storetest.EqualCalls(got, []export.Call{call}); d != "" {
		t.Fatal(d)
	}
	res, err := s2.Query(ctx, "PRAGMA journal_mode")
	if err != nil || len(res.Rows) != 1 || res.Rows[0][0] != "wal" {
		t.Fatalf("journal_mode = %v, %v; want wal", res, err)
	}
}

// TestTwoHandlesOneFile is the gateway writing while `rollgate sql` reads
// through a second handle on the same file (as another process would).
func TestTwoHandlesOneFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "shared.db")
	writer, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	reader, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	const batches = 30
	var wg sync.WaitGroup
	wg.Add(2)
	errs := make(chan error, 2)
	go func() {
		defer wg.Done()
		for i := 1; i <= batches; i++ {
			b := &export.Batch{Calls: []export.Call{storetest.FullCall("r", "a", uint64(i), 0)}}
			if err := writer.Write(ctx, b); err != nil {
				errs <- fmt.Errorf("write %d: %w", i, err)
				return
			}
		}
	}()
	go func() {
		defer wg.Done()
		last := 0
		for last < batches {
			res, err := reader.Query(ctx, "SELECT count(*) FROM llm_calls")
			if err != nil {
				errs <- fmt.Errorf("read: %w", err)
				return
			}
			var n int
			fmt.Sscan(res.Rows[0][0], &n)
			if n < last {
				errs <- fmt.Errorf("count went back from %d to %d", last, n)
				return
			}
			last = n
			// A second writer on the other handle competes for the lock.
			if err := reader.Write(ctx, &export.Batch{Rollouts: []export.Rollout{{RolloutID: "r", AttemptID: "a", UpdatedUnixNano: uint64(n)}}}); err != nil {
				errs <- fmt.Errorf("write from reader: %w", err)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestJSONArrays checks that the stored arrays work with SQLite's JSON functions.
func TestJSONArrays(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	defer s.Close()
	c := storetest.EmptyCall("r", "a", 1)
	c.PromptTokenIDs = []uint32{5, 6, 7}
	c.ResponseLogprobs = []float32{-0.5, float32(math.Inf(-1))}
	if err := s.Write(ctx, &export.Batch{Calls: []export.Call{c}}); err != nil {
		t.Fatal(err)
	}
	f := func(query, want string) {
		t.Helper()
		res, err := s.Query(ctx, query)
		if err != nil {
			t.Fatalf("Query(%s): %v", query, err)
		}
		if len(res.Rows) != 1 || res.Rows[0][0] != want {
			t.Fatalf("Query(%s) = %q, want %q", query, res.Rows, want)
		}
	}
	f("SELECT json_array_length(prompt_token_ids) FROM llm_calls", "3")
	f("SELECT sum(j.value) FROM llm_calls, json_each(llm_calls.prompt_token_ids) AS j", "18")
	f("SELECT json_array_length(response_logprobs) FROM llm_calls", "2")
	f("SELECT response_logprobs FROM llm_calls", "[-0.5,-Infinity]")
}

// TestWriteIsAtomic makes the rewards insert fail after the calls went in:
// the whole batch must be rolled back.
func TestWriteIsAtomic(t *testing.T) {
	ctx := context.Background()
	s := openTemp(t)
	defer s.Close()
	if _, err := s.DB().Exec("CREATE TRIGGER fail_rewards BEFORE INSERT ON rewards BEGIN SELECT RAISE(ABORT, 'boom'); END"); err != nil {
		t.Fatal(err)
	}
	err := s.Write(ctx, &export.Batch{
		Calls:   []export.Call{storetest.EmptyCall("r", "a", 1), storetest.EmptyCall("r", "a", 2)},
		Rewards: []export.Reward{{RolloutID: "r", Name: "primary", Value: 1}},
	})
	if err == nil {
		t.Fatal("Write with a failing rewards insert: no error")
	}
	res, err := s.Query(ctx, "SELECT count(*) FROM llm_calls")
	if err != nil || res.Rows[0][0] != "0" {
		t.Fatalf("llm_calls after failed write: %v %v; want 0 rows", res, err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Write(cancelled, &export.Batch{Calls: []export.Call{storetest.EmptyCall("r", "a", 3)}}); err == nil {
		t.Fatal("Write with a cancelled context: no error")
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(""); err == nil {
		t.Fatal("Open(\"\"): no error")
	}
	if _, err := Open(filepath.Join(t.TempDir(), "not-a-dir", "x.db") + "/"); err == nil {
		t.Fatal("Open(dir path): no error")
	}
}
