package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rollgate/rollgate/testkit/testenv"
)

var postgresDSN string

func TestMain(m *testing.M) {
	dsn, stop, err := testenv.StartPostgres()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		os.Exit(1)
	}
	postgresDSN = dsn
	code := m.Run()
	stop()
	os.Exit(code)
}

// clock is a settable time source.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// each runs f against a fresh SQLite queue and a fresh PostgreSQL queue.
func each(t *testing.T, f func(t *testing.T, q *Queue, c *clock)) {
	for _, kind := range []string{"sqlite", "postgres"} {
		t.Run(kind, func(t *testing.T) {
			c := &clock{}
			c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
			dsn := filepath.Join(t.TempDir(), "queue.db")
			if kind == "postgres" {
				var err error
				if dsn, err = testenv.FreshPostgresDatabase(postgresDSN, t.Name()); err != nil {
					t.Fatal(err)
				}
			}
			q, err := Open(context.Background(), dsn, Options{Lease: 10 * time.Second, Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { q.Close() })
			f(t, q, c)
		})
	}
}

func mustDequeue(t *testing.T, q *Queue, worker string) *State {
	t.Helper()
	s, _, err := q.Dequeue(context.Background(), worker)
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		t.Fatalf("%s: nothing to dequeue", worker)
	}
	return s
}

func TestQueueLifecycle(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		if s, _, err := q.Dequeue(ctx, "w0"); err != nil || s != nil {
			t.Fatalf("empty queue: got %+v, %v", s, err)
		}
		res, err := q.PutResources(ctx, map[string]json.RawMessage{"sampling": json.RawMessage(`{"temperature":0.7}`)})
		if err != nil || res.Version != 1 {
			t.Fatalf("resources: %+v %v", res, err)
		}
		ids, err := q.Enqueue(ctx, []Task{
			{TaskID: "t1", Input: json.RawMessage(`{"q":"2+2"}`)},
			{TaskID: "t2", Input: json.RawMessage(`{"q":"3+3"}`), Mode: "val", Metadata: json.RawMessage(`{"k":1}`)},
		})
		if err != nil || len(ids) != 2 || ids[0] == ids[1] {
			t.Fatalf("enqueue: %v %v", ids, err)
		}
		a := mustDequeue(t, q, "w1")
		if a.RolloutID != ids[0] || a.TaskID != "t1" || a.AttemptNo != 1 || a.Status != StatusRunning ||
			a.WorkerID != "w1" || a.ResourcesVersion != 1 || string(a.Input) != `{"q":"2+2"}` || a.Mode != "train" {
			t.Fatalf("first lease: %+v", a)
		}
		if want := c.now().Add(10 * time.Second).UnixNano(); a.LeaseExpiresNano != want {
			t.Fatalf("lease expires %d, want %d", a.LeaseExpiresNano, want)
		}
		// A newer resources version is what the next dequeue hands out.
		if _, err := q.PutResources(ctx, map[string]json.RawMessage{"sampling": json.RawMessage(`{"temperature":1}`)}); err != nil {
			t.Fatal(err)
		}
		b := mustDequeue(t, q, "w2")
		if b.RolloutID != ids[1] || b.ResourcesVersion != 2 || b.Mode != "val" || string(b.Metadata) != `{"k":1}` {
			t.Fatalf("second lease: %+v", b)
		}
		if s, _, _ := q.Dequeue(ctx, "w3"); s != nil {
			t.Fatalf("third dequeue got %+v", s)
		}
		// Heartbeat extends the lease.
		c.advance(5 * time.Second)
		exp, err := q.Heartbeat(ctx, a.RolloutID, a.AttemptID, "w1")
		if err != nil || exp != c.now().Add(10*time.Second).UnixNano() {
			t.Fatalf("heartbeat: %d %v", exp, err)
		}
		if _, err := q.Heartbeat(ctx, a.RolloutID, a.AttemptID, "someone-else"); !errors.Is(err, ErrWrongWorker) {
			t.Fatalf("heartbeat by another worker: %v", err)
		}
		if _, err := q.Heartbeat(ctx, a.RolloutID, a.AttemptID, ""); !errors.Is(err, ErrWrongWorker) {
			t.Fatalf("heartbeat by another worker: %v", err)
		}
		if _, err := q.Heartbeat(ctx, "nope", "x", ""); !errors.Is(err, ErrNotFound) {
			t.Fatalf("heartbeat of unknown rollout: %v", err)
		}
		ch, err := q.Complete(ctx, a.RolloutID, a.AttemptID, "w1", StatusSucceeded, "")
		if err != nil || ch.State.Status != StatusSucceeded || ch.State.CompletionSeq != 1 || ch.Attempt.Status != StatusSucceeded {
			t.Fatalf("complete: %+v %v", ch, err)
		}
		if _, err := q.Complete(ctx, a.RolloutID, a.AttemptID, "w1", StatusSucceeded, ""); !errors.Is(err, ErrStale) {
			t.Fatalf("second completion: %v", err)
		}
		// A leased attempt is named, by the worker it was leased to.
		if _, err := q.Complete(ctx, b.RolloutID, "", "w2", StatusCancelled, "stop"); !errors.Is(err, ErrAttemptRequired) {
			t.Fatalf("completion of a leased attempt without its id: %v", err)
		}
		if _, err := q.Complete(ctx, b.RolloutID, b.AttemptID, "w1", StatusCancelled, "stop"); !errors.Is(err, ErrWrongWorker) {
			t.Fatalf("completion by another worker: %v", err)
		}
		if _, err := q.Complete(ctx, b.RolloutID, b.AttemptID, "w2", StatusCancelled, "stop"); err != nil {
			t.Fatal(err)
		}
		done, next, err := q.List(ctx, ListFilter{Cursor: true})
		if err != nil || len(done) != 2 || done[0].RolloutID != a.RolloutID || done[1].Status != StatusCancelled || next != 2 {
			t.Fatalf("completed list: %+v next=%d %v", done, next, err)
		}
		more, next2, err := q.List(ctx, ListFilter{After: next})
		if err != nil || len(more) != 0 || next2 != next {
			t.Fatalf("after cursor: %+v %d %v", more, next2, err)
		}
		latest, err := q.GetResources(ctx, 0)
		if err != nil || latest.Version != 2 || string(latest.Resources["sampling"]) != `{"temperature":1}` {
			t.Fatalf("latest resources: %+v %v", latest, err)
		}
		v1, err := q.GetResources(ctx, 1)
		if err != nil || string(v1.Resources["sampling"]) != `{"temperature":0.7}` {
			t.Fatalf("resources v1: %+v %v", v1, err)
		}
		if _, err := q.GetResources(ctx, 9); !errors.Is(err, ErrNoResources) {
			t.Fatalf("missing version: %v", err)
		}
	})
}

