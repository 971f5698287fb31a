// Package tasks is the algorithm's side of the training loop: a durable task
// queue with leases, retries and a completion cursor, and versioned named
// resources. The algorithm enqueues tasks and publishes resources; runners
// dequeue a task (getting a rollout id, a fresh attempt id and the resources
// version to use), heartbeat to keep the lease, and report the attempt's end.
// An attempt that fails or whose lease expires is retried as a new attempt up
// to the task's max_attempts, then the rollout fails. Completed rollouts get a
// completion sequence number, a cursor the algorithm pages through in
// completion order.
//
// State lives in SQL: the embedded SQLite file by default, PostgreSQL when
// several gateways share one queue. Every state change is one transaction;
// dequeue is a single conditional UPDATE (FOR UPDATE SKIP LOCKED on
// PostgreSQL), so two runners never get the same attempt.
package tasks

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// Rollout states.
const (
	StatusQueued    = "queued"
	StatusRunning   = "running"
	StatusSucceeded = "succeeded"
	StatusFailed    = "failed"
	StatusCancelled = "cancelled"
)

// Errors callers map to HTTP statuses.
var (
	// ErrNotFound: no such rollout in the queue.
	ErrNotFound = errors.New("tasks: rollout not found")
	// ErrStale: the attempt named is not the rollout's current running attempt
	// (its lease expired and the rollout moved on, or it already ended).
	ErrStale = errors.New("tasks: attempt is not the rollout's current running attempt")
	// ErrNoResources: no resources have been published (or not that version).
	ErrNoResources = errors.New("tasks: no such resources version")
	// ErrWrongWorker: the attempt is current but leased to another worker
	// than the one that reported for it.
	ErrWrongWorker = errors.New("tasks: the attempt is leased to another worker")
	// ErrAttemptRequired: a report on a leased rollout did not name its attempt.
	ErrAttemptRequired = errors.New("tasks: the rollout is leased: name the attempt")
	// ErrInvalidTask: a task (or a list of them) is malformed or out of range;
	// the message names the task and the field.
	ErrInvalidTask = errors.New("tasks: invalid task")
	// ErrNotQueued: the rollout has left the queue (it is running or
	// finished), so it cannot be removed as a queued task.
	ErrNotQueued = errors.New("tasks: the rollout is not queued")
)

// Ranges of a task's numbers (POST /api/v1/tasks). Zero means the default
// for each; anything outside is refused with ErrInvalidTask.
const (
	// MaxLease is the longest lease_s: a lease is renewed by heartbeats, so
	// it needs to outlast only the gap between two of them.
	MaxLease = 24 * time.Hour
	// MaxTimeout is the longest timeout_s: one attempt's wall time.
	MaxTimeout = 7 * 24 * time.Hour
	// MinDuration is the shortest non-zero lease_s or timeout_s.
	MinDuration = time.Millisecond
	// MaxMaxAttempts is the largest max_attempts.
	MaxMaxAttempts = 1000
)

// invalidTask is an ErrInvalidTask with its own message.
type invalidTask struct{ msg string }

func (e *invalidTask) Error() string        { return e.msg }
func (e *invalidTask) Is(target error) bool { return target == ErrInvalidTask }

func invalidf(format string, args ...any) error {
	return &invalidTask{msg: fmt.Sprintf(format, args...)}
}

// seconds checks a duration in seconds against (0 or [MinDuration, max]) and
// returns it in nanoseconds; NaN and infinities are out of range.
func seconds(i int, field string, v float64, max time.Duration) (int64, error) {
	if v == 0 {
		return 0, nil
	}
	if !(v >= MinDuration.Seconds() && v <= max.Seconds()) {
		return 0, invalidf("task %d: %s %g is out of range: 0 (the default) or %g to %g seconds", i, field, v,
			MinDuration.Seconds(), max.Seconds())
	}
	return int64(math.Round(v * float64(time.Second))), nil
}

