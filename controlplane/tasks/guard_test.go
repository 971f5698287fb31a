package tasks

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A rollout id already in the queue is ErrExists, and the list it came in
// is enqueued not at all; a duplicate inside one list too.
func TestQueueDuplicateRolloutIDIsErrExists(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		if _, err := q.Enqueue(ctx, []Task{{TaskID: "t", RolloutID: "dup"}}); err != nil {
			t.Fatal(err)
		}
		for _, list := range [][]Task{
			{{TaskID: "t", RolloutID: "fresh-1"}, {TaskID: "t", RolloutID: "dup"}},
			{{TaskID: "t", RolloutID: "fresh-2"}, {TaskID: "t", RolloutID: "fresh-2"}},
		} {
			if _, err := q.Enqueue(ctx, list); !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), "task 1: rollout_id") {
				t.Fatalf("enqueue %+v: %v, want ErrExists naming task 1", list, err)
			}
		}
		for _, id := range []string{"fresh-1", "fresh-2"} {
			if _, err := q.Get(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Fatalf("%s enqueued by a refused list: %v", id, err)
			}
		}
	})
}

// A queued row whose lease overflows when leased (a row of an older
// release, which took lease_s 8e9) is moved aside; the task after it is
// served, then the queue is empty.
func TestQueueUnservableRowMovedAside(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		ids, err := q.Enqueue(ctx, []Task{{TaskID: "bad"}, {TaskID: "good"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := q.db.ExecContext(ctx, q.sql(`UPDATE rg_tasks SET lease_ns = 9000000000000000000 WHERE rollout_id = ?`), ids[0]); err != nil {
			t.Fatal(err)
		}
		st := mustDequeue(t, q, "w")
		if st.RolloutID != ids[1] {
			t.Fatalf("dequeued %s, want the good task %s", st.RolloutID, ids[1])
		}
		if s, _, err := q.Dequeue(ctx, "w"); err != nil || s != nil {
			t.Fatalf("after the good task: %+v %v", s, err)
		}
		if _, err := q.Get(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the unservable row is still in the queue: %v", err)
		}
		var reason string
		if err := q.db.QueryRowContext(ctx, q.sql(`SELECT aside_reason FROM rg_tasks_aside WHERE rollout_id = ?`), ids[0]).Scan(&reason); err != nil || reason == "" {
			t.Fatalf("rg_tasks_aside: %q %v", reason, err)
		}
	})
}

func TestQueueDeleteQueued(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		ids, err := q.Enqueue(ctx, []Task{{TaskID: "a"}, {TaskID: "b"}})
		if err != nil {
			t.Fatal(err)
		}
		leased := mustDequeue(t, q, "w")
		if _, err := q.DeleteQueued(ctx, leased.RolloutID); !errors.Is(err, ErrNotQueued) || !strings.Contains(err.Error(), "is running") {
			t.Fatalf("delete of a leased rollout: %v", err)
		}
		if st, err := q.DeleteQueued(ctx, ids[1]); err != nil || st.TaskID != "b" {
			t.Fatalf("delete of a queued rollout: %+v %v", st, err)
		}
		if _, err := q.DeleteQueued(ctx, ids[1]); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if s, _, err := q.Dequeue(ctx, "w"); err != nil || s != nil {
			t.Fatalf("the deleted task was dequeued: %+v %v", s, err)
		}
	})
}
