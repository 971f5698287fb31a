package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/trainer-bridge/tasks"
)

// models answers GET /v1/models in OpenAI list format: the routed model names,
// plus, for a wildcard route, the models its first replica lists.
func (s *Server) models(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() {
		s.plainError(ctx, fasthttp.StatusMethodNotAllowed, errInvalidRequest, "use GET /v1/models")
		return
	}
	if _, ok := s.clientKeyName(ctx); !ok {
		s.plainError(ctx, fasthttp.StatusUnauthorized, "invalid_request_error", "Incorrect API key provided")
		return
	}
	t := s.table.Load()
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	seen := map[string]bool{}
	for _, name := range t.models() {
		seen[name] = true
		out.Data = append(out.Data, model{ID: name, Object: "model", OwnedBy: "rollgate"})
	}
	if t.wildcard != nil {
		r := t.wildcard.replicas[0]
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI(r.origin + r.basePath + "/models")
		req.Header.SetMethod(fasthttp.MethodGet)
		if r.auth != "" {
			req.Header.Set("Authorization", r.auth)
		} else if a := ctx.Request.Header.Peek("Authorization"); len(a) > 0 && s.cfg.ForwardClientAuthorization {
			req.Header.SetBytesV("Authorization", a)
		}
		if err := r.client.DoTimeout(req, resp, 10*time.Second); err == nil && resp.StatusCode() == 200 {
			body, _ := readAll(resp, 8<<20)
			var up struct {
				Data []model `json:"data"`
			}
			if json.Unmarshal(body, &up) == nil {
				for _, m := range up.Data {
					if !seen[m.ID] {
						seen[m.ID] = true
						out.Data = append(out.Data, m)
					}
				}
			}
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// api serves the /api/v1 routes; sub is the path after "/api/v1".
func (s *Server) api(ctx *fasthttp.RequestCtx, sub string) {
	method := string(ctx.Method())
	parts := strings.Split(strings.Trim(sub, "/"), "/")
	if !s.authorizedAdmin(ctx) {
		return
	}
	if len(parts) >= 2 && parts[0] == "rollouts" && !ValidID([]byte(parts[1])) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid rollout id in the path: use "+IDCharset)
		return
	}
	switch {
	case strings.HasPrefix(sub, "/bridge/"):
		s.bridgeRoutes(ctx, sub[len("/bridge"):])
	case sub == "/pause" && method == "POST":
		s.postPause(ctx)
	case sub == "/resume" && method == "POST":
		s.postResume(ctx)
	case sub == "/backends" && method == "GET":
		s.getBackends(ctx)
	case sub == "/backends" && method == "PUT":
		s.putBackends(ctx)
	case sub == "/rollouts" && method == "POST":
		s.postRollout(ctx)
	case sub == "/rollouts" && method == "GET":
		s.listRollouts(ctx)
	case sub == "/tasks" && method == "POST":
		s.postTasks(ctx)
	case sub == "/tasks/dequeue" && method == "POST":
		s.dequeue(ctx)
	case sub == "/resources" && method == "POST":
		s.postResources(ctx)
	case len(parts) == 2 && parts[0] == "resources" && method == "GET":
		s.getResources(ctx, parts[1])
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "heartbeat" && method == "POST":
		s.heartbeat(ctx, parts[1])
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "calls" && method == "POST":
		s.postCalls(ctx, parts[1])
	case len(parts) == 2 && parts[0] == "rollouts" && method == "GET":
		s.getRollout(ctx, parts[1])
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "rewards" && method == "POST":
		s.postReward(ctx, parts[1])
	case len(parts) == 3 && parts[0] == "rollouts" && parts[2] == "status" && method == "POST":
		s.postStatus(ctx, parts[1])
	default:
		s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, "unknown route "+method+" /api/v1"+sub)
	}
}

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetContentType("application/json")
		ctx.SetBody(appendError(nil, 500, errServer, "encoding response: "+err.Error()))
		return
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// decode reads a JSON body into v, answering 400 itself when it cannot.
func (s *Server) decode(ctx *fasthttp.RequestCtx, v any) bool {
	dec := json.NewDecoder(strings.NewReader(string(ctx.PostBody())))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

func (s *Server) storeCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 30*time.Second)
}

type backendsDoc struct {
	Backends []backendView `json:"backends"`
	Drain    pauseView     `json:"drain"`
}

type backendView struct {
	Model    string        `json:"model"`
	Replicas []replicaView `json:"replicas"`
	// Routing and LoadFactor are the pool's effective policy (defaults resolved).
	Routing    string  `json:"routing"`
	LoadFactor float64 `json:"load_factor,omitempty"`
}

type replicaView struct {
	Replica
	ResolvedKind string `json:"resolved_kind,omitempty"`
	Outstanding  int64  `json:"outstanding"`
	Healthy      bool   `json:"healthy"`
}

