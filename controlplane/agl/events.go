package agl

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/jsonscan"
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

// isNumber reports whether raw, a valid JSON value, is a number.
func isNumber(raw json.RawMessage) bool {
	return len(raw) > 0 && (raw[0] == '-' || '0' <= raw[0] && raw[0] <= '9')
}

// rewardValue reads a reward event's data.value: a number a float64 holds
// (1e999 is not), else false.
func rewardValue(raw json.RawMessage) (float64, bool) {
	var f float64
	if !isNumber(raw) || json.Unmarshal(raw, &f) != nil {
		return 0, false
	}
	return f, true
}

// postEvent serves POST /api/rollouts/{r}/attempt/{a}/events. A reward
// event with a numeric data.value also lands in the rewards table.
func (s *Server) postEvent(ctx *fasthttp.RequestCtx, rolloutID, attemptID string) {
	body, ok := bodyRaw(ctx, false)
	if !ok {
		return
	}
	// AGL's EventCreate: event_type a string, data an object ({} when
	// absent); other members ignored.
	in, _ := members(body) // an object: bodyRaw checked it
	var errs []fieldError
	var typ string
	if v, given := in["event_type"]; !given {
		errs = append(errs, fieldError{Type: "missing", Loc: []any{"body", "event_type"}, Msg: "Field required", Input: body})
	} else if json.Unmarshal(v, &typ) != nil || string(v) == "null" {
		errs = append(errs, fieldError{Type: "string_type", Loc: []any{"body", "event_type"}, Msg: "Input should be a valid string", Input: v})
	}
	data, hasData := in["data"]
	dataMembers, isObj := members(data)
	if hasData && !isObj {
		errs = append(errs, fieldError{Type: "dict_type", Loc: []any{"body", "data"}, Msg: "Input should be a valid dictionary", Input: data})
	}
	value, isValue := rewardValue(dataMembers["value"])
	if v := dataMembers["value"]; typ == "reward" && isNumber(v) && !isValue {
		// Stricter than AGL: a number JSON can write but a float64 cannot
		// hold (1e999) would be an infinite reward.
		errs = append(errs, fieldError{Type: "finite_number", Loc: []any{"body", "data", "value"}, Msg: "Input should be a finite number", Input: v})
	}
	if len(errs) > 0 {
		invalid(ctx, errs...)
		return
	}
	e := tasks.Event{RolloutID: rolloutID, AttemptID: attemptID, Type: typ, Data: json.RawMessage("{}")}
	if hasData {
		e.Data = data
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
	if e.Type == "reward" && isValue {
		source := "agl"
		var src string
		if json.Unmarshal(dataMembers["source"], &src) == nil && src != "" {
			source = "agl:" + src
		}
		row := export.Reward{RolloutID: rolloutID, AttemptID: attemptID, Name: "primary", Value: value,
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

// Paging of GET /api/rollouts/{r}/events (beyond AGL, whose clients send
// neither parameter and read every event).
const (
	// maxEventPage is the default and the largest ?limit: the events of
	// one answer. An answer that stops there names the next position in
	// nextAfterHeader.
	maxEventPage = 10000
	// nextAfterHeader carries the ?after= of the next page when events
	// follow the page answered; it is absent on the last page.
	nextAfterHeader = "X-Rollgate-Next-After"
)

// maxEventPageBytes ends a page asked for with ?after= or ?limit= once
// its events' stored data (bodies of captured calls, data of posted events)
// reach it; a page always holds at least one event. (A variable for tests.)
var maxEventPageBytes int64 = 16 << 20

// getEvents serves GET /api/rollouts/{r}/events?event_type=&format=triplet
// &after=&limit=: the events of attempt last_attempt_id (or "0"), from
// position after (0-based, in the list the filters give) on, at most limit
// of them. It lists the events without their data, then streams the JSON
// array out reading one event's data at a time, so an answer holds one
// event in memory, however large the rollout's events are.
func (s *Server) getEvents(ctx *fasthttp.RequestCtx, id string) {
	args := ctx.QueryArgs()
	after, ok := rangeQuery(ctx, "after", 0, 0, math.MaxInt64)
	if !ok {
		return
	}
	limit, ok := rangeQuery(ctx, "limit", maxEventPage, 1, maxEventPage)
	if !ok {
		return
	}
	paged := args.Has("after") || args.Has("limit")
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
	refs, err := s.eventRefs(c, st, attempt, true)
	if err != nil {
		s.storeError(ctx, "reading the events of "+id, err)
		return
	}
	if args.Has("event_type") {
		typ := string(args.Peek("event_type"))
		refs = slices.DeleteFunc(refs, func(r eventRef) bool { return r.typ != typ })
	}
	triplet := string(args.Peek("format")) == "triplet"
	if triplet {
		if refs, err = s.lastOfEachPrompt(c, refs); err != nil {
			s.storeError(ctx, "reading the events of "+id, err)
			return
		}
	}
	page := refs[min(after, int64(len(refs))):]
	n, size := 0, int64(0)
	for n < len(page) && n < int(limit) && (n == 0 || !paged || size < maxEventPageBytes) {
		size += page[n].size
		n++
	}
	if n < len(page) {
		ctx.Response.Header.Set(nextAfterHeader, strconv.FormatInt(after+int64(n), 10))
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.SetBodyStream(&eventStream{refs: page[:n], load: func(r eventRef) (io.Reader, error) {
		c, cancel := storeCtx()
		defer cancel()
		rd, err := s.eventJSON(c, r, triplet)
		if err != nil {
			s.log.Warn("agl: reading an event while answering; the answer is cut off", "rollout_id", id, "err", err)
		}
		return rd, err
	}}, -1)
}

// eventChunk is the most characters of a stored event's data read at once.
const eventChunk = 1 << 20

// eventJSON is the JSON of the event r names, as a reader: a stored event
// that the answer does not reshape has its data read in parts of
// eventChunk characters, as stored (JSON checked when it was recorded),
// while the answer is written.
func (s *Server) eventJSON(c context.Context, r eventRef, triplet bool) (io.Reader, error) {
	if r.call != nil || triplet && (r.typ == "model_request" || r.typ == "reward") {
		e, err := s.loadEvent(c, r, triplet)
		if err != nil {
			return nil, err
		}
		b, err := json.Marshal(e)
		return bytes.NewReader(b), err
	}
	head, err := json.Marshal(eventView{EventType: r.typ, RolloutID: r.rollout, AttemptID: r.attempt, Timestamp: nsToSeconds(r.timeNano), Data: json.RawMessage("0")})
	if err != nil {
		return nil, err
	}
	// head ends with the placeholder: "data":0}
	return io.MultiReader(bytes.NewReader(head[:len(head)-2]), &eventData{q: s.d.Queue, r: r, log: s.log}, strings.NewReader("}")), nil
}

// eventData reads a stored event's data in parts of eventChunk characters.
type eventData struct {
	q    *tasks.Queue
	r    eventRef
	log  *slog.Logger
	from int64 // characters read so far
	part string
}

// Read implements io.Reader.
func (d *eventData) Read(p []byte) (int, error) {
	if d.part == "" {
		if d.from >= d.r.size {
			return 0, io.EOF
		}
		c, cancel := storeCtx()
		part, err := d.q.EventData(c, d.r.rollout, d.r.seq, d.from, eventChunk)
		cancel()
		if err == nil && part == "" {
			err = fmt.Errorf("event %d of %s ends at %d of its %d characters", d.r.seq, d.r.rollout, d.from, d.r.size)
		}
		if err != nil {
			d.log.Warn("agl: reading an event while answering; the answer is cut off", "rollout_id", d.r.rollout, "err", err)
			return 0, err
		}
		d.part, d.from = part, d.from+int64(utf8.RuneCountInString(part))
	}
	n := copy(p, d.part)
	d.part = d.part[n:]
	return n, nil
}

// rangeQuery reads an integer query parameter within [lo, hi] (def when
// absent); false after answering 422 naming the parameter and its range.
func rangeQuery(ctx *fasthttp.RequestCtx, name string, def, lo, hi int64) (int64, bool) {
	n, ok := intQuery(ctx, name, def)
	if !ok {
		return 0, false
	}
	switch {
	case n < lo:
		invalid(ctx, fieldError{Type: "greater_than_equal", Loc: []any{"query", name}, Msg: fmt.Sprintf("Input should be greater than or equal to %d", lo), Input: string(ctx.QueryArgs().Peek(name))})
		return 0, false
	case n > hi:
		invalid(ctx, fieldError{Type: "less_than_equal", Loc: []any{"query", name}, Msg: fmt.Sprintf("Input should be less than or equal to %d", hi), Input: string(ctx.QueryArgs().Peek(name))})
		return 0, false
	}
	return n, true
}

// eventStream is the JSON array of a page of events, as an io.Reader that
// fasthttp pulls from while writing the answer: each event is read (load)
// when the previous one has been written. A failed read ends the answer
// with the error, which cuts the connection: the client never takes a
// shortened array for the whole.
type eventStream struct {
	refs []eventRef
	load func(eventRef) (io.Reader, error)
	next int       // refs[next] is loaded next
	cur  io.Reader // the bytes being written, nil between events
	done bool
}

// Read implements io.Reader.
func (r *eventStream) Read(p []byte) (int, error) {
	for {
		if r.cur == nil {
			switch {
			case r.done:
				return 0, io.EOF
			case r.next == len(r.refs):
				r.cur, r.done = strings.NewReader("]"), true
				if r.next == 0 {
					r.cur = strings.NewReader("[]")
				}
			default:
				ev, err := r.load(r.refs[r.next])
				if err != nil {
					return 0, err
				}
				sep := ","
				if r.next == 0 {
					sep = "["
				}
				r.cur = io.MultiReader(strings.NewReader(sep), ev)
				r.next++
			}
		}
		n, err := r.cur.Read(p)
		if err == io.EOF {
			r.cur, err = nil, nil
			if n == 0 {
				continue
			}
		}
		return n, err
	}
}

// eventRef is one event of a rollout without its data: what to read it
// by, and the stored size of what reading it loads.
type eventRef struct {
	rollout  string
	attempt  string
	typ      string
	timeNano int64
	size     int64
	seq      int64 // a stored event's Seq (tasks.Event), when call is nil
	call     *export.CallKey
	span     string // the captured call's span id
}

// eventRefs lists the rollout's events of attempt: the stored ones and a
// model_request for each captured call, ordered by time (a call's event is
// made when its response ends, as AGL's proxy records it), without their
// data. sync first waits for the capture of calls already answered.
func (s *Server) eventRefs(c context.Context, st *tasks.State, attempt string, sync bool) ([]eventRef, error) {
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
	stored, err := s.d.Queue.EventHeads(c, st.RolloutID, attempt)
	if err != nil {
		return nil, err
	}
	var out []eventRef
	for _, e := range stored {
		out = append(out, eventRef{rollout: e.RolloutID, attempt: e.AttemptID, typ: e.Type, timeNano: e.TimeNano, size: e.Size, seq: e.Seq})
	}
	// The calls' keys and body sizes, not their rows: the bodies are read
	// one call at a time when the event is written. Rows of a deleted
	// rollout of the same id stay in llm_calls: only calls made since this
	// rollout was created are its events.
	heads, err := s.d.Store.CallHeads(c, export.CallHeadQuery{RolloutID: st.RolloutID, AttemptID: attempt, Since: uint64(max(st.CreatedNano, 0))})
	if err != nil {
		return nil, fmt.Errorf("reading the calls of %s: %w", st.RolloutID, err)
	}
	seen := map[string]bool{}
	for _, h := range heads {
		if seen[h.SpanID] {
			continue
		}
		seen[h.SpanID] = true
		out = append(out, eventRef{rollout: st.RolloutID, attempt: attempt, typ: "model_request", timeNano: int64(h.EndTimeUnixNano), size: int64(h.BodyBytes),
			span: h.SpanID, call: &export.CallKey{RolloutID: st.RolloutID, AttemptID: attempt, SequenceID: h.SequenceID, ChoiceIndex: h.ChoiceIndex}})
	}
	sort.SliceStable(out, func(i, j int) bool { return nsToSeconds(out[i].timeNano) < nsToSeconds(out[j].timeNano) })
	return out, nil
}

// loadEvent reads the data of the event r names, trimmed as a triplet when
// triplet is set.
func (s *Server) loadEvent(c context.Context, r eventRef, triplet bool) (*eventView, error) {
	var e *eventView
	if r.call == nil {
		ev, err := s.d.Queue.Event(c, r.rollout, r.seq)
		if err != nil {
			return nil, err
		}
		e = &eventView{EventType: ev.Type, RolloutID: ev.RolloutID, AttemptID: ev.AttemptID, Timestamp: nsToSeconds(ev.TimeNano), Data: ev.Data}
	} else {
		cl, err := s.call(c, r)
		if err != nil {
			return nil, err
		}
		e = &eventView{EventType: "model_request", RolloutID: cl.RolloutID, AttemptID: cl.AttemptID,
			Timestamp: nsToSeconds(int64(cl.EndTimeUnixNano)), Data: modelRequestData(cl), call: cl}
	}
	if triplet {
		trimTriplet(e)
	}
	return e, nil
}

// call reads the captured row of r through Store.Call (one row), or, when
// another call of the attempt has the same sequence id and started later,
// by its span id.
func (s *Server) call(c context.Context, r eventRef) (*export.Call, error) {
	cl, err := s.d.Store.Call(c, *r.call)
	if err == nil && (cl == nil || cl.SpanID != r.span) {
		var rows []export.Call
		rows, err = s.d.Store.Calls(c, export.CallFilter{RolloutID: r.call.RolloutID, AttemptID: r.call.AttemptID, SpanID: r.span, Limit: 1})
		cl = nil
		if len(rows) > 0 {
			cl = &rows[0]
		}
	}
	if err != nil {
		return nil, fmt.Errorf("reading call %d of %s: %w", r.call.SequenceID, r.call.RolloutID, err)
	}
	if cl == nil {
		return nil, fmt.Errorf("call %d (span %s) of %s is no longer stored", r.call.SequenceID, r.span, r.call.RolloutID)
	}
	return cl, nil
}

// lastOfEachPrompt is AGL's triplet de-dup: among model_request events,
// only the last of each prompt_token_ids list is kept. Each event's prompt
// is read on its own (a captured call's row without its bodies) and only
// its hash is kept.
func (s *Server) lastOfEachPrompt(c context.Context, refs []eventRef) ([]eventRef, error) {
	keys := make([][sha256.Size]byte, len(refs))
	last := map[[sha256.Size]byte]int{}
	gone := map[int]bool{}
	for i, r := range refs {
		if r.typ != "model_request" {
			continue
		}
		var prompt []byte
		if r.call == nil {
			e, err := s.loadEvent(c, r, true)
			if err != nil {
				return nil, err
			}
			prompt = []byte(gjson.GetBytes(e.Data, "prompt_token_ids").Raw)
		} else {
			rows, err := s.d.Store.Calls(c, export.CallFilter{RolloutID: r.call.RolloutID, AttemptID: r.call.AttemptID, SpanID: r.span, Limit: 1,
				Omit: export.ReadOptions{NoRequestBody: true, NoResponseBody: true}})
			if err != nil {
				return nil, fmt.Errorf("reading call %d of %s: %w", r.call.SequenceID, r.call.RolloutID, err)
			}
			if len(rows) == 0 { // deleted since listed
				gone[i] = true
				continue
			}
			prompt, _ = json.Marshal(promptIDs(&rows[0]))
		}
		keys[i] = sha256.Sum256(prompt)
		last[keys[i]] = i
	}
	out := refs[:0]
	for i, r := range refs {
		if r.typ != "model_request" || !gone[i] && last[keys[i]] == i {
			out = append(out, r)
		}
	}
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

// trimTriplet is AGL's ?format=triplet trim of one event: model_request
// and reward events keep only what a triplet needs (lastOfEachPrompt then
// keeps the last model_request of each prompt).
func trimTriplet(e *eventView) {
	switch e.EventType {
	case "model_request":
		e.Data = tripletData(e)
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

// promptIDs is a captured call's prompt_token_ids as its triplet has them:
// none for an errored call (AGL reads the ids from the engine's body, which
// an error has none of, so every error event shares the key [] in the
// de-dup; ids a fallback tokenizer may have put on the row are not the
// engine's).
func promptIDs(cl *export.Call) []uint32 {
	if cl.PromptTokenIDs == nil || cl.HTTPStatus >= 400 || cl.HTTPStatus == 0 {
		return []uint32{}
	}
	return cl.PromptTokenIDs
}

// tripletData trims a model_request: token ids and logprobs from the
// captured row's columns (the same for a streamed call as for the call
// not streamed), the server, the status and the engine's error.
func tripletData(e *eventView) json.RawMessage {
	cl := e.call
	if cl == nil { // a model_request posted by a client: AGL reads its response
		return tripletFromResponse(e.Data)
	}
	prompt, response := promptIDs(cl), cl.ResponseTokenIDs
	errored := cl.HTTPStatus >= 400 || cl.HTTPStatus == 0
	if response == nil || errored { // as promptIDs
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
// time (unix ns) of the first: stored events and captured calls, each
// counted in its store (one aggregate query: the trainer polls GET /api/rollouts/{id}
// for every pending rollout, and a call's bodies are not needed here).
func (s *Server) attemptsOf(c context.Context, st *tasks.State) (map[string]int64, error) {
	first := map[string]int64{}
	note := func(attempt string, ns int64) {
		if t, ok := first[attempt]; !ok || ns < t {
			first[attempt] = ns
		}
	}
	stored, err := s.d.Queue.EventAttempts(c, st.RolloutID)
	if err != nil {
		return nil, err
	}
	for attempt, ns := range stored {
		note(attempt, ns)
	}
	ends, err := s.d.Store.AttemptFirstEnds(c, export.CallHeadQuery{RolloutID: st.RolloutID, Since: uint64(max(st.CreatedNano, 0))})
	if err != nil {
		return nil, fmt.Errorf("reading the calls of %s: %w", st.RolloutID, err)
	}
	for attempt, ns := range ends {
		note(attempt, int64(ns))
	}
	return first, nil
}

// retryCount is AGL's retry_count: the backend attempts after the first
// (0 on rows of releases that did not count them).
func retryCount(attempts uint16) int { return max(int(attempts)-1, 0) }
