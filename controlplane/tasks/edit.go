package tasks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// This file holds what a rollout owner other than the queue's own runners
// needs (the Agent Lightning surface, controlplane/agl): create a rollout
// unless it exists, edit its state under a caller's rule, delete it, read
// the completion log by position, and keep free-form events per attempt.
// The rollout stays one row of rg_tasks: the queue's runners, its cursor
// and rollgate's own API see it like any other.

const eventSchema = `
CREATE TABLE IF NOT EXISTS rg_events (
	seq        BIGINT PRIMARY KEY,
	rollout_id TEXT NOT NULL,
	attempt_id TEXT NOT NULL,
	event_type TEXT NOT NULL,
	time_ns    BIGINT NOT NULL,
	data       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rg_events_rollout ON rg_events (rollout_id, seq);
CREATE TABLE IF NOT EXISTS rg_settings (
	name  TEXT PRIMARY KEY,
	value TEXT NOT NULL
);
`

// ErrExists: Insert found a rollout with that id already.
var ErrExists = errors.New("tasks: rollout already exists")

// Event is a free-form event recorded on an attempt of a rollout.
type Event struct {
	Seq       int64           `json:"seq"`
	RolloutID string          `json:"rollout_id"`
	AttemptID string          `json:"attempt_id"`
	Type      string          `json:"event_type"`
	TimeNano  int64           `json:"time_unix_nano"`
	Data      json.RawMessage `json:"data"`
	// Size is the length of Data as stored, in characters (set by
	// EventHeads, which leaves Data nil).
	Size int64 `json:"-"`
}

// Edit is a change to one rollout, made by Update. Nil fields are left as
// they are.
type Edit struct {
	// Status is the new state (queued, running, succeeded, failed,
	// cancelled). Entering a final state gives the rollout the next
	// completion sequence number, once.
	Status *string
	// AttemptID is the current attempt; a running rollout's attempt is
	// recorded in the attempt history.
	AttemptID *string
	// LastError is the rollout's error message.
	LastError *string
	// Metadata replaces the rollout's metadata (a JSON value).
	Metadata json.RawMessage
}

// CreateIfAbsent adds t as a queued rollout unless a rollout with its
// RolloutID exists; either way it returns the stored rollout, and whether
// it was created now. t is defaulted and checked as Enqueue does.
func (q *Queue) CreateIfAbsent(ctx context.Context, t Task) (*State, bool, error) {
	if t.RolloutID != "" {
		if st, err := q.Get(ctx, t.RolloutID); err == nil {
			return st, false, nil
		} else if !errors.Is(err, ErrNotFound) {
			return nil, false, err
		}
	}
	ids, err := q.Enqueue(ctx, []Task{t})
	if err != nil {
		// A concurrent create of the same id won the insert: answer with it.
		if st, gerr := q.Get(ctx, t.RolloutID); t.RolloutID != "" && gerr == nil {
			return st, false, nil
		}
		return nil, false, err
	}
	st, err := q.Get(ctx, ids[0])
	return st, err == nil, err
}

