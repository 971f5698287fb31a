package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
)

// SetTaskQueue mounts the training-loop routes (tasks, heartbeats, completed
// rollouts, resources) on q and starts sweeping expired leases every sweep.
// Call it before the gateway serves. Without a queue those routes answer 503.
func (s *Server) SetTaskQueue(q *tasks.Queue, sweep time.Duration) {
	s.queue.Store(q)
	if sweep <= 0 {
		sweep = time.Second
	}
	go func() {
		t := time.NewTicker(sweep)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				c, cancel := s.storeCtx()
				changes, err := q.Expire(c)
				if err != nil {
					s.log.Warn("task queue: sweeping expired leases", "err", err)
				}
				s.mirror(c, changes)
				cancel()
			}
		}
	}()
}

// needQueue answers 503 when no task queue is configured.
func (s *Server) needQueue(ctx *fasthttp.RequestCtx) bool {
	if s.queue.Load() == nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "the task queue is not configured on this gateway")
		return false
	}
	return true
}

// queueError answers for an error from the task queue.
func (s *Server) queueError(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, tasks.ErrNotFound), errors.Is(err, tasks.ErrNoResources):
		s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, err.Error())
	case errors.Is(err, tasks.ErrStale), errors.Is(err, tasks.ErrExists), errors.Is(err, tasks.ErrNotQueued):
		s.plainError(ctx, fasthttp.StatusConflict, errInvalidRequest, err.Error())
	case errors.Is(err, tasks.ErrWrongWorker):
		s.plainError(ctx, fasthttp.StatusForbidden, errPermission, err.Error())
	case errors.Is(err, tasks.ErrInvalidTask), errors.Is(err, tasks.ErrAttemptRequired):
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
	default:
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, err.Error())
	}
}

// mirror writes queue state changes to the rollouts table: each attempt's
// row carries its own outcome; a rollout sent back to the queue gets a row
// with an empty attempt id and status "queued" after it.
func (s *Server) mirror(c context.Context, changes []tasks.Change) {
	if len(changes) == 0 {
		return
	}
	var rows []export.Rollout
	for _, ch := range changes {
		st, a := ch.State, ch.Attempt
		status, group := st.Status, metadataGroupID(st.Metadata)
		if st.Status == tasks.StatusQueued || a.Status != tasks.StatusRunning {
			status = attemptOutcome(a.Status)
		}
		if st.Status == tasks.StatusRunning {
			s.rollouts.Store(st.RolloutID, &rolloutInfo{taskID: st.TaskID, groupID: group, createdNs: uint64(st.CreatedNano), metadata: string(st.Metadata)})
			s.gw.RegisterRollout(st.RolloutID, st.TaskID)
			if m, ok := s.gw.(interface{ SetRolloutMode(rolloutID, mode string) }); ok {
				m.SetRolloutMode(st.RolloutID, st.Mode)
			}
		}
		rows = append(rows, export.Rollout{RolloutID: st.RolloutID, AttemptID: a.AttemptID, TaskID: st.TaskID, GroupID: group,
			Status: status, Metadata: queueMetadata(&st, &a), CreatedUnixNano: uint64(st.CreatedNano),
			UpdatedUnixNano: uint64(st.UpdatedNano)})
		if st.Status == tasks.StatusQueued && a.AttemptID != "" {
			rows = append(rows, export.Rollout{RolloutID: st.RolloutID, TaskID: st.TaskID, GroupID: group, Status: tasks.StatusQueued,
				Metadata: queueMetadata(&st, nil), CreatedUnixNano: uint64(st.CreatedNano), UpdatedUnixNano: uint64(st.UpdatedNano) + 1})
		}
	}
	if err := s.store.Write(c, &export.Batch{Rollouts: rows}); err != nil {
		// The queue is the source of truth; the table is a view of it.
		s.log.Warn("task queue: mirroring rollout states to the rollouts table", "rows", len(rows), "err", err)
	}
}

// attemptOutcome maps an attempt's end to a rollouts-table status.
func attemptOutcome(a string) string {
	switch a {
	case "expired", "timeout":
		return tasks.StatusFailed
	}
	return a
}