// Task is what the algorithm enqueues.
type Task struct {
	// TaskID groups rollouts of the same task (the GRPO group).
	TaskID string `json:"task_id"`
	// RolloutID is optional; a fresh one is made when empty.
	RolloutID string `json:"rollout_id,omitempty"`
	// Input is the task's payload, handed to the runner as is.
	Input json.RawMessage `json:"input"`
	// Mode is "train" (default) or "val".
	Mode string `json:"mode,omitempty"`
	// MaxAttempts bounds retries (default 1: no retry; at most MaxMaxAttempts).
	MaxAttempts int `json:"max_attempts,omitempty"`
	// TimeoutS bounds one attempt's wall time from dequeue, heartbeats or not
	// (0: no bound besides the lease; else MinDuration to MaxTimeout).
	TimeoutS float64 `json:"timeout_s,omitempty"`
	// LeaseS is how long a lease lasts without a heartbeat (0: the queue's
	// default; else MinDuration to MaxLease).
	LeaseS float64 `json:"lease_s,omitempty"`
	// Metadata is free JSON kept with the rollout.
	Metadata json.RawMessage `json:"metadata,omitempty"`
	// GroupID is the training group (the trainer's uid). The gateway's
	// POST /api/v1/tasks mints one per task id per call when it is empty,
	// stores it in the rollouts table's group_id column and keeps it in
	// Metadata as "group_id" (the queue keeps only the metadata).
	GroupID string `json:"group_id,omitempty"`
}

// State is a rollout as the queue sees it.
type State struct {
	RolloutID        string          `json:"rollout_id"`
	TaskID           string          `json:"task_id"`
	Input            json.RawMessage `json:"input"`
	Mode             string          `json:"mode"`
	Metadata         json.RawMessage `json:"metadata"`
	Status           string          `json:"status"`
	AttemptID        string          `json:"attempt_id"`
	AttemptNo        int             `json:"attempt_no"`
	MaxAttempts      int             `json:"max_attempts"`
	WorkerID         string          `json:"worker_id"`
	ResourcesVersion int64           `json:"resources_version"`
	LeaseExpiresNano int64           `json:"lease_expires_unix_nano"`
	DeadlineNano     int64           `json:"deadline_unix_nano"`
	CreatedNano      int64           `json:"created_unix_nano"`
	UpdatedNano      int64           `json:"updated_unix_nano"`
	CompletedNano    int64           `json:"completed_unix_nano"`
	CompletionSeq    int64           `json:"completion_seq"`
	LastError        string          `json:"last_error"`
}

// Final reports whether the rollout has ended for good.
func (s *State) Final() bool {
	return s.Status == StatusSucceeded || s.Status == StatusFailed || s.Status == StatusCancelled
}

// Attempt is one attempt of a rollout, as recorded in the attempt history.
type Attempt struct {
	RolloutID   string `json:"rollout_id"`
	AttemptID   string `json:"attempt_id"`
	AttemptNo   int    `json:"attempt_no"`
	WorkerID    string `json:"worker_id"`
	Status      string `json:"status"` // running, succeeded, failed, cancelled, expired, timeout
	Reason      string `json:"reason"`
	StartedNano int64  `json:"started_unix_nano"`
	EndedNano   int64  `json:"ended_unix_nano"`
}

// Change is a state change the caller may want to mirror elsewhere (the
// rollouts table): the rollout after the change and the attempt it concerned.
type Change struct {
	State   State
	Attempt Attempt
}

// Resources is one published version of named resources.
type Resources struct {
	Version     int64                      `json:"version"`
	CreatedNano int64                      `json:"created_unix_nano"`
	Resources   map[string]json.RawMessage `json:"resources"`
}

// ListFilter selects rollouts for List.
type ListFilter struct {
	// Status: "" any, a state name, or "completed" (any final state).
	Status string
	// After is a completion cursor: only rollouts that completed after it, in
	// completion order. Setting it implies completed rollouts only.
	After int64
	// Cursor selects completion order even when After is 0.
	Cursor bool
	// IDs restricts to these rollouts.
	IDs []string
	// Limit bounds the answer (default 100, at most 10,000).
	Limit int
}

func (f *ListFilter) limit() int {
	switch {
	case f.Limit <= 0:
		return 100
	case f.Limit > 10000:
		return 10000
	}
	return f.Limit
}

func nanos(d time.Duration) int64 { return int64(d) }
