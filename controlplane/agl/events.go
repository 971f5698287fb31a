package agl

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/trainer-bridge/tasks"
)

// eventView is AGL's Event.
type eventView struct {
	EventType string          `json:"event_type"`
	RolloutID string          `json:"rollout_id"`
	AttemptID string          `json:"attempt_id"`
	Timestamp float64         `json:"timestamp"`
	Data      json.RawMessage `json:"data"`

	call *export.Call // the captured row of a model_request event (choice 0)
}

// defaultAttempt is AGL's DEFAULT_ATTEMPT_ID.
const defaultAttempt = "0"

// postEvent serves POST /api/rollouts/{r}/attempt/{a}/events. A reward
// event with a numeric data.value also lands in the rewards table.
func (s *Server) postEvent(ctx *fasthttp.RequestCtx, rolloutID, attemptID string) {
	body, ok := bodyJSON(ctx, false)
	if !ok {
		return
	}
	var errs []fieldError
	typ := body.Get("event_type")
	switch {
	case !typ.Exists():
		errs = append(errs, fieldError{Type: "missing", Loc: []any{"body", "event_type"}, Msg: "Field required", Input: json.RawMessage(body.Raw)})
	case typ.Type != gjson.String:
		errs = append(errs, fieldError{Type: "string_type", Loc: []any{"body", "event_type"}, Msg: "Input should be a valid string", Input: json.RawMessage(typ.Raw)})
	}
	data := body.Get("data")
	if data.Exists() && !data.IsObject() {
		errs = append(errs, fieldError{Type: "dict_type", Loc: []any{"body", "data"}, Msg: "Input should be a valid dictionary", Input: json.RawMessage(data.Raw)})
	}
	if v := data.Get("value"); typ.Str == "reward" && v.Type == gjson.Number && (math.IsInf(v.Float(), 0) || math.IsNaN(v.Float())) {
		// Stricter than AGL: a number JSON can write but a float64 cannot
		// hold (1e999) would be an infinite reward.
		errs = append(errs, fieldError{Type: "finite_number", Loc: []any{"body", "data", "value"}, Msg: "Input should be a finite number", Input: json.RawMessage(v.Raw)})
	}
	if len(errs) > 0 {
		invalid(ctx, errs...)
		return
	}
	e := tasks.Event{RolloutID: rolloutID, AttemptID: attemptID, Type: typ.Str, Data: json.RawMessage("{}")}
	if data.Exists() {
		e.Data = json.RawMessage(data.Raw)
	}
	c, cancel := storeCtx()
	defer cancel()
	if err := s.d.Queue.AddEvent(c, &e); err != nil {
		if err == tasks.ErrNotFound {
			detail(ctx, fasthttp.StatusNotFound, "Rollout not found: "+rolloutID)
			return
		}
		s.storeError(ctx, "recording an event of "+rolloutID, err)
		return
	}
	if v := data.Get("value"); e.Type == "reward" && v.Type == gjson.Number {
		source := "agl"
		if src := data.Get("source"); src.Type == gjson.String && src.Str != "" {
			source = "agl:" + src.Str
		}
		row := export.Reward{RolloutID: rolloutID, AttemptID: attemptID, Name: "primary", Value: v.Float(),
			Source: source, TimeUnixNano: uint64(e.TimeNano)}
		if err := s.d.Store.Write(c, &export.Batch{Rewards: []export.Reward{row}}); err != nil {
			// The event is stored (the trainer reads rewards from events);
			// the rewards table misses this one.
			s.log.Warn("agl: storing a reward event in the rewards table", "rollout_id", rolloutID, "err", err)
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, eventView{EventType: e.Type, RolloutID: rolloutID, AttemptID: attemptID,
		Timestamp: nsToSeconds(e.TimeNano), Data: e.Data})
}

// getEvents serves GET /api/rollouts/{r}/events?event_type=&format=triplet:
// the events of attempt last_attempt_id (or "0").
func (s *Server) getEvents(ctx *fasthttp.RequestCtx, id string) {
	c, cancel := storeCtx()
	defer cancel()
	st, ok := s.rollout(ctx, c, id)
	if !ok {
		return
	}
	attempt := st.AttemptID
	if attempt == "" {
		attempt = defaultAttempt
	}
	evs, err := s.events(c, st, attempt, true)
	if err != nil {
		s.storeError(ctx, "reading the events of "+id, err)
		return
	}
	args := ctx.QueryArgs()
	if args.Has("event_type") {
		typ := string(args.Peek("event_type"))
		kept := evs[:0]
		for _, e := range evs {
			if e.EventType == typ {
				kept = append(kept, e)
			}
		}
		evs = kept
	}
	if string(args.Peek("format")) == "triplet" {
		evs = triplets(evs)
	}
	if evs == nil {
		evs = []eventView{}
	}
	writeJSON(ctx, fasthttp.StatusOK, evs)
}

// events returns the rollout's events of attempt ("" = every attempt):
// the stored ones and a model_request for each captured call, ordered by
// time (a call's event is made when its response ends, as AGL's proxy
// records it). sync first waits for the capture of calls already answered.
func (s *Server) events(c context.Context, st *tasks.State, attempt string, sync bool) ([]eventView, error) {
	if sync && s.d.Capture != nil {
		// After a kill, the calls of the earlier run come back from the
		// capture WAL: wait for them too.
		select {
		case <-s.d.Capture.Replayed():
		case <-c.Done():
			return nil, fmt.Errorf("waiting for the replay of the capture log: %w", c.Err())
		}
		if err := s.d.Capture.Sync(c); err != nil {
			return nil, err
		}
	}
	stored, err := s.d.Queue.Events(c, st.RolloutID)
	if err != nil {
		return nil, err
	}
	var out []eventView
	for _, e := range stored {
		if attempt == "" || e.AttemptID == attempt {
			out = append(out, eventView{EventType: e.Type, RolloutID: e.RolloutID, AttemptID: e.AttemptID,
				Timestamp: nsToSeconds(e.TimeNano), Data: e.Data})
		}
	}
	calls, err := s.d.Store.Calls(c, export.CallFilter{RolloutID: st.RolloutID, AttemptID: attempt})
	if err != nil {
		return nil, fmt.Errorf("reading the calls of %s: %w", st.RolloutID, err)
	}
	seen := map[string]bool{}
	for i := range calls {
		cl := &calls[i]
		// Rows of a deleted rollout of the same id stay in llm_calls: only
		// calls made since this rollout was created are its events.
		if seen[cl.SpanID] || int64(cl.StartTimeUnixNano) < st.CreatedNano || cl.Endpoint == "embeddings" {
			continue
		}
		seen[cl.SpanID] = true
		out = append(out, eventView{EventType: "model_request", RolloutID: cl.RolloutID, AttemptID: cl.AttemptID,
			Timestamp: nsToSeconds(int64(cl.EndTimeUnixNano)), Data: modelRequestData(cl), call: cl})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Timestamp < out[j].Timestamp })
	return out, nil
}

