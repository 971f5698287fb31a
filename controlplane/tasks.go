package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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

// Ranges of GET /api/v1/rollouts's numbers.
const (
	maxListLimit = 10000 // limit, and the number of ids
	maxWaitS     = 600   // wait_s
)

// listRollouts answers GET /api/v1/rollouts?status=&after=&limit=&ids=&wait_s=&summary=.
// With after (or status=completed) it pages completed rollouts in completion
// order; next_after is the cursor for the next page. wait_s long-polls until
// at least one rollout matches.
func (s *Server) listRollouts(ctx *fasthttp.RequestCtx) {
	if !s.needQueue(ctx) {
		return
	}
	args := ctx.QueryArgs()
	f := tasks.ListFilter{Status: string(args.Peek("status"))}
	var err error
	num := func(name string) int64 {
		v := args.Peek(name)
		if len(v) == 0 || err != nil {
			return 0
		}
		var n int64
		n, err = strconv.ParseInt(string(v), 10, 64)
		if err == nil && n < 0 {
			err = fmt.Errorf("%s must not be negative", name)
		}
		return n
	}
	f.After, f.Limit = num("after"), int(num("limit"))
	waitS := num("wait_s")
	switch {
	case err != nil:
	case f.Limit > maxListLimit:
		err = fmt.Errorf("limit %d is out of range: 0 (the default, 100) to %d", f.Limit, maxListLimit)
	case waitS > maxWaitS:
		err = fmt.Errorf("wait_s %d is out of range: 0 to %d seconds", waitS, maxWaitS)
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "bad query parameter: "+err.Error())
		return
	}
	f.Cursor = args.Has("after") || f.Status == "completed"
	if ids := string(args.Peek("ids")); ids != "" {
		f.IDs = strings.Split(ids, ",")
		if len(f.IDs) > maxListLimit {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("bad query parameter: ids lists %d rollouts, at most %d", len(f.IDs), maxListLimit))
			return
		}
		for _, id := range f.IDs {
			if !gateway.ValidID([]byte(id)) {
				s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "bad query parameter: each of ids must be "+gateway.IDCharset)
				return
			}
		}
	}
	switch f.Status {
	case "", "completed", tasks.StatusQueued, tasks.StatusRunning, tasks.StatusSucceeded, tasks.StatusFailed, tasks.StatusCancelled:
	default:
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("status %q is not one of queued, running, succeeded, failed, cancelled, completed", f.Status))
		return
	}
	deadline := time.Now().Add(time.Duration(waitS) * time.Second)
	var list []tasks.State
	var next int64
	for {
		c, cancel := s.storeCtx()
		list, next, err = s.queue.Load().List(c, f)
		cancel()
		if err != nil || len(list) > 0 || !time.Now().Before(deadline) {
			break
		}
		select {
		case <-s.stop:
			deadline = time.Now()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	summary := string(args.Peek("summary")) != "0"
	out := make([]map[string]any, 0, len(list))
	c, cancel := s.storeCtx()
	defer cancel()
	for i := range list {
		v := stateView(&list[i])
		if summary {
			if err := s.addSummary(c, v, list[i].RolloutID); err != nil {
				s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout "+list[i].RolloutID+": "+err.Error())
				return
			}
		}
		out = append(out, v)
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollouts": out, "next_after": next})
}

func stateView(st *tasks.State) map[string]any {
	return map[string]any{"rollout_id": st.RolloutID, "task_id": st.TaskID, "status": st.Status,
		"attempt_id": st.AttemptID, "attempt_no": st.AttemptNo, "max_attempts": st.MaxAttempts, "mode": st.Mode,
		"input": st.Input, "metadata": st.Metadata, "worker_id": st.WorkerID, "resources_version": st.ResourcesVersion,
		"lease_expires_unix_nano": st.LeaseExpiresNano, "created_unix_nano": st.CreatedNano,
		"updated_unix_nano": st.UpdatedNano, "completed_unix_nano": st.CompletedNano,
		"completion_seq": st.CompletionSeq, "last_error": st.LastError}
}

// addSummary adds the rollout's rewards and a summary of its calls (of the
// final attempt) to v.
func (s *Server) addSummary(c context.Context, v map[string]any, rolloutID string) error {
	attempt, _ := v["attempt_id"].(string)
	d, err := s.store.ReadRollout(c, rolloutID, export.ReadOptions{NoCalls: true})
	if err == nil { // the final attempt's calls, without their bodies ("" reads every attempt's: filtered below)
		d.Calls, err = s.store.Calls(c, export.CallFilter{RolloutID: rolloutID, AttemptID: attempt,
			Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
	}
	if err != nil {
		return err
	}
	spans := map[string]bool{}
	var prompt, completion uint64
	errs, noIDs := 0, 0
	for _, cl := range d.Calls {
		if cl.AttemptID != attempt {
			continue
		}
		if !spans[cl.SpanID] {
			spans[cl.SpanID] = true
			prompt += uint64(cl.PromptTokens)
			if cl.Error != "" || cl.HTTPStatus >= 400 {
				errs++
			}
		}
		completion += uint64(cl.CompletionTokens)
		if cl.TokenSource == export.TokenSourceNone || cl.TokenSource == "" {
			noIDs++
		}
	}
	v["calls"] = map[string]any{"calls": len(spans), "prompt_tokens": prompt, "completion_tokens": completion,
		"errors": errs, "choices_without_ids": noIDs}
	rewards := []map[string]any{}
	for _, r := range d.Rewards {
		if r.AttemptID == "" || r.AttemptID == attempt {
			rewards = append(rewards, rewardView(r))
		}
	}
	v["rewards"] = rewards
	return nil
}

// postResources publishes a new version: {"resources": {name: value}} or the
// map of named resources itself.
func (s *Server) postResources(ctx *fasthttp.RequestCtx) {
	if !s.needQueue(ctx) {
		return
	}
	var in map[string]json.RawMessage
	if err := strictJSON(string(ctx.PostBody()), &in); err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body (want an object of named resources): "+err.Error())
		return
	}
	if r, ok := in["resources"]; ok && len(in) == 1 {
		in = nil
		if err := json.Unmarshal(r, &in); err != nil {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, `"resources" must be an object of named resources`)
			return
		}
	}
	if len(in) == 0 {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "no resources given")
		return
	}
	c, cancel := s.storeCtx()
	defer cancel()
	r, err := s.queue.Load().PutResources(c, in)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, r)
}