func TestQueueRetriesExpiredAndFailedAttempts(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		ids, err := q.Enqueue(ctx, []Task{{TaskID: "t", MaxAttempts: 3, LeaseS: 2}, {TaskID: "later"}})
		if err != nil {
			t.Fatal(err)
		}
		a1 := mustDequeue(t, q, "crashy")
		c.advance(3 * time.Second) // no heartbeat: the lease runs out
		if _, err := q.Heartbeat(ctx, a1.RolloutID, a1.AttemptID, "crashy"); !errors.Is(err, ErrStale) {
			t.Fatalf("heartbeat after expiry: %v", err)
		}
		a2, changes, err := q.Dequeue(ctx, "w2")
		if err != nil {
			t.Fatal(err)
		}
		if len(changes) != 2 || changes[0].Attempt.Status != "expired" || changes[0].State.Status != StatusQueued {
			t.Fatalf("expiry changes: %+v", changes)
		}
		// The retried rollout keeps its place ahead of later tasks.
		if a2.RolloutID != ids[0] || a2.AttemptNo != 2 || a2.AttemptID == a1.AttemptID {
			t.Fatalf("retry: %+v (first %+v)", a2, a1)
		}
		if _, err := q.Complete(ctx, a1.RolloutID, a1.AttemptID, "crashy", StatusSucceeded, ""); !errors.Is(err, ErrStale) {
			t.Fatalf("late completion by the expired attempt: %v", err)
		}
		ch, err := q.Complete(ctx, a2.RolloutID, a2.AttemptID, "w2", StatusFailed, "agent crashed")
		if err != nil || ch.State.Status != StatusQueued || ch.Attempt.Status != StatusFailed {
			t.Fatalf("failed attempt 2: %+v %v", ch, err)
		}
		a3 := mustDequeue(t, q, "w3")
		if a3.RolloutID != ids[0] || a3.AttemptNo != 3 {
			t.Fatalf("attempt 3: %+v", a3)
		}
		ch, err = q.Complete(ctx, a3.RolloutID, a3.AttemptID, "w3", StatusFailed, "again")
		if err != nil || ch.State.Status != StatusFailed || ch.State.CompletionSeq == 0 {
			t.Fatalf("out of attempts: %+v %v", ch, err)
		}
		hist, err := q.Attempts(ctx, ids[0])
		if err != nil || len(hist) != 3 || hist[0].Status != "expired" || hist[1].Reason != "agent crashed" || hist[2].WorkerID != "w3" {
			t.Fatalf("history: %+v %v", hist, err)
		}
		// The deadline bounds an attempt even when it heartbeats.
		if _, err := q.Enqueue(ctx, []Task{{TaskID: "slow", TimeoutS: 5, LeaseS: 2}}); err != nil {
			t.Fatal(err)
		}
		later := mustDequeue(t, q, "w4")
		if later.TaskID != "later" {
			t.Fatalf("expected the later task, got %+v", later)
		}
		slow := mustDequeue(t, q, "w5")
		for i := 0; i < 3; i++ {
			c.advance(1500 * time.Millisecond)
			if _, err := q.Heartbeat(ctx, slow.RolloutID, slow.AttemptID, "w5"); err != nil {
				t.Fatalf("heartbeat %d: %v", i, err)
			}
		}
		c.advance(1 * time.Second) // 5.5 s since dequeue
		changes, err = q.Expire(ctx)
		if err != nil || len(changes) != 1 || changes[0].Attempt.Status != "timeout" || changes[0].State.Status != StatusFailed {
			t.Fatalf("deadline: %+v %v", changes, err)
		}
	})
}