// Update applies the edit f returns for the rollout's current state, in one
// transaction holding the row. f's error is returned as is and nothing
// changes; a nil edit changes nothing. The rollout after the change is
// returned, with the Change to mirror elsewhere when the status or attempt
// moved (nil otherwise).
func (q *Queue) Update(ctx context.Context, rolloutID string, f func(st *State) (*Edit, error)) (*State, *Change, error) {
	var out *State
	var ch *Change
	err := q.tx(ctx, func(t *sql.Tx) error {
		s, err := q.get(ctx, t, rolloutID, true)
		if err != nil {
			return err
		}
		e, err := f(s)
		if err != nil || e == nil {
			out = s
			return err
		}
		now := q.now().UnixNano()
		prev := *s
		if e.Status != nil {
			s.Status = *e.Status
		}
		if e.AttemptID != nil {
			s.AttemptID = *e.AttemptID
		}
		if e.LastError != nil {
			s.LastError = *e.LastError
		}
		if e.Metadata != nil {
			if !json.Valid(e.Metadata) {
				return fmt.Errorf("tasks: metadata of %s is not JSON", rolloutID)
			}
			s.Metadata = e.Metadata
		}
		s.UpdatedNano = now
		if s.Final() && !prev.Final() {
			if s.CompletionSeq, err = q.counter(ctx, t, "completion_seq", 1); err != nil {
				return err
			}
			s.CompletedNano = now
		}
		if s.Status == StatusRunning && prev.Status != StatusRunning {
			s.AttemptNo++
		}
		// A rollout edited by its owner has no lease: it is not the queue's
		// runners that keep it alive.
		_, err = t.ExecContext(ctx, q.sql(`UPDATE rg_tasks SET status = ?, attempt_id = ?, attempt_no = ?, last_error = ?,
			metadata = ?, updated_ns = ?, completed_ns = ?, completion_seq = ?, lease_expires_ns = 0, deadline_ns = 0
			WHERE rollout_id = ?`),
			s.Status, s.AttemptID, s.AttemptNo, s.LastError, string(s.Metadata), now, s.CompletedNano, s.CompletionSeq, rolloutID)
		if err != nil {
			return fmt.Errorf("tasks: updating %s: %w", rolloutID, err)
		}
		out = s
		if s.Status == prev.Status && s.AttemptID == prev.AttemptID {
			return nil
		}
		a := Attempt{RolloutID: rolloutID, AttemptID: s.AttemptID, AttemptNo: s.AttemptNo, Status: s.Status,
			Reason: s.LastError, StartedNano: now}
		if s.AttemptID != "" && s.Status != StatusQueued {
			if s.Final() {
				a.EndedNano = now
				_ = t.QueryRowContext(ctx, q.sql(`SELECT started_ns FROM rg_attempts WHERE rollout_id = ? AND attempt_id = ?`),
					rolloutID, s.AttemptID).Scan(&a.StartedNano)
			}
			if err := q.putAttempt(ctx, t, &a); err != nil {
				return err
			}
		}
		ch = &Change{State: *s, Attempt: a}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return out, ch, nil
}

// Delete removes a rollout, its attempt history and its events. Its
// completion sequence number is not reused. It reports whether the rollout
// existed.
func (q *Queue) Delete(ctx context.Context, rolloutID string) (bool, error) {
	var found bool
	err := q.tx(ctx, func(t *sql.Tx) error {
		var err error
		found, err = q.deleteRows(ctx, t, rolloutID)
		return err
	})
	return found, err
}

// DeleteQueued removes a rollout that waits in the queue (no attempt of it
// running or finished), with its history and events, and returns it as it
// was: ErrNotFound when there is no such rollout, ErrNotQueued (naming its
// status) when it is running or finished.
func (q *Queue) DeleteQueued(ctx context.Context, rolloutID string) (*State, error) {
	var st *State
	err := q.tx(ctx, func(t *sql.Tx) error {
		s, err := q.get(ctx, t, rolloutID, true)
		if err != nil {
			return err
		}
		if s.Status != StatusQueued {
			return fmt.Errorf("%w: rollout %s is %s (attempt %q)", ErrNotQueued, rolloutID, s.Status, s.AttemptID)
		}
		st = s
		_, err = q.deleteRows(ctx, t, rolloutID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// deleteRows deletes a rollout's rows in every table of the queue.
func (q *Queue) deleteRows(ctx context.Context, t *sql.Tx, rolloutID string) (bool, error) {
	res, err := t.ExecContext(ctx, q.sql(`DELETE FROM rg_tasks WHERE rollout_id = ?`), rolloutID)
	if err != nil {
		return false, fmt.Errorf("tasks: deleting %s: %w", rolloutID, err)
	}
	n, _ := res.RowsAffected()
	for _, table := range []string{"rg_attempts", "rg_events"} {
		if _, err := t.ExecContext(ctx, q.sql(`DELETE FROM `+table+` WHERE rollout_id = ?`), rolloutID); err != nil {
			return false, fmt.Errorf("tasks: deleting %s of %s: %w", table, rolloutID, err)
		}
	}
	return n > 0, nil
}

// Completed returns how many rollouts have entered a final state so far:
// the last completion sequence number handed out (deleted rollouts count).
func (q *Queue) Completed(ctx context.Context) (int64, error) {
	var v int64
	err := q.db.QueryRowContext(ctx, q.sql(`SELECT value FROM rg_counters WHERE name = ?`), "completion_seq").Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("tasks: reading the completion count: %w", err)
	}
	return v, nil
}

// ListStatuses returns up to limit rollouts whose status is one of
// statuses, in queue (creation) order.
func (q *Queue) ListStatuses(ctx context.Context, statuses []string, limit int) ([]State, error) {
	if len(statuses) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(statuses))
	for _, s := range statuses {
		args = append(args, s)
	}
	f := ListFilter{Limit: limit}
	query := `SELECT ` + stateCols + ` FROM rg_tasks WHERE status IN (?` + strings.Repeat(", ?", len(statuses)-1) +
		`) ORDER BY queue_seq LIMIT ` + strconv.Itoa(f.limit())
	return q.states(ctx, query, args...)
}

// CompletedRange returns the rollouts whose completion sequence number is
// in (after, upTo], in completion order (deleted ones are absent).
func (q *Queue) CompletedRange(ctx context.Context, after, upTo int64) ([]State, error) {
	return q.states(ctx, `SELECT `+stateCols+` FROM rg_tasks WHERE completion_seq > ? AND completion_seq <= ?
		ORDER BY completion_seq`, after, upTo)
}

func (q *Queue) states(ctx context.Context, query string, args ...any) ([]State, error) {
	rows, err := q.db.QueryContext(ctx, q.sql(query), args...)
	if err != nil {
		return nil, fmt.Errorf("tasks: listing rollouts: %w", err)
	}
	defer rows.Close()
	var out []State
	for rows.Next() {
		s, err := scanState(rows)
		if err != nil {
			return nil, fmt.Errorf("tasks: listing rollouts: %w", err)
		}
		out = append(out, *s)
	}
	return out, rows.Err()
}

// AddEvent records e (its Seq and, when zero, TimeNano are set) on its
// rollout; ErrNotFound when the rollout does not exist.
func (q *Queue) AddEvent(ctx context.Context, e *Event) error {
	if e.TimeNano == 0 {
		e.TimeNano = q.now().UnixNano()
	}
	if len(e.Data) == 0 {
		e.Data = json.RawMessage("{}")
	}
	if !json.Valid(e.Data) {
		return fmt.Errorf("tasks: event data is not JSON")
	}
	return q.tx(ctx, func(t *sql.Tx) error {
		if _, err := q.get(ctx, t, e.RolloutID, false); err != nil {
			return err
		}
		seq, err := q.counter(ctx, t, "event_seq", 1)
		if err != nil {
			return err
		}
		e.Seq = seq
		_, err = t.ExecContext(ctx, q.sql(`INSERT INTO rg_events (seq, rollout_id, attempt_id, event_type, time_ns, data)
			VALUES (?, ?, ?, ?, ?, ?)`), seq, e.RolloutID, e.AttemptID, e.Type, e.TimeNano, string(e.Data))
		if err != nil {
			return fmt.Errorf("tasks: recording an event of %s: %w", e.RolloutID, err)
		}
		return nil
	})
}

// EventHeads returns a rollout's events of attemptID ("" = every attempt)
// in the order recorded, without their data: Data is nil and Size its
// stored length in characters. A reader of many events reads each one's
// data with Event or, in parts, EventData.
func (q *Queue) EventHeads(ctx context.Context, rolloutID, attemptID string) ([]Event, error) {
	query, args := `SELECT seq, rollout_id, attempt_id, event_type, time_ns, length(data)
		FROM rg_events WHERE rollout_id = ?`, []any{rolloutID}
	if attemptID != "" {
		query, args = query+" AND attempt_id = ?", append(args, attemptID)
	}
	rows, err := q.db.QueryContext(ctx, q.sql(query+" ORDER BY seq"), args...)
	if err != nil {
		return nil, fmt.Errorf("tasks: reading events of %s: %w", rolloutID, err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		if err := rows.Scan(&e.Seq, &e.RolloutID, &e.AttemptID, &e.Type, &e.TimeNano, &e.Size); err != nil {
			return nil, fmt.Errorf("tasks: reading events of %s: %w", rolloutID, err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// Event reads one event of a rollout by its Seq; ErrNotFound when there is
// none (the rollout was deleted since its events were listed).
func (q *Queue) Event(ctx context.Context, rolloutID string, seq int64) (*Event, error) {
	var e Event
	var data string
	err := q.db.QueryRowContext(ctx, q.sql(`SELECT seq, rollout_id, attempt_id, event_type, time_ns, data
		FROM rg_events WHERE rollout_id = ? AND seq = ?`), rolloutID, seq).Scan(&e.Seq, &e.RolloutID, &e.AttemptID, &e.Type, &e.TimeNano, &data)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: reading event %d of %s: %w", seq, rolloutID, err)
	}
	e.Data, e.Size = json.RawMessage(data), int64(len(data))
	return &e, nil
}

// EventAttempts returns the attempts of a rollout that have events, with
// the time (unix ns) of each one's first, reading none of their data.
func (q *Queue) EventAttempts(ctx context.Context, rolloutID string) (map[string]int64, error) {
	rows, err := q.db.QueryContext(ctx, q.sql(`SELECT attempt_id, min(time_ns) FROM rg_events WHERE rollout_id = ? GROUP BY attempt_id`), rolloutID)
	if err != nil {
		return nil, fmt.Errorf("tasks: reading the attempts of %s: %w", rolloutID, err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var attempt string
		var first int64
		if err := rows.Scan(&attempt, &first); err != nil {
			return nil, fmt.Errorf("tasks: reading the attempts of %s: %w", rolloutID, err)
		}
		out[attempt] = first
	}
	return out, rows.Err()
}

// EventData reads up to n characters of an event's data from character
// from (0-based), as stored: a reader of a large event reads it in parts
// (Size, from EventHeads, is its length in characters). Past the end it
// returns "".
func (q *Queue) EventData(ctx context.Context, rolloutID string, seq, from, n int64) (string, error) {
	var data string
	err := q.db.QueryRowContext(ctx, q.sql(`SELECT substr(data, ?, ?) FROM rg_events WHERE rollout_id = ? AND seq = ?`),
		from+1, n, rolloutID, seq).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("tasks: reading event %d of %s: %w", seq, rolloutID, err)
	}
	return data, nil
}

// PutSetting stores a named value (state a surface keeps across restarts,
// such as the model endpoints Agent Lightning's trainer registered).
func (q *Queue) PutSetting(ctx context.Context, name, value string) error {
	_, err := q.db.ExecContext(ctx, q.sql(`INSERT INTO rg_settings (name, value) VALUES (?, ?)
		ON CONFLICT (name) DO UPDATE SET value = excluded.value`), name, value)
	if err != nil {
		return fmt.Errorf("tasks: storing setting %s: %w", name, err)
	}
	return nil
}

// Setting reads a named value; ok is false when it was never stored.
func (q *Queue) Setting(ctx context.Context, name string) (value string, ok bool, err error) {
	err = q.db.QueryRowContext(ctx, q.sql(`SELECT value FROM rg_settings WHERE name = ?`), name).Scan(&value)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("tasks: reading setting %s: %w", name, err)
	}
	return value, true, nil
}
