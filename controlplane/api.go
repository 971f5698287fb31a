package controlplane

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane/lease"
	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/route"
)

// apiRoute is a row of /api/v1's route table.
type apiRoute = route.Route[route.Handler[*Server]]

// apiRoutes are the /api/v1 routes, patterns below /api/v1. Every one needs
// the admin token when one is set. A method other than a row's is 404 like
// an unknown path (no 405 on this surface).
var apiRoutes = route.New(
	apiRoute{Method: "POST", Pattern: "/bridge/batches", Auth: route.Admin, Handler: route.Plain((*Server).postBatches)},
	apiRoute{Pattern: "/bridge/{path...}", Auth: route.Admin, Handler: (*Server).serveLease},
	apiRoute{Method: "POST", Pattern: "/pause", Auth: route.Admin, Handler: route.Plain((*Server).postPause)},
	apiRoute{Method: "POST", Pattern: "/resume", Auth: route.Admin, Handler: route.Plain((*Server).postResume)},
	apiRoute{Method: "GET", Pattern: "/backends", Auth: route.Admin, Handler: route.Plain((*Server).getBackends)},
	apiRoute{Method: "PUT", Pattern: "/backends", Auth: route.Admin, Handler: route.Plain((*Server).putBackends)},
	apiRoute{Method: "POST", Pattern: "/rollouts", Auth: route.Admin, Handler: route.Plain((*Server).postRollout)},
	apiRoute{Method: "GET", Pattern: "/rollouts", Auth: route.Admin, Handler: route.Plain((*Server).listRollouts)},
	apiRoute{Method: "POST", Pattern: "/tasks", Auth: route.Admin, Handler: route.Plain((*Server).postTasks)},
	apiRoute{Method: "POST", Pattern: "/tasks/dequeue", Auth: route.Admin, Handler: route.Plain((*Server).dequeue)},
	apiRoute{Method: "DELETE", Pattern: "/tasks/{rollout_id}", Auth: route.Admin, Handler: route.OneParam((*Server).deleteTask)},
	apiRoute{Method: "POST", Pattern: "/resources", Auth: route.Admin, Handler: route.Plain((*Server).postResources)},
	apiRoute{Method: "GET", Pattern: "/resources/{version}", Auth: route.Admin, Handler: route.OneParam((*Server).getResources)},
	apiRoute{Method: "POST", Pattern: "/rollouts/{rollout_id}/heartbeat", Auth: route.Admin, Handler: route.OneParam((*Server).heartbeat)},
	apiRoute{Method: "POST", Pattern: "/rollouts/{rollout_id}/calls", Auth: route.Admin, Handler: route.OneParam((*Server).postCalls)},
	apiRoute{Method: "GET", Pattern: "/rollouts/{rollout_id}", Auth: route.Admin, Handler: route.OneParam((*Server).getRollout)},
	apiRoute{Method: "POST", Pattern: "/rollouts/{rollout_id}/rewards", Auth: route.Admin, Handler: route.OneParam((*Server).postReward)},
	apiRoute{Method: "POST", Pattern: "/rollouts/{rollout_id}/status", Auth: route.Admin, Handler: route.OneParam((*Server).postStatus)},
)

// Routes lists the control plane's routes with their full paths: /api/v1's
// table, the lease API's under /api/v1/bridge (docs/docs_test.go checks
// them against docs/contract.md).
func Routes() []route.Info {
	var out []route.Info
	for _, r := range apiRoutes.Infos("/api/v1") {
		if !r.Subtree() {
			out = append(out, r)
		}
	}
	for _, r := range lease.Routes() {
		r.Pattern = "/api/v1/bridge" + r.Pattern
		r.Auth = route.Admin
		out = append(out, r)
	}
	return out
}

