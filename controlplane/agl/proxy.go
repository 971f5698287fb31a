package agl

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// aglModel is AGL's Model: one endpoint serving a model name.
type aglModel struct {
	Model    string `json:"model"`
	Endpoint string `json:"endpoint"`
	Version  int64  `json:"version"`
}

// postModels serves POST /api/models: upsert by (model, endpoint). The
// registered endpoints become the replicas of their model in this
// surface's own routing table (version → policy_version on every captured
// row), which serves its proxy route only: the operator's routing table
// (config file, --upstream, PUT /api/v1/backends) is never changed. An
// endpoint must be an http(s) URL without credentials on a host
// agl.allowed_endpoints allows (422 otherwise).
func (s *Server) postModels(ctx *fasthttp.RequestCtx) {
	body, ok := bodyRaw(ctx, true)
	if !ok {
		return
	}
	var items []json.RawMessage
	if err := json.Unmarshal(body, &items); err != nil {
		invalid(ctx, fieldError{Type: "list_type", Loc: []any{"body"}, Msg: "Input should be a valid list: " + err.Error(), Input: body})
		return
	}
	var list []aglModel
	var errs []fieldError
	for i, it := range items {
		m, e := s.decodeModel(i, it)
		errs = append(errs, e...)
		list = append(list, m)
	}
	if len(errs) > 0 {
		invalid(ctx, errs...)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next := map[string][]aglModel{}
	for k, v := range s.models {
		next[k] = append([]aglModel(nil), v...)
	}
	for _, m := range list {
		eps := next[m.Model]
		found := false
		for i := range eps {
			if eps[i].Endpoint == m.Endpoint {
				eps[i], found = m, true
			}
		}
		if !found {
			eps = append(eps, m)
		}
		next[m.Model] = eps
	}
	if err := s.applyModels(next, true); err != nil {
		invalid(ctx, fieldError{Type: "value_error", Loc: []any{"body"}, Msg: err.Error(), Input: body})
		return
	}
	for _, m := range list {
		s.log.Info("agl: model registered (served on the /proxy route only)", "model", m.Model, "endpoint", m.Endpoint, "version", m.Version)
	}
	out := list
	if out == nil {
		out = []aglModel{}
	}
	writeJSON(ctx, fasthttp.StatusCreated, out)
}

// decodeModel checks one item of POST /api/models (AGL's Model: model and
// endpoint strings, version an integer; other members ignored) and returns
// its model, with the 422 items of what is wrong with it.
func (s *Server) decodeModel(i int, raw json.RawMessage) (aglModel, []fieldError) {
	m := aglModel{}
	in, ok := members(raw)
	if !ok {
		return m, []fieldError{notObject([]any{"body", i}, raw)}
	}
	var errs []fieldError
	for _, k := range []string{"model", "endpoint"} {
		v, given := in[k]
		var str string
		switch {
		case !given:
			errs = append(errs, fieldError{Type: "missing", Loc: []any{"body", i, k}, Msg: "Field required", Input: raw})
		case json.Unmarshal(v, &str) != nil || string(v) == "null":
			errs = append(errs, fieldError{Type: "string_type", Loc: []any{"body", i, k}, Msg: "Input should be a valid string", Input: v})
		case k == "model":
			m.Model = str
		default:
			m.Endpoint = strings.TrimRight(str, "/")
			if why := s.allow.check(m.Endpoint); why != "" {
				errs = append(errs, fieldError{Type: "value_error", Loc: []any{"body", i, k}, Msg: why})
			}
		}
	}
	if v, given := in["version"]; given {
		n, ok := intValue(v)
		if !ok {
			errs = append(errs, fieldError{Type: "int_parsing", Loc: []any{"body", i, "version"}, Msg: "Input should be a valid integer", Input: v})
		}
		m.Version = n
	}
	return m, errs
}

// deleteModels serves DELETE /api/models: every registered model leaves
// this surface's routing table (the operator's is not touched).
func (s *Server) deleteModels(ctx *fasthttp.RequestCtx) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.applyModels(map[string][]aglModel{}, true); err != nil {
		s.storeError(ctx, "removing the models from the routing table", err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]string{"status": "ok"})
}

