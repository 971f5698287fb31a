package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestEditOwnerAPI: create unless present (also under a race), an owner's
// edits in one transaction (a rule's error changes nothing), the
// completion log by position with deleted rollouts counted, events per
// rollout removed with it, and settings; on SQLite and PostgreSQL.
func TestEditOwnerAPI(t *testing.T) {
	each(t, func(t *testing.T, q *Queue, c *clock) {
		ctx := context.Background()
		var wg sync.WaitGroup
		created := make(chan bool, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, ok, err := q.CreateIfAbsent(ctx, Task{RolloutID: "r1", Input: json.RawMessage(`{"q":1}`)})
				if err != nil {
					t.Error(err)
				}
				created <- ok
			}()
		}
		wg.Wait()
		close(created)
		n := 0
		for ok := range created {
			if ok {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("concurrent creates of one id: %d created", n)
		}
		st, ok, err := q.CreateIfAbsent(ctx, Task{RolloutID: "r1", Input: json.RawMessage(`"other"`)})
		if err != nil || ok || string(st.Input) != `{"q":1}` || st.Status != StatusQueued {
			t.Fatalf("second create: %+v %v %v", st, ok, err)
		}
		if _, _, err := q.CreateIfAbsent(ctx, Task{RolloutID: "r2", Input: json.RawMessage(`2`)}); err != nil {
			t.Fatal(err)
		}

		boom := errors.New("rule says no")
		if _, _, err := q.Update(ctx, "r1", func(*State) (*Edit, error) { return nil, boom }); !errors.Is(err, boom) {
			t.Fatalf("rule error: %v", err)
		}
		if _, _, err := q.Update(ctx, "nope", func(*State) (*Edit, error) { return &Edit{}, nil }); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing rollout: %v", err)
		}
		running, attempt := StatusRunning, "0"
		c.advance(time.Second)
		st, ch, err := q.Update(ctx, "r1", func(*State) (*Edit, error) {
			return &Edit{Status: &running, AttemptID: &attempt, Metadata: json.RawMessage(`{"v":2}`)}, nil
		})
		if err != nil || st.Status != StatusRunning || st.AttemptID != "0" || st.AttemptNo != 1 || string(st.Metadata) != `{"v":2}` ||
			ch == nil || ch.Attempt.Status != StatusRunning || st.UpdatedNano <= st.CreatedNano || st.LeaseExpiresNano != 0 {
			t.Fatalf("to running: %+v %+v %v", st, ch, err)
		}
		msg := "note"
		if _, ch, err := q.Update(ctx, "r1", func(*State) (*Edit, error) { return &Edit{LastError: &msg}, nil }); err != nil || ch != nil {
			t.Fatalf("field-only edit: a change to mirror? %+v %v", ch, err)
		}
		// Expire leaves an owner-run rollout alone (no lease).
		c.advance(time.Hour)
		if chs, err := q.Expire(ctx); err != nil || len(chs) != 0 {
			t.Fatalf("expire: %+v %v", chs, err)
		}
		failed, done := StatusFailed, StatusSucceeded
		if _, _, err := q.Update(ctx, "r2", func(*State) (*Edit, error) { return &Edit{Status: &failed}, nil }); err != nil {
			t.Fatal(err)
		}
		st, ch, err = q.Update(ctx, "r1", func(*State) (*Edit, error) { return &Edit{Status: &done}, nil })
		if err != nil || st.CompletionSeq != 2 || ch.Attempt.Status != StatusSucceeded || ch.Attempt.EndedNano == 0 {
			t.Fatalf("to succeeded: %+v %+v %v", st, ch, err)
		}
		if att, err := q.Attempts(ctx, "r1"); err != nil || len(att) != 1 || att[0].Status != StatusSucceeded || att[0].StartedNano == 0 {
			t.Fatalf("attempt history: %+v %v", att, err)
		}

		if err := q.AddEvent(ctx, &Event{RolloutID: "r1", AttemptID: "0", Type: "reward", Data: json.RawMessage(`{"value":1}`)}); err != nil {
			t.Fatal(err)
		}
		if err := q.AddEvent(ctx, &Event{RolloutID: "r1", AttemptID: "0", Type: "x", Data: json.RawMessage(`{`)}); err == nil {
			t.Fatal("event data that is not JSON accepted")
		}
		if err := q.AddEvent(ctx, &Event{RolloutID: "nope", Type: "x"}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("event of a missing rollout: %v", err)
		}
		if err := q.AddEvent(ctx, &Event{RolloutID: "r1", AttemptID: "1", Type: "y", Data: json.RawMessage(`"ééé"`)}); err != nil {
			t.Fatal(err)
		}
		evs, err := q.EventHeads(ctx, "r1", "0")
		if err != nil || len(evs) != 1 || evs[0].Seq == 0 || evs[0].Data != nil || evs[0].Size != int64(len(`{"value":1}`)) || evs[0].Type != "reward" {
			t.Fatalf("event heads of attempt 0: %+v %v", evs, err)
		}
		if all, err := q.EventHeads(ctx, "r1", ""); err != nil || len(all) != 2 || all[1].AttemptID != "1" || all[1].Seq <= all[0].Seq {
			t.Fatalf("event heads of every attempt: %+v %v", all, err)
		}
		if first, err := q.EventAttempts(ctx, "r1"); err != nil || len(first) != 2 || first["0"] != evs[0].TimeNano || first["1"] < first["0"] {
			t.Fatalf("event attempts: %v %v", first, err)
		}
		// Sizes and parts count characters: a part never splits one.
		if all, _ := q.EventHeads(ctx, "r1", "1"); len(all) != 1 || all[0].Size != 5 {
			t.Fatalf("size of \"ééé\": %+v, want 5 characters", all)
		} else if part, err := q.EventData(ctx, "r1", all[0].Seq, 1, 2); err != nil || part != "éé" {
			t.Fatalf("characters 1-2 of \"ééé\": %q %v", part, err)
		}
		if e, err := q.Event(ctx, "r1", evs[0].Seq); err != nil || string(e.Data) != `{"value":1}` || e.AttemptID != "0" {
			t.Fatalf("event: %+v %v", e, err)
		}
		var parts []string
		for from := int64(0); from <= evs[0].Size; from += 4 {
			part, err := q.EventData(ctx, "r1", evs[0].Seq, from, 4)
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, part)
		}
		if got := strings.Join(parts, "|"); got != `{"va|lue"|:1}` {
			t.Fatalf("event data in parts of 4: %s", got)
		}
		if part, err := q.EventData(ctx, "r1", evs[0].Seq, evs[0].Size, 4); err != nil || part != "" {
			t.Fatalf("event data past the end: %q %v", part, err)
		}
		if _, err := q.EventData(ctx, "r2", evs[0].Seq, 0, 4); !errors.Is(err, ErrNotFound) {
			t.Fatalf("event data of another rollout: %v, want ErrNotFound", err)
		}
		if _, err := q.Event(ctx, "r2", evs[0].Seq); !errors.Is(err, ErrNotFound) {
			t.Fatalf("event of another rollout: %v, want ErrNotFound", err)
		}

		if total, err := q.Completed(ctx); err != nil || total != 2 {
			t.Fatalf("completed: %d %v", total, err)
		}
		if found, err := q.Delete(ctx, "r2"); err != nil || !found {
			t.Fatalf("delete: %v %v", found, err)
		}
		if found, err := q.Delete(ctx, "r2"); err != nil || found {
			t.Fatalf("delete again: %v %v", found, err)
		}
		list, err := q.CompletedRange(ctx, 0, 2)
		if total, _ := q.Completed(ctx); err != nil || len(list) != 1 || list[0].RolloutID != "r1" || total != 2 {
			t.Fatalf("completion log after a delete: %+v %v", list, err)
		}
		if list, err := q.ListStatuses(ctx, []string{StatusSucceeded, StatusQueued}, 10); err != nil || len(list) != 1 {
			t.Fatalf("list statuses: %+v %v", list, err)
		}
		q.Delete(ctx, "r1")
		if evs, err := q.EventHeads(ctx, "r1", ""); err != nil || len(evs) != 0 {
			t.Fatalf("events outlive their rollout: %+v %v", evs, err)
		}

		if _, ok, err := q.Setting(ctx, "s"); err != nil || ok {
			t.Fatalf("unset setting: %v %v", ok, err)
		}
		for _, v := range []string{"a", "b"} {
			if err := q.PutSetting(ctx, "s", v); err != nil {
				t.Fatal(err)
			}
		}
		if v, ok, err := q.Setting(ctx, "s"); err != nil || !ok || v != "b" {
			t.Fatalf("setting: %q %v %v", v, ok, err)
		}
	})
}