// policyVersion is the registered model version of a row (AGL's
// Model.version, an integer), or nil.
func policyVersion(v string) any {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n
	}
	if v == "" {
		return nil
	}
	return v
}

// modelRequestData is the data of AGL's model_request event, from the
// captured row of the call's first choice.
func modelRequestData(cl *export.Call) json.RawMessage {
	resp := json.RawMessage(cl.ResponseBody)
	if jsonscan.Validate(jsonscan.Bytes(cl.ResponseBody)) != nil || !gjson.Parse(cl.ResponseBody).IsObject() {
		resp = json.RawMessage("{}")
	}
	req := json.RawMessage(cl.RequestBody)
	if jsonscan.Validate(jsonscan.Bytes(cl.RequestBody)) != nil {
		req = json.RawMessage("{}")
	} else if cl.Overrides != "" {
		// The request as sent: the agent's body with the forced fields.
		var m map[string]any
		if json.Unmarshal([]byte(cl.Overrides), &m) == nil {
			if fs, err := rewrite.ForceMap(m); err == nil {
				if b, err := fs.Force(nil, req); err == nil {
					req = b
				}
			}
		}
	}
	status := "ok"
	if cl.HTTPStatus >= 400 || cl.HTTPStatus == 0 {
		status = "error"
	}
	version := policyVersion(cl.PolicyVersion)
	var usage any
	if u := gjson.Get(string(resp), "usage"); u.IsObject() {
		usage = json.RawMessage(u.Raw)
	}
	var finish any
	if cl.FinishReason != "" {
		finish = cl.FinishReason
	}
	d := map[string]any{
		"model": cl.Model, "model_version": version, "request": req, "response": resp,
		"server":      map[string]any{"model": cl.Model, "endpoint": cl.Backend, "version": version},
		"latency_ms":  float64(cl.EndTimeUnixNano-min(cl.StartTimeUnixNano, cl.EndTimeUnixNano)) / float64(time.Millisecond),
		"http_status": int(cl.HTTPStatus), "status": status, "retry_count": retryCount(cl.BackendAttempts), "usage": usage, "finish_reason": finish,
	}
	if cl.Overrides != "" {
		d["adjusted_params"] = json.RawMessage(cl.Overrides)
	}
	b, _ := json.Marshal(d)
	return b
}