// applyModels makes models this surface's routing table (the proxy
// route's, apart from the operator's); persist stores them in the queue's
// settings. Called with s.mu held.
func (s *Server) applyModels(models map[string][]aglModel, persist bool) error {
	names := make([]string, 0, len(models))
	for k := range models {
		names = append(names, k)
	}
	sort.Strings(names)
	var table []backends.Backend
	for _, name := range names {
		nb := backends.Backend{Model: name}
		for _, m := range models[name] {
			nb.Replicas = append(nb.Replicas, backends.Replica{Name: m.Endpoint, URL: m.Endpoint, PolicyVersion: strconv.FormatInt(m.Version, 10)})
		}
		table = append(table, nb)
	}
	if err := s.table.Replace(table); err != nil {
		return err
	}
	s.models = models
	if !persist {
		return nil
	}
	all := []aglModel{}
	for _, name := range names {
		all = append(all, models[name]...)
	}
	b, _ := json.Marshal(all)
	c, cancel := storeCtx()
	defer cancel()
	return s.d.Queue.PutSetting(c, modelsSetting, string(b))
}

// modelsSetting names the registered models in the queue's settings, so a
// restarted gateway routes the rollouts under way as before.
const modelsSetting = "agl_models"

// loadModels restores the models registered before a restart into this
// surface's own table (never over the operator's), dropping with a warning
// those agl.allowed_endpoints no longer allows.
func (s *Server) loadModels() error {
	c, cancel := storeCtx()
	defer cancel()
	v, ok, err := s.d.Queue.Setting(c, modelsSetting)
	if err != nil || !ok {
		return err
	}
	var list []aglModel
	if err := json.Unmarshal([]byte(v), &list); err != nil {
		return fmt.Errorf("agl: decoding the registered models: %w", err)
	}
	models := map[string][]aglModel{}
	dropped := 0
	for _, m := range list {
		if why := s.allow.check(m.Endpoint); why != "" {
			s.log.Warn("agl: a model registered before the restart is not allowed now; dropped (AGL's trainer registers its models again each step)",
				"model", m.Model, "endpoint", redactURL(m.Endpoint), "why", why)
			dropped++
			continue
		}
		models[m.Model] = append(models[m.Model], m)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyModels(models, dropped > 0)
}

// pauseState is AGL's proxy pause: while paused the proxy route answers
// 429 at once; calls in flight finish.
type pauseState struct {
	mu         sync.Mutex
	paused     bool
	retryAfter int64
	reason     *string
	inflight   atomic.Int64
}

// pauseView is AGL's PauseStateResponse.
type pauseView struct {
	Paused            bool    `json:"paused"`
	RetryAfterSeconds int64   `json:"retry_after_seconds"`
	Reason            *string `json:"reason"`
	Inflight          int64   `json:"inflight"`
}

func (p *pauseState) view() pauseView {
	p.mu.Lock()
	defer p.mu.Unlock()
	return pauseView{Paused: p.paused, RetryAfterSeconds: p.retryAfter, Reason: p.reason, Inflight: p.inflight.Load()}
}

// maxRetryAfter is the largest retry_after_seconds of POST /proxy/pause (a day).
const maxRetryAfter = 86400

// postPause serves POST /proxy/pause {"retry_after_seconds": 5, "reason": null}.
func (s *Server) postPause(ctx *fasthttp.RequestCtx) {
	body, ok := bodyRaw(ctx, false)
	if !ok {
		return
	}
	in, _ := members(body) // an object: bodyRaw checked it
	retry := int64(5)
	var reason *string
	var errs []fieldError
	if v, given := in["retry_after_seconds"]; given {
		n, ok := intValue(v)
		switch {
		case !ok:
			errs = append(errs, fieldError{Type: "int_parsing", Loc: []any{"body", "retry_after_seconds"}, Msg: "Input should be a valid integer", Input: v})
		case n < 0 || n > maxRetryAfter:
			// Stricter than AGL (any int): it becomes the Retry-After header.
			errs = append(errs, fieldError{Type: "range", Loc: []any{"body", "retry_after_seconds"}, Msg: fmt.Sprintf("Input should be between 0 and %d", maxRetryAfter), Input: v})
		}
		retry = n
	}
	if v := in["reason"]; given(v) {
		var r string
		if json.Unmarshal(v, &r) != nil {
			errs = append(errs, fieldError{Type: "string_type", Loc: []any{"body", "reason"}, Msg: "Input should be a valid string", Input: v})
		}
		reason = &r
	}
	if len(errs) > 0 {
		invalid(ctx, errs...)
		return
	}
	s.pause.mu.Lock()
	s.pause.paused, s.pause.retryAfter, s.pause.reason = true, retry, reason
	s.pause.mu.Unlock()
	s.log.Info("agl: proxy paused", "retry_after_seconds", retry, "in_flight", s.pause.inflight.Load())
	writeJSON(ctx, fasthttp.StatusOK, s.pause.view())
}

// postResume serves POST /proxy/resume.
func (s *Server) postResume(ctx *fasthttp.RequestCtx) {
	s.pause.mu.Lock()
	s.pause.paused, s.pause.reason = false, nil
	s.pause.mu.Unlock()
	writeJSON(ctx, fasthttp.StatusOK, s.pause.view())
}

// getPauseState serves GET /proxy/state.
func (s *Server) getPauseState(ctx *fasthttp.RequestCtx) {
	writeJSON(ctx, fasthttp.StatusOK, s.pause.view())
}

// proxyRoute is the model route's path before the endpoint's.
const proxyRoute = "/proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{mode}/openai/v1"

// proxyEndpoints are the endpoints of the model route, after proxyRoute.
var proxyEndpoints = []struct {
	path string
	ep   openai.Endpoint
}{
	{"/chat/completions", openai.ChatCompletions},
	{"/completions", openai.Completions},
}

// proxy serves POST /proxy/rollout/{r}/attempt/{a}/mode/{m}/openai/v1/{path}
// (proxyRoute, proxyEndpoints) through the gateway's proxy path, with the
// mode's forced fields; rest is the path after /proxy/rollout/.
func (s *Server) proxy(ctx *fasthttp.RequestCtx, rest []string) {
	// rollout/{r}/attempt/{a}/mode/{m}/openai/v1/{rest...}
	parts := strings.SplitN("rollout/"+rest[0], "/", 9)
	if len(parts) < 9 || parts[0] != "rollout" || parts[2] != "attempt" || parts[4] != "mode" || parts[6] != "openai" || parts[7] != "v1" ||
		parts[1] == "" || parts[3] == "" {
		detail(ctx, fasthttp.StatusNotFound, "Not Found")
		return
	}
	if !ctx.IsPost() {
		detail(ctx, fasthttp.StatusMethodNotAllowed, "Method Not Allowed")
		return
	}
	rolloutID, attemptID, mode, upstream := parts[1], parts[3], parts[5], "/"+parts[8]
	if mode != "train" && mode != "val" {
		detail(ctx, fasthttp.StatusNotFound, "Unsupported proxy mode: "+mode)
		return
	}
	ep := openai.Unknown
	for _, e := range proxyEndpoints {
		if e.path == upstream {
			ep = e.ep
		}
	}
	if ep == openai.Unknown {
		detail(ctx, fasthttp.StatusNotFound, "Unsupported upstream path: "+upstream[1:])
		return
	}
	if !gateway.ValidID([]byte(rolloutID)) || !gateway.ValidID([]byte(attemptID)) {
		detail(ctx, fasthttp.StatusNotFound, "Rollout not found: "+rolloutID)
		return
	}
	c, cancel := storeCtx()
	st, ok := s.rollout(ctx, c, rolloutID)
	cancel()
	if !ok {
		return
	}
	if body := ctx.PostBody(); len(body) > 0 {
		if err := jsonscan.Validate(body); errors.Is(err, jsonscan.ErrTooDeep) {
			detail(ctx, fasthttp.StatusBadRequest, "Invalid JSON in request body: "+err.Error())
			return
		} else if err != nil {
			detail(ctx, fasthttp.StatusBadRequest, "Invalid JSON in request body")
			return
		}
	}
	if len(ctx.PostBody()) == 0 {
		ctx.Request.SetBodyString("{}")
	}
	pool := s.table.Load().Pool([]byte(s.cfg.ModelName))
	if pool == nil {
		detail(ctx, fasthttp.StatusServiceUnavailable, "No servers available for model '"+s.cfg.ModelName+"'")
		return
	}
	s.pause.mu.Lock()
	if s.pause.paused {
		retry, reason := s.pause.retryAfter, s.pause.reason
		s.pause.mu.Unlock()
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(retry, 10))
		ctx.Response.Header.Set("X-Agl-Paused", "true")
		writeJSON(ctx, fasthttp.StatusTooManyRequests, map[string]any{"error": "gateway paused", "reason": reason})
		return
	}
	s.pause.inflight.Add(1)
	s.pause.mu.Unlock()
	// AGL's key is not the engine's: never forwarded.
	ctx.Request.Header.Del("x-api-key")
	ctx.Request.Header.Del("Authorization")
	// The task id of the rollout's calls (its data id), as rollgate's own
	// rollouts carry theirs.
	if st.TaskID != "" && len(ctx.Request.Header.Peek("x-task-id")) == 0 {
		ctx.Request.Header.Set("x-task-id", st.TaskID)
	}
	s.gw.ProxyAgent(ctx, gateway.AgentCall{RolloutID: rolloutID, AttemptID: attemptID, Endpoint: ep,
		Force: s.force.get(mode == "train", ep), DetailErrors: true, Done: func() { s.pause.inflight.Add(-1) },
		Retries: s.cfg.Retries, RetryBackoff: s.cfg.RetryBackoff, RetryStatuses: true,
		Pool: pool, EngineAnswersOnly: true})
}