// queueMetadata is the task's metadata with a "queue" object added (when the
// metadata is a JSON object): mode, attempt number, worker, resources
// version and why an attempt ended.
func queueMetadata(st *tasks.State, a *tasks.Attempt) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(st.Metadata, &m) != nil || m == nil {
		return string(st.Metadata)
	}
	q := map[string]any{"mode": st.Mode, "max_attempts": st.MaxAttempts, "resources_version": st.ResourcesVersion}
	if a != nil {
		q["attempt_no"], q["worker_id"], q["attempt_status"] = a.AttemptNo, a.WorkerID, a.Status
		if a.Reason != "" {
			q["reason"] = a.Reason
		}
	}
	b, _ := json.Marshal(q)
	m["queue"] = b
	out, _ := json.Marshal(m)
	return string(out)
}

// postTasks enqueues one task, a list, or {"tasks": [...]}.
func (s *Server) postTasks(ctx *fasthttp.RequestCtx) {
	if !s.needQueue(ctx) {
		return
	}
	body := strings.TrimSpace(string(ctx.PostBody()))
	var list []tasks.Task
	var err error
	switch {
	case strings.HasPrefix(body, "["):
		err = strictJSON(body, &list)
	case strings.HasPrefix(body, `{"tasks"`):
		var w struct {
			Tasks []tasks.Task `json:"tasks"`
		}
		err = strictJSON(body, &w)
		list = w.Tasks
	default:
		var one tasks.Task
		err = strictJSON(body, &one)
		list = []tasks.Task{one}
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body: "+err.Error())
		return
	}
	if len(list) == 0 {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "no tasks given")
		return
	}
	// One training group per task per enqueue call (a training step), as
	// verl and Agent Lightning mint a uid per prompt per step; a caller may
	// name its own. It is the rollouts table's group_id column, and kept in
	// the rollout's metadata as "group_id" too (for readers of older
	// releases, and the queue, which keeps only the metadata).
	minted := map[string]string{}
	for i := range list {
		t := &list[i]
		if msg := taskIDsError(t); msg != "" {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("task %d: %s", i, msg))
			return
		}
		if t.GroupID == "" {
			if minted[t.TaskID] == "" {
				minted[t.TaskID] = "grp-" + uuid.NewString()[:13]
			}
			t.GroupID = minted[t.TaskID]
		}
		if !gateway.ValidName([]byte(t.GroupID)) {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("task %d: group_id must be at most 256 bytes of UTF-8 without control characters", i))
			return
		}
		md, err := withGroupID(t.Metadata, t.GroupID)
		if err != nil {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("task %d: %v", i, err))
			return
		}
		t.Metadata = md
	}
	c, cancel := s.storeCtx()
	defer cancel()
	ids, err := s.queue.Load().Enqueue(c, list)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	now := uint64(time.Now().UnixNano())
	rows := make([]export.Rollout, len(ids))
	for i, id := range ids {
		st := tasks.State{TaskID: list[i].TaskID, Mode: list[i].Mode, MaxAttempts: list[i].MaxAttempts, Metadata: list[i].Metadata}
		rows[i] = export.Rollout{RolloutID: id, TaskID: list[i].TaskID, GroupID: list[i].GroupID, Status: tasks.StatusQueued,
			Metadata: queueMetadata(&st, nil), CreatedUnixNano: now, UpdatedUnixNano: now}
	}
	if err := s.store.Write(c, &export.Batch{Rollouts: rows}); err != nil {
		s.log.Warn("task queue: recording queued rollouts", "err", err)
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollout_ids": ids})
}

// taskIDsError says what is wrong with a task's ids (contract section 1.1),
// or "" when they are usable.
func taskIDsError(t *tasks.Task) string {
	switch {
	case t.RolloutID != "" && !gateway.ValidID([]byte(t.RolloutID)):
		return "rollout_id must be " + gateway.IDCharset + " (or absent, to have one made)"
	case !gateway.ValidName([]byte(t.TaskID)):
		return "task_id must be at most 256 bytes of UTF-8 without control characters"
	}
	return ""
}

// deleteTask serves DELETE /api/v1/tasks/{rollout_id}: a rollout still
// waiting in the queue is removed (the rollouts table records it as
// cancelled); 404 when unknown, 409 once an attempt of it has started.
func (s *Server) deleteTask(ctx *fasthttp.RequestCtx, rolloutID string) {
	if !s.needQueue(ctx) {
		return
	}
	c, cancel := s.storeCtx()
	defer cancel()
	st, err := s.queue.Load().DeleteQueued(c, rolloutID)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	reason := "removed from the queue (DELETE /api/v1/tasks)"
	st.Status, st.UpdatedNano, st.LastError = tasks.StatusCancelled, time.Now().UnixNano(), reason
	s.mirror(c, []tasks.Change{{State: *st, Attempt: tasks.Attempt{RolloutID: rolloutID, AttemptNo: st.AttemptNo,
		Status: tasks.StatusCancelled, Reason: reason}}})
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollout_id": rolloutID, "task_id": st.TaskID, "deleted": true})
}