// triplets is AGL's ?format=triplet: model_request and reward events
// trimmed, then only the last model_request of each prompt kept.
func triplets(evs []eventView) []eventView {
	last := map[string]int{}
	for i := range evs {
		e := &evs[i]
		switch e.EventType {
		case "model_request":
			e.Data = tripletData(e)
			last[gjson.GetBytes(e.Data, "prompt_token_ids").Raw] = i
		case "reward":
			d := map[string]json.RawMessage{"value": json.RawMessage(rawOr(gjson.GetBytes(e.Data, "value").Raw, "null"))}
			for _, k := range []string{"source", "reason"} {
				if v := gjson.GetBytes(e.Data, k); v.Exists() {
					d[k] = json.RawMessage(v.Raw)
				}
			}
			e.Data, _ = json.Marshal(d)
		}
	}
	out := evs[:0]
	for i, e := range evs {
		if e.EventType != "model_request" || last[gjson.GetBytes(e.Data, "prompt_token_ids").Raw] == i {
			out = append(out, e)
		}
	}
	return out
}

// tripletData trims a model_request: token ids and logprobs from the
// captured row's columns (the same for a streamed call as for the call
// not streamed), the server, the status and the engine's error.
func tripletData(e *eventView) json.RawMessage {
	cl := e.call
	if cl == nil { // a model_request posted by a client: AGL reads its response
		return tripletFromResponse(e.Data)
	}
	prompt, response := cl.PromptTokenIDs, cl.ResponseTokenIDs
	errored := cl.HTTPStatus >= 400 || cl.HTTPStatus == 0
	if errored {
		// AGL reads the ids from the engine's body, which an error has none
		// of (so every error event shares the key [] in the de-dup); ids a
		// fallback tokenizer may have put on the row are not the engine's.
		prompt, response = nil, nil
	}
	if prompt == nil {
		prompt = []uint32{}
	}
	if response == nil {
		response = []uint32{}
	}
	var logprobs any
	if len(cl.ResponseLogprobs) > 0 && !errored {
		// The column is Float32: written at float32 precision (-0.182, not
		// -0.18199999630451202), the engine's value as far as it was kept.
		lp := make([]json.Number, len(cl.ResponseLogprobs))
		ok := true
		for i, v := range cl.ResponseLogprobs {
			f := float64(v)
			ok = ok && !math.IsNaN(f) && !math.IsInf(f, 0)
			lp[i] = json.Number(strconv.FormatFloat(f, 'g', -1, 32))
		}
		if ok {
			logprobs = lp
		}
	}
	d := map[string]any{"prompt_token_ids": prompt, "response_token_ids": response, "response_log_probs": logprobs,
		"server":      map[string]any{"model": cl.Model, "version": policyVersion(cl.PolicyVersion)},
		"http_status": int(cl.HTTPStatus), "status": gjson.GetBytes(e.Data, "status").String()}
	if v := gjson.GetBytes(e.Data, "response.error"); v.Exists() {
		d["error"] = json.RawMessage(v.Raw)
	}
	b, _ := json.Marshal(d)
	return b
}