func (s *Server) getBackends(ctx *fasthttp.RequestCtx) {
	t := s.table.Load()
	doc := backendsDoc{Backends: []backendView{}, Drain: s.pauseState()}
	for _, b := range t.spec {
		p := t.lookup(b.Model)
		if b.Model == "*" {
			p = t.wildcard
		}
		v := backendView{Model: b.Model}
		v.Routing, v.LoadFactor = routingOf(p.sel)
		for _, r := range p.replicas {
			rv := replicaView{Replica: r.spec, Outstanding: r.outstanding.Load(), Healthy: r.healthy()}
			if r.kindOK.Load() {
				rv.ResolvedKind = openai.Kind(r.kind.Load()).String()
			}
			v.Replicas = append(v.Replicas, rv)
		}
		doc.Backends = append(doc.Backends, v)
	}
	writeJSON(ctx, fasthttp.StatusOK, doc)
}

// putBackends swaps the routing table. In-flight calls keep the replica they
// were sent to; new calls use the new table.
func (s *Server) putBackends(ctx *fasthttp.RequestCtx) {
	var doc struct {
		Backends []Backend `json:"backends"`
	}
	if !s.decode(ctx, &doc) {
		return
	}
	s.tableMu.Lock()
	defer s.tableMu.Unlock()
	t, err := buildTable(doc.Backends, s.table.Load(), &s.clients, s.upstreamKeys)
	if err != nil {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	s.table.Store(t)
	s.log.Info("routing table replaced", "models", len(doc.Backends))
	s.getBackends(ctx)
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
		if !ValidName([]byte(in.GroupID)) {
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
	if !ValidID([]byte(in.RolloutID)) || !ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "rollout_id and attempt_id must each be "+IDCharset)
		return
	}
	if !ValidName([]byte(in.TaskID)) {
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
	if s.queue.Load() != nil {
		// Registered rollouts complete and page like queued ones.
		if _, err := s.queue.Load().Register(c, in.RolloutID, in.AttemptID, in.TaskID, json.RawMessage(meta)); err != nil {
			s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "registering rollout: "+err.Error())
			return
		}
	}
	if err := s.store.Write(c, &export.Batch{Rollouts: []export.Rollout{row}}); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing rollout: "+err.Error())
		return
	}
	s.rollouts.Store(in.RolloutID, &rolloutInfo{taskID: in.TaskID, groupID: in.GroupID, createdNs: now, metadata: meta})
	s.noteRegistered(in.RolloutID, in.TaskID)
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
	if in.AttemptID != "" && !ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "attempt_id must be "+IDCharset)
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
	if err := s.store.Write(c, &export.Batch{Rewards: []export.Reward{row}}); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing reward: "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, rewardView(row))
}

func (s *Server) postStatus(ctx *fasthttp.RequestCtx, rolloutID string) {
	var in struct {
		Status    string `json:"status"`
		AttemptID string `json:"attempt_id"`
		Reason    string `json:"reason"`
	}
	if !s.decode(ctx, &in) {
		return
	}
	if in.AttemptID != "" && !ValidID([]byte(in.AttemptID)) {
		s.plainError(ctx, fasthttp.StatusBadRequest, errInvalidRequest, "attempt_id must be "+IDCharset)
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
	if s.queue.Load() != nil && in.Status != "running" {
		ch, err := s.queue.Load().Complete(c, rolloutID, in.AttemptID, in.Status, in.Reason)
		switch {
		case err == nil:
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
	// Carry task, group, metadata and creation time over from what is known:
	// this row becomes the latest, so whatever it leaves out is lost.
	if ri, ok := s.rollouts.Load(rolloutID); ok {
		info := ri.(*rolloutInfo)
		row.TaskID, row.GroupID, row.CreatedUnixNano, row.Metadata = info.taskID, info.groupID, info.createdNs, info.metadata
	} else if d, err := s.store.Rollout(c, rolloutID); err == nil && len(d.Attempts) > 0 {
		last := d.Attempts[len(d.Attempts)-1]
		row.TaskID, row.GroupID, row.CreatedUnixNano, row.Metadata = last.TaskID, last.GroupID, last.CreatedUnixNano, last.Metadata
		if row.GroupID == "" { // a row from before the group_id column
			row.GroupID = metadataGroupID([]byte(last.Metadata))
		}
	}
	if row.AttemptID == "" {
		if d, err := s.store.Rollout(c, rolloutID); err == nil && len(d.Attempts) > 0 {
			row.AttemptID = d.Attempts[len(d.Attempts)-1].AttemptID
		}
	}
	if err := s.store.Write(c, &export.Batch{Rollouts: []export.Rollout{row}}); err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "storing status: "+err.Error())
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, rolloutView(row))
}

func (s *Server) getRollout(ctx *fasthttp.RequestCtx, rolloutID string) {
	c, cancel := s.storeCtx()
	defer cancel()
	d, err := s.store.Rollout(c, rolloutID)
	if err != nil {
		s.plainError(ctx, fasthttp.StatusServiceUnavailable, errServer, "reading rollout: "+err.Error())
		return
	}
	if len(d.Attempts) == 0 && len(d.Calls) == 0 && len(d.Rewards) == 0 {
		s.plainError(ctx, fasthttp.StatusNotFound, errNotFound, "rollout "+rolloutID+" not found")
		return
	}
	out := map[string]any{"rollout_id": rolloutID}
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