// validWorker answers 400 (false) when a worker_id is given and is not a
// valid id (contract section 1.1).
func (s *Server) validWorker(ctx *fasthttp.RequestCtx, worker string) bool {
	if worker != "" && !gateway.ValidID([]byte(worker)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "worker_id must be "+gateway.IDCharset+" (or absent)")
		return false
	}
	return true
}

// metadataGroupID is the "group_id" string of a rollout's metadata, "" when
// there is none: where the queue keeps the group, and where rows written
// before the rollouts table had a group_id column have it.
func metadataGroupID(metadata []byte) string {
	if g := gjson.GetBytes(metadata, "group_id"); g.Type == gjson.String {
		return g.Str
	}
	return ""
}

// withGroupID returns metadata (a JSON object, or empty) with "group_id" set.
func withGroupID(metadata json.RawMessage, group string) (json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	if t := strings.TrimSpace(string(metadata)); t != "" && t != "null" {
		if err := json.Unmarshal(metadata, &m); err != nil || m == nil {
			return nil, errors.New(`"metadata" must be a JSON object`)
		}
	}
	g, _ := json.Marshal(group)
	m["group_id"] = g
	return json.Marshal(m)
}

// strictJSON decodes s into v, refusing unknown fields and trailing data.
func strictJSON(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// baseURL is the per-rollout base URL agents use.
func (s *Server) baseURL(rollout, attempt string) string {
	return fmt.Sprintf("%s/rollout/%s/attempt/%s/v1", s.cfg.PublicURL, rollout, attempt)
}

// dequeue leases the next task to a runner: 200 with the lease, or 204.
func (s *Server) dequeue(ctx *fasthttp.RequestCtx) {
	if !s.needQueue(ctx) {
		return
	}
	var in struct {
		WorkerID string `json:"worker_id"`
	}
	if len(ctx.PostBody()) > 0 && !s.decode(ctx, &in) {
		return
	}
	if !s.validWorker(ctx, in.WorkerID) {
		return
	}
	c, cancel := s.storeCtx()
	defer cancel()
	st, changes, err := s.queue.Load().Dequeue(c, in.WorkerID)
	s.mirror(c, changes)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	if st == nil {
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{
		"rollout_id": st.RolloutID, "attempt_id": st.AttemptID, "attempt_no": st.AttemptNo, "task_id": st.TaskID,
		"input": st.Input, "mode": st.Mode, "metadata": st.Metadata, "resources_version": st.ResourcesVersion,
		"base_url": s.baseURL(st.RolloutID, st.AttemptID), "lease_expires_unix_nano": st.LeaseExpiresNano,
		"deadline_unix_nano": st.DeadlineNano,
	})
}

func (s *Server) heartbeat(ctx *fasthttp.RequestCtx, rolloutID string) {
	if !s.needQueue(ctx) {
		return
	}
	var in struct {
		AttemptID string `json:"attempt_id"`
		WorkerID  string `json:"worker_id"`
	}
	if !s.decode(ctx, &in) {
		return
	}
	if !gateway.ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, `"attempt_id" is required: the attempt the dequeue answered (`+gateway.IDCharset+")")
		return
	}
	if !s.validWorker(ctx, in.WorkerID) {
		return
	}
	c, cancel := s.storeCtx()
	defer cancel()
	exp, err := s.queue.Load().Heartbeat(c, rolloutID, in.AttemptID, in.WorkerID)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollout_id": rolloutID, "attempt_id": in.AttemptID,
		"lease_expires_unix_nano": exp})
}

func stateView(st *tasks.State) map[string]any {
	return map[string]any{"rollout_id": st.RolloutID, "task_id": st.TaskID, "status": st.Status,
		"attempt_id": st.AttemptID, "attempt_no": st.AttemptNo, "max_attempts": st.MaxAttempts, "mode": st.Mode,
		"input": st.Input, "metadata": st.Metadata, "worker_id": st.WorkerID, "resources_version": st.ResourcesVersion,
		"lease_expires_unix_nano": st.LeaseExpiresNano, "created_unix_nano": st.CreatedNano,
		"updated_unix_nano": st.UpdatedNano, "completed_unix_nano": st.CompletedNano,
		"completion_seq": st.CompletionSeq, "last_error": st.LastError}
}