func (s *Server) getResources(ctx *fasthttp.RequestCtx, which string) {
	if !s.needQueue(ctx) {
		return
	}
	var version int64
	if which != "latest" {
		v, err := strconv.ParseInt(which, 10, 64)
		if err != nil || v <= 0 {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "resources version must be a positive integer or \"latest\"")
			return
		}
		version = v
	}
	c, cancel := s.storeCtx()
	defer cancel()
	r, err := s.queue.Load().GetResources(c, version)
	if err != nil {
		s.queueError(ctx, err)
		return
	}
	// A version never changes once published: runners may cache it.
	if version != 0 {
		ctx.Response.Header.Set("Cache-Control", "public, max-age=31536000, immutable")
	}
	ctx.Response.Header.Set("ETag", strconv.Quote(strconv.FormatInt(r.Version, 10)))
	writeJSON(ctx, fasthttp.StatusOK, r)
}

// reportedCall is one self-reported call: a (prompt, response) triplet with
// optional ids and reward.
type reportedCall struct {
	AttemptID        string          `json:"attempt_id"`
	AgentName        string          `json:"agent_name"`
	Model            string          `json:"model"`
	Endpoint         string          `json:"endpoint"`
	Request          json.RawMessage `json:"request"`
	Messages         json.RawMessage `json:"messages"`
	Prompt           json.RawMessage `json:"prompt"`
	Response         json.RawMessage `json:"response"`
	PromptTokenIDs   []uint32        `json:"prompt_token_ids"`
	ResponseTokenIDs []uint32        `json:"response_token_ids"`
	ResponseLogprobs []float32       `json:"response_logprobs"`
	TokenSource      string          `json:"token_source"`
	FinishReason     string          `json:"finish_reason"`
	PromptTokens     *uint32         `json:"prompt_tokens"`
	CompletionTokens *uint32         `json:"completion_tokens"`
	StartTimeNano    uint64          `json:"start_time_unix_nano"`
	EndTimeNano      uint64          `json:"end_time_unix_nano"`
	Reward           *float64        `json:"reward"`
	Error            string          `json:"error"`
}