// tripletFromResponse is AGL's trim of a model_request event's data.
func tripletFromResponse(data json.RawMessage) json.RawMessage {
	resp := gjson.GetBytes(data, "response")
	prompt, response := json.RawMessage("[]"), json.RawMessage("[]")
	var logprobs any
	if resp.IsObject() {
		if v := resp.Get("prompt_token_ids"); v.IsArray() && len(v.Array()) > 0 {
			prompt = json.RawMessage(v.Raw)
		} else if v := resp.Get("choices.0.prompt_token_ids"); v.IsArray() {
			prompt = json.RawMessage(v.Raw)
		}
		if v := resp.Get("choices.0.token_ids"); v.IsArray() {
			response = json.RawMessage(v.Raw)
		}
		logprobs = choiceLogprobs(resp.Get("choices.0.logprobs"))
	}
	srv := gjson.GetBytes(data, "server")
	d := map[string]any{"prompt_token_ids": prompt, "response_token_ids": response, "response_log_probs": logprobs,
		"server": map[string]json.RawMessage{"model": json.RawMessage(rawOr(srv.Get("model").Raw, "null")),
			"version": json.RawMessage(rawOr(srv.Get("version").Raw, "null"))}}
	for _, k := range []string{"http_status", "status"} {
		if v := gjson.GetBytes(data, k); v.Exists() {
			d[k] = json.RawMessage(v.Raw)
		}
	}
	if v := resp.Get("error"); resp.IsObject() && v.Exists() {
		d["error"] = json.RawMessage(v.Raw)
	}
	b, _ := json.Marshal(d)
	return b
}

// choiceLogprobs is AGL's _extract_choice_log_probs: the chosen tokens'
// logprobs of a chat or completions choice, or nil when unusable.
func choiceLogprobs(lp gjson.Result) []float64 {
	var raw []gjson.Result
	switch {
	case lp.Get("content").IsArray():
		for _, it := range lp.Get("content").Array() {
			if !it.IsObject() || !it.Get("logprob").Exists() {
				return nil
			}
			raw = append(raw, it.Get("logprob"))
		}
	case lp.Get("token_logprobs").IsArray():
		raw = lp.Get("token_logprobs").Array()
	default:
		return nil
	}
	out := make([]float64, 0, len(raw))
	for _, v := range raw {
		if v.Type != gjson.Number {
			return nil
		}
		f := v.Float()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil
		}
		out = append(out, f)
	}
	return out
}

// attemptsOf returns the attempts of a rollout that have events, with the
// time (unix ns) of the first: stored events, and captured calls counted in
// the store (one aggregate query: the trainer polls GET /api/rollouts/{id}
// for every pending rollout, and a call's bodies are not needed here).
func (s *Server) attemptsOf(c context.Context, st *tasks.State) (map[string]int64, error) {
	first := map[string]int64{}
	note := func(attempt string, ns int64) {
		if t, ok := first[attempt]; !ok || ns < t {
			first[attempt] = ns
		}
	}
	stored, err := s.d.Queue.Events(c, st.RolloutID)
	if err != nil {
		return nil, err
	}
	for _, e := range stored {
		note(e.AttemptID, e.TimeNano)
	}
	if !gateway.ValidID([]byte(st.RolloutID)) { // never true for a stored rollout; the id is quoted below
		return nil, fmt.Errorf("rollout id %q cannot be queried", st.RolloutID)
	}
	res, err := s.d.Store.Query(c, fmt.Sprintf(`SELECT attempt_id, min(end_time_unix_nano) FROM llm_calls
		WHERE rollout_id = '%s' AND start_time_unix_nano >= %d AND endpoint != 'embeddings' GROUP BY attempt_id`,
		st.RolloutID, st.CreatedNano))
	if err != nil {
		return nil, fmt.Errorf("reading the calls of %s: %w", st.RolloutID, err)
	}
	for _, row := range res.Rows {
		if len(row) == 2 {
			ns, err := strconv.ParseInt(row[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("reading the calls of %s: end time %q: %w", st.RolloutID, row[1], err)
			}
			note(row[0], ns)
		}
	}
	return first, nil
}

// retryCount is AGL's retry_count: the backend attempts after the first
// (0 on rows of releases that did not count them).
func retryCount(attempts uint16) int { return max(int(attempts)-1, 0) }