// Many runners dequeue concurrently: every attempt goes to exactly one.
func TestQueueConcurrentDequeueHandsOutEachAttemptOnce(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		const n = 60
		tasks := make([]Task, n)
		for i := range tasks {
			tasks[i] = Task{TaskID: fmt.Sprint("t", i%6)}
		}
		if _, err := q.Enqueue(ctx, tasks); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		got := map[string]string{}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(worker string) {
				defer wg.Done()
				for {
					s, _, err := q.Dequeue(ctx, worker)
					if err != nil {
						errs <- err
						return
					}
					if s == nil {
						return
					}
					mu.Lock()
					if prev, dup := got[s.RolloutID]; dup {
						errs <- fmt.Errorf("%s handed to %s and %s", s.RolloutID, prev, worker)
					}
					got[s.RolloutID] = worker
					mu.Unlock()
				}
			}(fmt.Sprint("w", w))
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if len(got) != n {
			t.Fatalf("%d of %d rollouts handed out", len(got), n)
		}
	})
}

func TestQueueRegisterAndBadInput(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		ch, created, err := q.Register(ctx, "r1", "a1", "task", nil)
		if err != nil || !created || ch.State.Status != StatusRunning || ch.State.AttemptNo != 1 {
			t.Fatalf("register: %+v %v", ch, err)
		}
		// Registered rollouts hold no lease: the sweeper leaves them alone.
		c.advance(time.Hour)
		if changes, err := q.Expire(ctx); err != nil || len(changes) != 0 {
			t.Fatalf("expire touched a registered rollout: %+v %v", changes, err)
		}
		// Repeating the registration of a running rollout changes nothing.
		if ch, created, err := q.Register(ctx, "r1", "a1", "task", nil); err != nil || created || ch.State.AttemptNo != 1 || ch.State.Status != StatusRunning {
			t.Fatalf("repeated registration: %+v %v", ch, err)
		}
		if _, _, err := q.Register(ctx, "r1", "a2", "task", nil); !errors.Is(err, ErrExists) {
			t.Fatalf("registration of a running rollout with another attempt: %v", err)
		}
		if _, err := q.Complete(ctx, "r1", "a1", "", StatusFailed, "x"); err != nil {
			t.Fatal(err)
		}
		// A finished rollout is never resurrected: its completion stays the only one.
		if ch, _, err := q.Register(ctx, "r1", "a1", "task", nil); !errors.Is(err, ErrExists) {
			t.Fatalf("registration of a finished rollout: %+v %v", ch, err)
		}
		if n, err := q.Completed(ctx); err != nil || n != 1 {
			t.Fatalf("completions after the refused registration: %d %v", n, err)
		}
		if _, err := q.Complete(ctx, "r1", "a1", "", StatusSucceeded, ""); !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "is failed") {
			t.Fatalf("a status out of a final one: %v", err)
		}
		for _, bad := range [][]Task{
			{{TaskID: "x", Mode: "test"}},
			{{TaskID: "x", Input: json.RawMessage(`{`)}},
			{{TaskID: "x", TimeoutS: -1}},
			{{TaskID: "x", TimeoutS: 8e9}},
			{{TaskID: "x", LeaseS: 8e9}},
			{{TaskID: "x", LeaseS: 1e10}},
			{{TaskID: "x", LeaseS: math.Inf(1)}},
			{{TaskID: "x", LeaseS: math.NaN()}},
			{{TaskID: "x", MaxAttempts: -1}},
			{{TaskID: "x", MaxAttempts: MaxMaxAttempts + 1}},
			{{TaskID: "x", RolloutID: "a/b"}},
		} {
			if _, err := q.Enqueue(ctx, bad); !errors.Is(err, ErrInvalidTask) {
				t.Errorf("enqueue %+v: %v, want ErrInvalidTask", bad, err)
			}
		}
		if _, err := q.Complete(ctx, "r1", "", "", "done", ""); err == nil {
			t.Error("unknown status accepted")
		}
		if _, err := q.Complete(ctx, "missing", "", "", StatusSucceeded, ""); !errors.Is(err, ErrNotFound) {
			t.Errorf("complete unknown rollout: %v", err)
		}
	})
}