// ServeAPI serves the /api/v1 routes; sub is the path after "/api/v1".
// Before any route: the admin token, the rollout id of a /rollouts/{id}
// or /tasks/{id} path, and the body's nesting depth.
func (s *Server) ServeAPI(ctx *fasthttp.RequestCtx, sub string) {
	if !s.authorizedAdmin(ctx) {
		return
	}
	if p := strings.Split(strings.Trim(sub, "/"), "/"); len(p) >= 2 && (p[0] == "rollouts" || p[0] == "tasks") && !gateway.ValidID([]byte(p[1])) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid rollout id in the path: use "+gateway.IDCharset)
		return
	}
	// Every body is bounded in depth before a route decodes it (and before
	// what it stores reaches any recursive reader).
	if body := ctx.PostBody(); len(body) > 0 {
		if err := jsonscan.Validate(body); errors.Is(err, jsonscan.ErrTooDeep) {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body: "+err.Error())
			return
		}
	}
	method := string(ctx.Method())
	var ids [2]string
	m := apiRoutes.Match(method, sub, ids[:0])
	if m.Route == nil {
		s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, "unknown route "+method+" /api/v1"+sub)
		return
	}
	m.Route.Handler(s, ctx, m.Params)
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBody(gateway.AppendError(nil, 500, errServer, "encoding response: "+err.Error()))
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// decode reads a JSON body into v strictly (strictJSON: an unknown field or
// trailing data is an error naming it), answering 400 itself when it cannot.
func (s *Server) decode(ctx *fasthttp.RequestCtx, v any) bool {
	if err := strictJSON(string(ctx.PostBody()), v); err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

func (s *Server) storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

func (s *Server) getBackends(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, fasthttp.StatusOK, s.gw.Backends())
}