// postCalls stores self-reported calls for agents that cannot be proxied:
// {"attempt_id"?, "calls": [...]}, a list, or one call. Each gets the next
// sequence id of its (rollout, attempt) and is acknowledged only once stored.
func (s *Server) postCalls(ctx *fasthttp.RequestCtx, rolloutID string) {
	body := strings.TrimSpace(string(ctx.PostBody()))
	var list []reportedCall
	var attempt string
	var err error
	switch {
	case strings.HasPrefix(body, "["):
		err = strictJSON(body, &list)
	case strings.Contains(body, `"calls"`):
		var w struct {
			AttemptID string         `json:"attempt_id"`
			Calls     []reportedCall `json:"calls"`
		}
		err = strictJSON(body, &w)
		list, attempt = w.Calls, w.AttemptID
	default:
		var one reportedCall
		err = strictJSON(body, &one)
		list = []reportedCall{one}
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body: "+err.Error())
		return
	}
	if len(list) == 0 {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "no calls given")
		return
	}
	if attempt != "" && !gateway.ValidID([]byte(attempt)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "attempt_id must be "+gateway.IDCharset)
		return
	}
	for i := range list {
		switch rc := &list[i]; {
		case rc.AttemptID != "" && !gateway.ValidID([]byte(rc.AttemptID)):
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("call %d: attempt_id must be %s", i, gateway.IDCharset))
			return
		case !gateway.ValidName([]byte(rc.AgentName)):
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("call %d: agent_name must be at most 256 bytes of UTF-8 without control characters", i))
			return
		}
	}
	if s.queue.Load() != nil && attempt == "" {
		c, cancel := s.storeCtx()
		if st, err := s.queue.Load().Get(c, rolloutID); err == nil {
			attempt = st.AttemptID
		}
		cancel()
	}
	taskID := ""
	if ri, ok := s.rollouts.Load(rolloutID); ok {
		taskID = ri.(*rolloutInfo).taskID
	}
	now := uint64(time.Now().UnixNano())
	var b export.Batch
	out := make([]map[string]any, 0, len(list))
	for i := range list {
		rc := &list[i]
		call, msg := reportedToCall(rc, now)
		if msg != "" {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("call %d: %s", i, msg))
			return
		}
		if rc.AttemptID == "" {
			rc.AttemptID = attempt
		}
		call.RolloutID, call.AttemptID, call.TaskID = rolloutID, rc.AttemptID, taskID
		b.Calls = append(b.Calls, call)
	}
	// Sequence ids are taken only once the whole body is valid.
	for i := range b.Calls {
		cl := &b.Calls[i]
		seq, err := s.gw.NextSequenceID(rolloutID, cl.AttemptID)
		if err != nil {
			s.m.CallsRejected.WithLabelValues(rejectSequenceStore).Inc()
			s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reserving sequence ids (nothing stored; retry): "+err.Error())
			return
		}
		cl.SequenceID = seq
		if r := list[i].Reward; r != nil {
			b.Rewards = append(b.Rewards, export.Reward{RolloutID: rolloutID, AttemptID: cl.AttemptID,
				SequenceID: cl.SequenceID, Name: "primary", Value: *r, Source: "reported", TimeUnixNano: now})
		}
		out = append(out, map[string]any{"span_id": cl.SpanID, "attempt_id": cl.AttemptID,
			"sequence_id": cl.SequenceID, "token_source": cl.TokenSource})
	}
	c, cancel := s.storeCtx()
	defer cancel()
	if err := s.store.Write(c, &b); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing reported calls (nothing stored; retry): "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollout_id": rolloutID, "calls": out})
}