// putBackends swaps the routing table. In-flight calls keep the replica they
// were sent to; new calls use the new table.
func (s *Server) putBackends(ctx *fasthttp.RequestCtx) {
	var doc struct {
		Backends []gateway.Backend `json:"backends"`
	}
	if !s.decode(ctx, &doc) {
		return
	}
	v, err := s.gw.ReplaceBackends(doc.Backends)
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// postPause pauses the gateway (?mode=wait|abort) and, with ?engine=MODE,
// the engines too with their own pause routes, after the gateway's own
// aborts.
func (s *Server) postPause(ctx *fasthttp.RequestCtx) {
	mode, engine := string(ctx.QueryArgs().Peek("mode")), string(ctx.QueryArgs().Peek("engine"))
	if engine != "" {
		if err := backends.CheckEngineMode(engine); err != nil {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
			return
		}
	}
	if err := s.gw.PauseWith(mode); err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	v := s.gw.PauseState()
	if engine != "" {
		v.Engines, _ = s.gw.PauseEngines(engine) // the mode was checked above
	}
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// postResume resumes the engines an engine pause paused, then the gateway.
func (s *Server) postResume(ctx *fasthttp.RequestCtx) {
	engines := s.gw.ResumeEngines()
	s.gw.Resume()
	v := s.gw.PauseState()
	v.Engines = engines
	writeJSON(ctx, fasthttp.StatusOK, v)
}

// authorizedAdmin checks the admin token on every /api/v1 route, reads
// included, when one is set (AdminAuthorized).
func (s *Server) authorizedAdmin(ctx *fasthttp.RequestCtx) bool {
	return AdminAuthorized(ctx, s.cfg.AdminToken, "/api/v1 route")
}

// AdminAuthorized checks "Authorization: Bearer <token>" (constant-time;
// the scheme matched without regard to case, RFC 9110 §11.1) when token is
// set, and answers 401 with WWW-Authenticate itself when it does not match;
// route names what was refused in the message ("/api/v1 route"). An empty
// token allows every request. The /api/v1 routes and rollgate bridge
// --serve's lease API share it.
func AdminAuthorized(ctx *fasthttp.RequestCtx, token, route string) bool {
	if token == "" {
		return true
	}
	got := ctx.Request.Header.Peek("Authorization")
	if len(got) > 7 && strings.EqualFold(string(got[:7]), "bearer ") {
		got = got[7:]
	} else {
		got = nil
	}
	if got != nil && subtle.ConstantTimeCompare(got, []byte(token)) == 1 {
		return true
	}
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="rollgate admin"`)
	ctx.SetStatusCode(fasthttp.StatusUnauthorized)
	ctx.SetContentType("application/json")
	ctx.SetBody(gateway.AppendError(nil, fasthttp.StatusUnauthorized, "authentication_error", "this "+route+" needs the admin token: Authorization: Bearer $ROLLGATE_ADMIN_TOKEN"))
	return false
}

func (s *Server) postRollout(ctx *fasthttp.RequestCtx) {
	var in struct {
		TaskID    string          `json:"task_id"`
		RolloutID string          `json:"rollout_id"`
		AttemptID string          `json:"attempt_id"`
		GroupID   string          `json:"group_id"`
		Metadata  json.RawMessage `json:"metadata"`
	}
	if !s.decode(ctx, &in) {
		return
	}
	if in.GroupID != "" {
		if !gateway.ValidName([]byte(in.GroupID)) {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "group_id must be at most 256 bytes of UTF-8 without control characters")
			return
		}
		md, err := withGroupID(in.Metadata, in.GroupID)
		if err != nil {
			s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
			return
		}
		in.Metadata = md
	}
	if in.RolloutID == "" {
		in.RolloutID = "ro-" + uuid.NewString()[:12]
	}
	if in.AttemptID == "" {
		in.AttemptID = "at-" + uuid.NewString()[:8]
	}
	if !gateway.ValidID([]byte(in.RolloutID)) || !gateway.ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "rollout_id and attempt_id must each be "+gateway.IDCharset)
		return
	}
	if !gateway.ValidName([]byte(in.TaskID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "task_id must be at most 256 bytes of UTF-8 without control characters")
		return
	}
	meta := "{}"
	if len(in.Metadata) > 0 && string(in.Metadata) != "null" {
		meta = string(in.Metadata)
	}
	now := uint64(time.Now().UnixNano())
	row := export.Rollout{RolloutID: in.RolloutID, AttemptID: in.AttemptID, TaskID: in.TaskID, GroupID: in.GroupID,
		Status: "running", Metadata: meta, CreatedUnixNano: now, UpdatedUnixNano: now}
	c, cancel := s.storeCtx()
	defer cancel()
	created := true
	if q := s.queue.Load(); q != nil {
		// Registered rollouts complete and page like queued ones. An id the
		// queue holds is 409, unless this repeats the registration of a
		// rollout still running.
		var err error
		if _, created, err = q.Register(c, in.RolloutID, in.AttemptID, in.TaskID, json.RawMessage(meta)); err != nil {
			s.queueError(ctx, err)
			return
		}
	} else if d, err := s.store.Rollout(c, in.RolloutID); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout: "+err.Error())
		return
	} else if len(d.Attempts) > 0 {
		last := d.Attempts[len(d.Attempts)-1]
		s.plainError(ctx, fasthttp.StatusConflict, errInvalidRequest, fmt.Sprintf("rollout %s exists (%s, attempt %q): register a new rollout id", in.RolloutID, last.Status, last.AttemptID))
		return
	}
	if created {
		if err := s.store.Write(c, &export.Batch{Rollouts: []export.Rollout{row}}); err != nil {
			s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing rollout: "+err.Error())
			return
		}
	}
	s.rollouts.Store(in.RolloutID, &rolloutInfo{taskID: in.TaskID, groupID: in.GroupID, createdNs: now, metadata: meta})
	s.gw.RegisterRollout(in.RolloutID, in.TaskID)
	writeJSON(ctx, fasthttp.StatusOK, map[string]string{
		"rollout_id": in.RolloutID,
		"attempt_id": in.AttemptID,
		"task_id":    in.TaskID,
		"base_url":   fmt.Sprintf("%s/rollout/%s/attempt/%s/v1", s.cfg.PublicURL, in.RolloutID, in.AttemptID),
	})
}

func (s *Server) postReward(ctx *fasthttp.RequestCtx, rolloutID string) {
	var in struct {
		Value      *float64 `json:"value"`
		Name       string   `json:"name"`
		AttemptID  string   `json:"attempt_id"`
		SequenceID uint64   `json:"sequence_id"`
	}
	if !s.decode(ctx, &in) {
		return
	}
	if in.AttemptID != "" && !gateway.ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "attempt_id must be "+gateway.IDCharset)
		return
	}
	if !gateway.ValidName([]byte(in.Name)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "name must be at most 256 bytes of UTF-8 without control characters")
		return
	}
	if in.SequenceID > math.MaxInt64 {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("sequence_id %d is out of range: 0 (episode-level) to %d", in.SequenceID, int64(math.MaxInt64)))
		return
	}
	if in.Value != nil && (math.IsNaN(*in.Value) || math.IsInf(*in.Value, 0)) { // JSON has neither; a guard for what decodes to them
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "value must be a finite number")
		return
	}
	if in.Value == nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, `"value" (a number) is required`)
		return
	}
	if in.Name == "" {
		in.Name = "primary"
	}
	row := export.Reward{RolloutID: rolloutID, AttemptID: in.AttemptID, SequenceID: in.SequenceID,
		Name: in.Name, Value: *in.Value, Source: "api", TimeUnixNano: uint64(time.Now().UnixNano())}
	c, cancel := s.storeCtx()
	defer cancel()
	known, err := s.rolloutKnown(c, rolloutID)
	if err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout: "+err.Error())
		return
	}
	if !known {
		// A reward under an id nothing else carries (a typo, a rollout of
		// another store) would be trained on by no one: say so.
		s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, fmt.Sprintf("rollout %s not found: no call was made on %s/rollout/%s/attempt/{attempt_id}/v1"+
			" (or with the x-rollout-id header) and it was never registered (POST /api/v1/rollouts) or enqueued (POST /api/v1/tasks); reward not stored",
			rolloutID, s.cfg.PublicURL, rolloutID))
		return
	}
	if err := s.store.Write(c, &export.Batch{Rewards: []export.Reward{row}}); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing reward: "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, rewardView(row))
}

// rolloutKnown reports whether anything names the rollout: a registration
// or the task queue, a call admitted by the gateway (before its capture is
// stored; with a shared sequence store, by any gateway), or the store's
// calls, rollouts rows or rewards. Cheapest first.
func (s *Server) rolloutKnown(c context.Context, rolloutID string) (bool, error) {
	if _, ok := s.rollouts.Load(rolloutID); ok {
		return true, nil
	}
	if seen, err := s.gw.RolloutSeen(c, rolloutID); err != nil || seen {
		return seen, err
	}
	if q := s.queue.Load(); q != nil {
		_, err := q.Get(c, rolloutID)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, tasks.ErrNotFound) {
			return false, err
		}
	}
	d, err := s.store.ReadRollout(c, rolloutID, export.ReadOptions{NoCalls: true})
	if err != nil {
		return false, err
	}
	if len(d.Attempts) > 0 || len(d.Rewards) > 0 {
		return true, nil
	}
	calls, err := s.store.Calls(c, export.CallFilter{RolloutID: rolloutID, Limit: 1,
		Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
	return len(calls) > 0, err
}

// postStatus records a rollout's status. On a rollout of the task queue
// (queued or registered) the report must come from its current running
// attempt (tasks.State.CheckReport: the attempt_id, and the worker_id of a
// leased attempt); a finished rollout keeps its status (409 naming it).
func (s *Server) postStatus(ctx *fasthttp.RequestCtx, rolloutID string) {
	var in struct {
		Status    string `json:"status"`
		AttemptID string `json:"attempt_id"`
		WorkerID  string `json:"worker_id"`
		Reason    string `json:"reason"`
	}
	if !s.decode(ctx, &in) {
		return
	}
	if in.AttemptID != "" && !gateway.ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "attempt_id must be "+gateway.IDCharset)
		return
	}
	if !s.validWorker(ctx, in.WorkerID) {
		return
	}
	switch in.Status {
	case "succeeded", "failed", "cancelled", "running":
	default:
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, fmt.Sprintf("status %q is not one of succeeded, failed, cancelled, running", in.Status))
		return
	}
	c, cancel := s.storeCtx()
	defer cancel()
	if in.Status != "running" && s.capture != nil {
		// The rollout's calls that already got their answers must be stored
		// before it is reported complete (the bridge and the completed
		// rollouts cursor read them next).
		sc, scancel := context.WithTimeout(c, 10*time.Second)
		if err := s.capture.Sync(sc); err != nil {
			s.log.Warn("rollout status: captured calls not all stored yet", "rollout_id", rolloutID, "err", err)
		}
		scancel()
	}
	if q := s.queue.Load(); q != nil {
		st, err := q.Get(c, rolloutID)
		switch {
		case err == nil && in.Status == "running":
			// Only the current running attempt may say it runs.
			if err := st.CheckReport(in.AttemptID, in.WorkerID); err != nil {
				s.queueError(ctx, err)
				return
			}
			in.AttemptID = st.AttemptID
		case err == nil:
			ch, err := q.Complete(c, rolloutID, in.AttemptID, in.WorkerID, in.Status, in.Reason)
			if err != nil {
				s.queueError(ctx, err)
				return
			}
			s.mirror(c, []tasks.Change{*ch})
			writeJSON(ctx, fasthttp.StatusOK, stateView(&ch.State))
			return
		case !errors.Is(err, tasks.ErrNotFound):
			s.queueError(ctx, err)
			return
		}
		// Not a queued or registered rollout: record the status as given.
	}
	now := uint64(time.Now().UnixNano())
	row := export.Rollout{RolloutID: rolloutID, AttemptID: in.AttemptID, Status: in.Status, Metadata: "{}",
		CreatedUnixNano: now, UpdatedUnixNano: now}
	d, err := s.store.ReadRollout(c, rolloutID, export.ReadOptions{NoCalls: true})
	if err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout: "+err.Error())
		return
	}
	var last *export.Rollout
	if len(d.Attempts) > 0 {
		last = &d.Attempts[len(d.Attempts)-1]
		if finalStatus(last.Status) {
			s.plainError(ctx, fasthttp.StatusConflict, errInvalidRequest, fmt.Sprintf("rollout %s is %s (attempt %q): a finished rollout keeps its status", rolloutID, last.Status, last.AttemptID))
			return
		}
	}
	// Carry task, group, metadata and creation time over from what is known:
	// this row becomes the latest, so whatever it leaves out is lost.
	if ri, ok := s.rollouts.Load(rolloutID); ok {
		info := ri.(*rolloutInfo)
		row.TaskID, row.GroupID, row.CreatedUnixNano, row.Metadata = info.taskID, info.groupID, info.createdNs, info.metadata
	} else if last != nil {
		row.TaskID, row.GroupID, row.CreatedUnixNano, row.Metadata = last.TaskID, last.GroupID, last.CreatedUnixNano, last.Metadata
		if row.GroupID == "" { // a row from before the group_id column
			row.GroupID = metadataGroupID([]byte(last.Metadata))
		}
	}
	if row.AttemptID == "" && last != nil {
		row.AttemptID = last.AttemptID
	}
	if err := s.store.Write(c, &export.Batch{Rollouts: []export.Rollout{row}}); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing status: "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, rolloutView(row))
}

// finalStatus reports whether a rollouts-table status is a final one.
func finalStatus(status string) bool {
	return status == tasks.StatusSucceeded || status == tasks.StatusFailed || status == tasks.StatusCancelled
}

// maxListedCalls bounds the call summaries GET /api/v1/rollouts/{id}
// lists: the first ones in (attempt, sequence id, choice) order.
const maxListedCalls = 1000

func (s *Server) getRollout(ctx *fasthttp.RequestCtx, rolloutID string) {
	c, cancel := s.storeCtx()
	defer cancel()
	out := map[string]any{}
	// The calls are summaries: read without their bodies, at most
	// maxListedCalls of them (calls_truncated says there are more).
	d, err := s.store.ReadRollout(c, rolloutID, export.ReadOptions{NoCalls: true})
	if err == nil {
		d.Calls, err = s.store.Calls(c, export.CallFilter{RolloutID: rolloutID, Limit: maxListedCalls + 1,
			Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
	}
	if err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout: "+err.Error())
		return
	}
	if len(d.Calls) > maxListedCalls {
		d.Calls = d.Calls[:maxListedCalls]
		out["calls_truncated"] = true
	}
	if len(d.Attempts) == 0 && len(d.Calls) == 0 && len(d.Rewards) == 0 {
		s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, "rollout "+rolloutID+" not found")
		return
	}
	out["rollout_id"] = rolloutID
	attempts := []map[string]any{}
	for _, a := range d.Attempts {
		attempts = append(attempts, rolloutView(a))
		out["task_id"], out["status"], out["attempt_id"] = a.TaskID, a.Status, a.AttemptID
	}
	out["attempts"] = attempts
	calls := []map[string]any{}
	for _, cl := range d.Calls {
		calls = append(calls, map[string]any{
			"span_id": cl.SpanID, "attempt_id": cl.AttemptID, "sequence_id": cl.SequenceID,
			"choice_index": cl.ChoiceIndex, "endpoint": cl.Endpoint, "model": cl.Model, "backend": cl.Backend,
			"policy_version": cl.PolicyVersion, "stream": cl.Stream, "http_status": cl.HTTPStatus, "error": cl.Error,
			"finish_reason": cl.FinishReason, "prompt_tokens": cl.PromptTokens, "completion_tokens": cl.CompletionTokens,
			"token_source": cl.TokenSource, "start_time_unix_nano": cl.StartTimeUnixNano,
			"end_time_unix_nano": cl.EndTimeUnixNano, "agent_name": cl.AgentName,
		})
		if _, ok := out["task_id"]; !ok && cl.TaskID != "" {
			out["task_id"] = cl.TaskID
		}
	}
	out["calls"] = calls
	rewards := []map[string]any{}
	for _, r := range d.Rewards {
		rewards = append(rewards, rewardView(r))
	}
	out["rewards"] = rewards
	if s.queue.Load() != nil {
		if st, err := s.queue.Load().Get(c, rolloutID); err == nil {
			q := stateView(st)
			if hist, err := s.queue.Load().Attempts(c, rolloutID); err == nil {
				q["attempts"] = hist
			}
			out["queue"] = q
			out["status"], out["attempt_id"] = st.Status, st.AttemptID
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

func rolloutView(r export.Rollout) map[string]any {
	var meta any = json.RawMessage(r.Metadata)
	if !json.Valid([]byte(r.Metadata)) {
		meta = r.Metadata
	}
	return map[string]any{"rollout_id": r.RolloutID, "attempt_id": r.AttemptID, "task_id": r.TaskID,
		"group_id": r.GroupID, "status": r.Status, "metadata": meta, "created_unix_nano": r.CreatedUnixNano, "updated_unix_nano": r.UpdatedUnixNano}
}

func rewardView(r export.Reward) map[string]any {
	return map[string]any{"rollout_id": r.RolloutID, "attempt_id": r.AttemptID, "sequence_id": r.SequenceID,
		"name": r.Name, "value": r.Value, "source": r.Source, "time_unix_nano": r.TimeUnixNano}
}