// reportedToCall turns a reported triplet into an llm_calls row, or says
// what is wrong with it.
func reportedToCall(rc *reportedCall, now uint64) (export.Call, string) {
	c := export.Call{SpanID: randomHex(8), TraceID: randomHex(16), AgentName: rc.AgentName, Model: rc.Model,
		Endpoint: rc.Endpoint, Backend: "reported", HTTPStatus: 200, Error: rc.Error, FinishReason: rc.FinishReason,
		PromptTokenIDs: rc.PromptTokenIDs, ResponseTokenIDs: rc.ResponseTokenIDs, ResponseLogprobs: rc.ResponseLogprobs,
		StartTimeUnixNano: rc.StartTimeNano, EndTimeUnixNano: rc.EndTimeNano}
	if c.Endpoint == "" {
		c.Endpoint = "/v1/chat/completions"
	}
	if c.StartTimeUnixNano == 0 {
		c.StartTimeUnixNano = now
	}
	if c.EndTimeUnixNano == 0 {
		c.EndTimeUnixNano = now
	}
	// The request as the agent would have sent it.
	switch {
	case len(rc.Request) > 0:
		if !json.Valid(rc.Request) {
			return c, `"request" is not JSON`
		}
		c.RequestBody = string(rc.Request)
	case len(rc.Messages) > 0:
		req := map[string]json.RawMessage{"messages": rc.Messages}
		if rc.Model != "" {
			req["model"], _ = json.Marshal(rc.Model)
		}
		b, err := json.Marshal(req)
		if err != nil {
			return c, `"messages" is not JSON`
		}
		c.RequestBody = string(b)
	case len(rc.Prompt) > 0:
		b, err := json.Marshal(map[string]json.RawMessage{"prompt": rc.Prompt})
		if err != nil {
			return c, `"prompt" is not JSON`
		}
		c.RequestBody = string(b)
		if rc.Endpoint == "" {
			c.Endpoint = "/v1/completions"
		}
	default:
		return c, `one of "request", "messages" or "prompt" is required`
	}
	// The response: a string is the assistant's text, an object a message.
	switch {
	case len(rc.Response) == 0:
		return c, `"response" is required`
	case rc.Response[0] == '"':
		var text string
		if err := json.Unmarshal(rc.Response, &text); err != nil {
			return c, `"response" is not a JSON string`
		}
		b, _ := json.Marshal(map[string]string{"role": "assistant", "content": text})
		c.ResponseMessage = string(b)
	case rc.Response[0] == '{' && json.Valid(rc.Response):
		c.ResponseMessage = string(rc.Response)
	default:
		return c, `"response" must be a string or a message object`
	}
	c.ResponseBody = `{"object":"rollgate.reported_call","choices":[{"index":0,"message":` + c.ResponseMessage + `}]}`
	switch rc.TokenSource {
	case "":
		c.TokenSource = export.TokenSourceNone
		if len(rc.ResponseTokenIDs) > 0 {
			c.TokenSource = "reported"
		}
	case export.TokenSourceEngine, export.TokenSourceTokenize, export.TokenSourceRetokenized, export.TokenSourceNone:
		c.TokenSource = rc.TokenSource
	default:
		return c, fmt.Sprintf("token_source %q is not one of engine, tokenize, retokenized, none", rc.TokenSource)
	}
	if c.TokenSource != export.TokenSourceNone && len(rc.ResponseTokenIDs) == 0 {
		return c, fmt.Sprintf("token_source %q needs response_token_ids", c.TokenSource)
	}
	if len(rc.ResponseLogprobs) > 0 && len(rc.ResponseLogprobs) != len(rc.ResponseTokenIDs) {
		return c, fmt.Sprintf("%d response_logprobs for %d response_token_ids", len(rc.ResponseLogprobs), len(rc.ResponseTokenIDs))
	}
	c.PromptTokens, c.CompletionTokens = uint32(len(rc.PromptTokenIDs)), uint32(len(rc.ResponseTokenIDs))
	if rc.PromptTokens != nil {
		c.PromptTokens = *rc.PromptTokens
	}
	if rc.CompletionTokens != nil {
		c.CompletionTokens = *rc.CompletionTokens
	}
	return c, ""
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
