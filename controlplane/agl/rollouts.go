package agl

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/controlplane/tasks"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/internal/jsonscan"
)

// The mapping of an AGL rollout onto the task queue's row (rg_tasks), the
// one place it is made (documented in docs/contract.md):
//
//	rollout_id              rollout_id
//	input                   input
//	is_train                mode "train" / "val"
//	input.data_id or        task_id (the group of rollouts of one sample)
//	  input.instance_id
//	status.state            status: queuing = queued, running, succeeded,
//	                        failed (a rollgate "cancelled" reads as failed)
//	status.last_attempt_id  attempt_id ('' = null)
//	status.error_message    last_error ('' = null)
//	status.created_at,      created_ns, updated_ns (unix seconds = ns / 1e9)
//	  updated_at
//	terminal cursor         completion_seq - 1 (a position in the log of
//	                        completions; deleted rollouts keep theirs)
//	metadata                metadata, minus the key "_agl", which holds
//	                        config, k8s_job_name and version

// metaKey is the metadata key holding AGL's fields that the queue has no
// column for.
const metaKey = "_agl"

// extra is what metadata[metaKey] holds.
type extra struct {
	Config     json.RawMessage `json:"config,omitempty"`
	K8sJobName *string         `json:"k8s_job_name"`
	Version    int             `json:"version"`
}

// rolloutConfig is AGL's RolloutConfig, defaults applied on decode.
type rolloutConfig struct {
	TimeoutSeconds int        `json:"timeout_seconds"`
	Local          *localConf `json:"local"`
	K8s            *k8sConf   `json:"k8s"`
}

type localConf struct {
	AgentClass *string           `json:"agent_class"`
	EnvMap     map[string]string `json:"env_map"`
}

type k8sConf struct {
	JobTemplate *string `json:"job_template"`
}

// rolloutView is AGL's Rollout.
type rolloutView struct {
	RolloutID string          `json:"rollout_id"`
	Input     json.RawMessage `json:"input"`
	IsTrain   bool            `json:"is_train"`
	Config    json.RawMessage `json:"config"`
	Metadata  json.RawMessage `json:"metadata"`
	Status    statusView      `json:"status"`
}

// statusView is AGL's RolloutLifecycleStatus.
type statusView struct {
	State         string  `json:"state"`
	K8sJobName    *string `json:"k8s_job_name"`
	LastAttemptID *string `json:"last_attempt_id"`
	ErrorMessage  *string `json:"error_message"`
	Version       int     `json:"version"`
	CreatedAt     float64 `json:"created_at"`
	UpdatedAt     float64 `json:"updated_at"`
}

// AGL's rollout states.
const (
	stateQueuing   = "queuing"
	stateRunning   = "running"
	stateSucceeded = "succeeded"
	stateFailed    = "failed"
)

// aglState maps a queue status to AGL's state.
func aglState(status string) string {
	switch status {
	case tasks.StatusQueued:
		return stateQueuing
	case tasks.StatusRunning:
		return stateRunning
	case tasks.StatusSucceeded:
		return stateSucceeded
	}
	return stateFailed
}

// queueStatus maps AGL's state to the queue status.
func queueStatus(state string) string {
	if state == stateQueuing {
		return tasks.StatusQueued
	}
	return state
}

// allowed is AGL's state machine (schemas.py VALID_TRANSITIONS).
func allowed(from, to string) bool {
	switch from {
	case stateQueuing:
		return to == stateRunning || to == stateFailed
	case stateRunning:
		return to == stateSucceeded || to == stateFailed
	}
	return false
}

func validState(s string) bool {
	return s == stateQueuing || s == stateRunning || s == stateSucceeded || s == stateFailed
}

func nsToSeconds(ns int64) float64 { return float64(ns) / 1e9 }

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// splitMetadata separates a stored metadata object into AGL's metadata
// (batch_idx and sample_idx_in_batch first, as pydantic writes them) and
// the extra fields.
func splitMetadata(stored []byte) (json.RawMessage, extra) {
	ex := extra{Version: 1}
	var b bytes.Buffer
	b.WriteString(`{"batch_idx":`)
	b.WriteString(rawOr(gjson.GetBytes(stored, "batch_idx").Raw, "null"))
	b.WriteString(`,"sample_idx_in_batch":`)
	b.WriteString(rawOr(gjson.GetBytes(stored, "sample_idx_in_batch").Raw, "null"))
	gjson.ParseBytes(stored).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case metaKey:
			_ = json.Unmarshal([]byte(v.Raw), &ex)
		case "batch_idx", "sample_idx_in_batch":
		default:
			b.WriteByte(',')
			b.WriteString(k.Raw)
			b.WriteByte(':')
			b.WriteString(v.Raw)
		}
		return true
	})
	b.WriteByte('}')
	return json.RawMessage(b.Bytes()), ex
}

func rawOr(raw, def string) string {
	if raw == "" {
		return def
	}
	return raw
}

// joinMetadata stores AGL's metadata object with ex under metaKey.
func joinMetadata(meta []byte, ex extra) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(meta, &m); err != nil || m == nil {
		m = map[string]json.RawMessage{}
	}
	b, err := json.Marshal(ex)
	if err != nil {
		return nil, err
	}
	m[metaKey] = b
	return json.Marshal(m)
}

// defaultConfig is RolloutConfig() serialised.
const defaultConfig = `{"timeout_seconds":3600,"local":null,"k8s":null}`

// view is the AGL Rollout of a queue row.
func view(st *tasks.State) rolloutView {
	meta, ex := splitMetadata(st.Metadata)
	cfg := ex.Config
	if len(cfg) == 0 {
		cfg = json.RawMessage(defaultConfig)
	}
	input := st.Input
	if len(input) == 0 {
		input = json.RawMessage("null")
	}
	return rolloutView{RolloutID: st.RolloutID, Input: input, IsTrain: st.Mode != "val", Config: cfg, Metadata: meta,
		Status: statusView{State: aglState(st.Status), K8sJobName: ex.K8sJobName, LastAttemptID: strPtr(st.AttemptID),
			ErrorMessage: strPtr(st.LastError), Version: ex.Version, CreatedAt: nsToSeconds(st.CreatedNano),
			UpdatedAt: nsToSeconds(st.UpdatedNano)}}
}

// dataID is AGL's data_id of a rollout input: the first truthy of
// input.data_id and input.instance_id, as text, else "".
func dataID(input []byte) string {
	if jsonscan.Validate(input) != nil || !gjson.ParseBytes(input).IsObject() {
		return ""
	}
	for _, k := range []string{"data_id", "instance_id"} {
		v := gjson.GetBytes(input, k)
		switch {
		case v.Type == gjson.String && v.Str != "":
			return v.Str
		case v.Type == gjson.Number && v.Float() != 0:
			return v.Raw
		case v.Type == gjson.True:
			return "True"
		case v.Type == gjson.JSON && v.Raw != "[]" && v.Raw != "{}":
			return v.Raw
		}
	}
	return ""
}

// members decodes a JSON object into its members by exact name, as
// pydantic matches them (encoding/json's struct fields would also take
// "Input" for "input"); of a name given twice the last counts, as in
// Python's json. ok is false when raw is not an object.
func members(raw json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if !isObject(raw) || json.Unmarshal(raw, &m) != nil {
		return nil, false
	}
	return m, true
}

// intValue reads raw as an integer: a JSON number without a fraction
// (2.0 is 2, as pydantic's lax int takes it).
func intValue(raw json.RawMessage) (int64, bool) {
	var n float64
	if json.Unmarshal(raw, &n) != nil || string(raw) == "null" || n != float64(int64(n)) {
		return 0, false
	}
	return int64(n), true
}

// isInt reports whether raw is an integer (intValue).
func isInt(raw json.RawMessage) bool {
	_, ok := intValue(raw)
	return ok
}

// given reports whether a member was sent with a value other than null.
func given(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// isObject reports whether raw, a valid JSON value, is an object.
func isObject(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '{' }

// decodeCreate checks one RolloutCreate item and returns its task, or the
// 422 items of what is wrong with it.
func decodeCreate(i int, raw json.RawMessage) (tasks.Task, []fieldError) {
	loc := func(f ...any) []any { return append([]any{"body", i}, f...) }
	// AGL's RolloutCreate: members it does not know are ignored
	// (pydantic's default); each one it knows is checked on its own, so
	// that a 422 lists every one that is wrong.
	in, ok := members(raw)
	if !ok {
		return tasks.Task{}, []fieldError{notObject(loc(), raw)}
	}
	var errs []fieldError
	t := tasks.Task{Mode: "train", MaxAttempts: 1, Input: in["input"]}
	if len(t.Input) == 0 {
		errs = append(errs, fieldError{Type: "missing", Loc: loc("input"), Msg: "Field required", Input: raw})
	}
	switch isTrain := in["is_train"]; string(isTrain) {
	case "", "true", "1": // pydantic's lax bool takes 1 and 0
	case "false", "0":
		t.Mode = "val"
	default:
		errs = append(errs, fieldError{Type: "bool_parsing", Loc: loc("is_train"), Msg: "Input should be a valid boolean", Input: isTrain})
	}
	ex := extra{Version: 1, Config: json.RawMessage(defaultConfig)}
	if raw := in["config"]; given(raw) {
		cfg := rolloutConfig{TimeoutSeconds: 3600}
		if err := json.Unmarshal(raw, &cfg); err != nil || !isObject(raw) {
			errs = append(errs, fieldError{Type: "model_type", Loc: loc("config"), Msg: "Input should be a valid RolloutConfig: " + errText(err), Input: raw})
		} else {
			if cfg.Local != nil && cfg.Local.EnvMap == nil {
				cfg.Local.EnvMap = map[string]string{}
			}
			ex.Config, _ = json.Marshal(cfg)
		}
	}
	meta := []byte("{}")
	if raw := in["metadata"]; given(raw) {
		errs = append(errs, checkMetadata(raw, loc)...)
		meta = raw
	}
	if raw := in["rollout_id"]; given(raw) {
		var id string
		switch {
		case json.Unmarshal(raw, &id) != nil:
			errs = append(errs, fieldError{Type: "string_type", Loc: loc("rollout_id"), Msg: "Input should be a valid string", Input: raw})
		case !gateway.ValidID([]byte(id)):
			// Stricter than AGL (any string): the id travels in URL paths,
			// response headers and stored rows.
			errs = append(errs, fieldError{Type: "string_pattern_mismatch", Loc: loc("rollout_id"), Msg: "rollout_id must be " + gateway.IDCharset, Input: id})
		default:
			t.RolloutID = id
		}
	}
	if len(errs) > 0 {
		return t, errs
	}
	if t.RolloutID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		t.RolloutID = hex.EncodeToString(b[:]) // AGL: uuid4().hex
	}
	t.TaskID = dataID(t.Input)
	var err error
	if t.Metadata, err = joinMetadata(meta, ex); err != nil {
		return t, []fieldError{{Type: "value_error", Loc: loc("metadata"), Msg: err.Error()}}
	}
	return t, nil
}

// checkMetadata returns the 422 items of a RolloutMetadata that is not an
// object or whose batch_idx or sample_idx_in_batch is not an integer.
func checkMetadata(raw json.RawMessage, loc func(f ...any) []any) []fieldError {
	m, ok := members(raw)
	if !ok {
		return []fieldError{{Type: "dict_type", Loc: loc("metadata"), Msg: "Input should be a valid dictionary", Input: raw}}
	}
	var errs []fieldError
	for _, name := range []string{"batch_idx", "sample_idx_in_batch"} {
		if v := m[name]; given(v) && !isInt(v) {
			errs = append(errs, fieldError{Type: "int_parsing", Loc: loc("metadata", name), Msg: "Input should be a valid integer", Input: v})
		}
	}
	return errs
}

func errText(err error) string {
	if err == nil {
		return "not an object"
	}
	return err.Error()
}

// bodyRaw reads the request body as JSON of the kind wanted (a list when
// list, else an object), answering 422 as FastAPI does when it is not.
func bodyRaw(ctx *fasthttp.RequestCtx, list bool) (json.RawMessage, bool) {
	body := bytes.TrimSpace(ctx.PostBody())
	if len(body) == 0 {
		invalid(ctx, fieldError{Type: "missing", Loc: []any{"body"}, Msg: "Field required"})
		return nil, false
	}
	// Validated without recursion before encoding/json reads it: a body
	// nested deeper than jsonscan.MaxDepth is refused, naming the limit.
	if err := jsonscan.Validate(body); errors.Is(err, jsonscan.ErrTooDeep) {
		invalid(ctx, fieldError{Type: "json_invalid", Loc: []any{"body", 0}, Msg: "JSON decode error: " + err.Error(), Input: map[string]any{}})
		return nil, false
	} else if err != nil || !utf8.Valid(body) {
		invalid(ctx, fieldError{Type: "json_invalid", Loc: []any{"body", 0}, Msg: "JSON decode error (the body must be JSON in UTF-8)", Input: map[string]any{}})
		return nil, false
	}
	switch {
	case list && body[0] != '[':
		invalid(ctx, fieldError{Type: "list_type", Loc: []any{"body"}, Msg: "Input should be a valid list", Input: json.RawMessage(body)})
		return nil, false
	case !list && body[0] != '{':
		invalid(ctx, notObject([]any{"body"}, body))
		return nil, false
	}
	return body, true
}

// notObject is the 422 item of a value that should be an object.
func notObject(loc []any, v json.RawMessage) fieldError {
	return fieldError{Type: "model_attributes_type", Loc: loc, Msg: "Input should be a valid dictionary or object to extract fields from", Input: v}
}

// createRollouts serves POST /api/rollouts: a list of RolloutCreate, each
// created unless its rollout_id exists (then returned unchanged).
func (s *Server) createRollouts(ctx *fasthttp.RequestCtx) {
	body, ok := bodyRaw(ctx, true)
	if !ok {
		return
	}
	var items []json.RawMessage
	if err := json.Unmarshal(body, &items); err != nil {
		invalid(ctx, fieldError{Type: "list_type", Loc: []any{"body"}, Msg: "Input should be a valid list: " + err.Error(), Input: body})
		return
	}
	var list []tasks.Task
	var errs []fieldError
	for i, item := range items {
		t, e := decodeCreate(i, item)
		errs = append(errs, e...)
		list = append(list, t)
	}
	if len(errs) > 0 {
		invalid(ctx, errs...)
		return
	}
	c, cancel := storeCtx()
	defer cancel()
	out := make([]rolloutView, 0, len(list))
	for _, t := range list {
		st, _, err := s.d.Queue.CreateIfAbsent(c, t)
		if err != nil {
			s.storeError(ctx, "creating rollout "+t.RolloutID, err)
			return
		}
		out = append(out, view(st))
	}
	writeJSON(ctx, fasthttp.StatusCreated, out)
}

// intQuery reads an integer query parameter (def when absent); false after
// answering 422.
func intQuery(ctx *fasthttp.RequestCtx, name string, def int64) (int64, bool) {
	v := ctx.QueryArgs().Peek(name)
	if v == nil {
		return def, true
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		invalid(ctx, fieldError{Type: "int_parsing", Loc: []any{"query", name}, Msg: "Input should be a valid integer, unable to parse string as an integer", Input: string(v)})
		return 0, false
	}
	return n, true
}

// listRollouts serves GET /api/rollouts?state_in=S&state_in=S2&limit=N.
func (s *Server) listRollouts(ctx *fasthttp.RequestCtx) {
	raw := ctx.QueryArgs().PeekMulti("state_in")
	if len(raw) == 0 {
		invalid(ctx, fieldError{Type: "missing", Loc: []any{"query", "state_in"}, Msg: "Field required"})
		return
	}
	var statuses []string
	for i, v := range raw {
		if !validState(string(v)) {
			invalid(ctx, fieldError{Type: "enum", Loc: []any{"query", "state_in", i}, Msg: "Input should be 'queuing', 'running', 'succeeded' or 'failed'", Input: string(v)})
			return
		}
		statuses = append(statuses, queueStatus(string(v)))
		if string(v) == stateFailed {
			statuses = append(statuses, tasks.StatusCancelled)
		}
	}
	limit, ok := intQuery(ctx, "limit", 500)
	if !ok {
		return
	}
	out := []rolloutView{}
	if limit > 0 {
		c, cancel := storeCtx()
		defer cancel()
		list, err := s.d.Queue.ListStatuses(c, statuses, int(min(limit, maxTerminalPage)))
		if err != nil {
			s.storeError(ctx, "listing rollouts", err)
			return
		}
		for i := range list {
			out = append(out, view(&list[i]))
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, out)
}

// maxTerminalPage bounds the items of one GET /api/rollouts/terminal page
// (a larger limit is clamped to it, as GET /api/rollouts clamps its own).
const maxTerminalPage = 10000

// terminal serves GET /api/rollouts/terminal?after=0&limit=1000: the log
// of rollouts that entered a final state, by position.
func (s *Server) terminal(ctx *fasthttp.RequestCtx) {
	after, ok := intQuery(ctx, "after", 0)
	if !ok {
		return
	}
	limit, ok := intQuery(ctx, "limit", 1000)
	if !ok {
		return
	}
	// AGL's own bounds (<0 -> 0, <1 -> 1), and at most maxTerminalPage
	// items a page: next_after pages on.
	after, limit = max(after, 0), min(max(limit, 1), maxTerminalPage)
	c, cancel := storeCtx()
	defer cancel()
	total, err := s.d.Queue.Completed(c)
	if err != nil {
		s.storeError(ctx, "reading the terminal log", err)
		return
	}
	upTo := min(after+limit, total)
	type item struct {
		RolloutID string `json:"rollout_id"`
		State     string `json:"state"`
		DataID    string `json:"data_id"`
		IsTrain   bool   `json:"is_train"`
	}
	items := []item{}
	if upTo > after {
		list, err := s.d.Queue.CompletedRange(c, after, upTo)
		if err != nil {
			s.storeError(ctx, "reading the terminal log", err)
			return
		}
		for _, st := range list {
			items = append(items, item{RolloutID: st.RolloutID, State: aglState(st.Status), DataID: dataID(st.Input), IsTrain: st.Mode != "val"})
		}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"items": items, "next_after": after + max(upTo-after, 0), "total_terminal": total})
}

// rollout reads one rollout, answering 404 (false) when it does not exist.
func (s *Server) rollout(ctx *fasthttp.RequestCtx, c context.Context, id string) (*tasks.State, bool) {
	st, err := s.d.Queue.Get(c, id)
	if errors.Is(err, tasks.ErrNotFound) {
		detail(ctx, fasthttp.StatusNotFound, "Rollout not found: "+id)
		return nil, false
	}
	if err != nil {
		s.storeError(ctx, "reading rollout "+id, err)
		return nil, false
	}
	return st, true
}

// getRollout serves GET /api/rollouts/{id}: the rollout and the attempts
// that have events, ordered by their first event.
func (s *Server) getRollout(ctx *fasthttp.RequestCtx, id string) {
	c, cancel := storeCtx()
	defer cancel()
	st, ok := s.rollout(ctx, c, id)
	if !ok {
		return
	}
	first, err := s.attemptsOf(c, st)
	if err != nil {
		s.storeError(ctx, "reading the events of "+id, err)
		return
	}
	attempts := make([]string, 0, len(first))
	for a := range first {
		attempts = append(attempts, a)
	}
	sort.Slice(attempts, func(i, j int) bool {
		if first[attempts[i]] != first[attempts[j]] {
			return first[attempts[i]] < first[attempts[j]]
		}
		return attempts[i] < attempts[j]
	})
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"rollout": view(st), "attempts": attempts})
}

// errConflict is a transition the state machine forbids (409).
type errConflict struct{ msg string }

func (e *errConflict) Error() string { return e.msg }

// statusPatch is AGL's RolloutStatusPatch: every member optional and
// nullable, no other member allowed (decodeStatusPatch).
type statusPatch struct {
	State, K8sJobName, LastAttemptID, ErrorMessage patchString
}

func (p *statusPatch) empty() bool {
	return !p.State.set && !p.K8sJobName.set && !p.LastAttemptID.set && !p.ErrorMessage.set
}

// patchString is a member of a status patch: absent, null, a string, or
// (bad) another JSON value, kept to name it in a 422.
type patchString struct {
	set, null bool
	s         string
	raw       json.RawMessage // a value that is not a string or null
}

// readPatchString reads the member raw (nil: absent).
func readPatchString(raw json.RawMessage) patchString {
	v := patchString{set: raw != nil}
	switch {
	case raw == nil:
	case string(raw) == "null":
		v.null = true
	case json.Unmarshal(raw, &v.s) != nil:
		v.raw = raw
	}
	return v
}

// value is what a 422 echoes of the member.
func (v patchString) value() any {
	if v.raw != nil {
		return v.raw
	}
	return v.s
}

// decodeStatusPatch decodes a RolloutStatusPatch strictly: each member it
// does not know is a 422 naming it (pydantic's extra="forbid"), as is a
// state that is not one of AGL's, a value that is not a string, or an
// attempt id outside the charset.
func decodeStatusPatch(raw json.RawMessage) (statusPatch, []fieldError) {
	loc := func(f string) []any { return []any{"body", "status", f} }
	m, ok := members(raw)
	if !ok {
		return statusPatch{}, []fieldError{notObject([]any{"body", "status"}, raw)}
	}
	p := statusPatch{State: readPatchString(m["state"]), K8sJobName: readPatchString(m["k8s_job_name"]),
		LastAttemptID: readPatchString(m["last_attempt_id"]), ErrorMessage: readPatchString(m["error_message"])}
	var errs []fieldError
	for _, name := range slices.Sorted(maps.Keys(m)) {
		switch name {
		case "state", "k8s_job_name", "last_attempt_id", "error_message":
		default:
			errs = append(errs, fieldError{Type: "extra_forbidden", Loc: loc(name), Msg: "Extra inputs are not permitted", Input: m[name]})
		}
	}
	if v := p.State; v.set && !v.null && (v.raw != nil || !validState(v.s)) {
		errs = append(errs, fieldError{Type: "enum", Loc: loc("state"), Msg: "Input should be 'queuing', 'running', 'succeeded' or 'failed'", Input: v.value()})
	}
	for _, f := range []struct {
		name string
		v    patchString
	}{{"k8s_job_name", p.K8sJobName}, {"last_attempt_id", p.LastAttemptID}, {"error_message", p.ErrorMessage}} {
		switch {
		case f.v.raw != nil:
			errs = append(errs, fieldError{Type: "string_type", Loc: loc(f.name), Msg: "Input should be a valid string", Input: f.v.raw})
		case f.name == "last_attempt_id" && f.v.set && !f.v.null && !gateway.ValidID([]byte(f.v.s)):
			// Stricter than AGL (any string): the attempt id is a path
			// segment of the agents' URLs and of every stored row.
			errs = append(errs, fieldError{Type: "string_pattern_mismatch", Loc: loc(f.name), Msg: "last_attempt_id must be " + gateway.IDCharset, Input: f.v.s})
		}
	}
	return p, errs
}

// patchRollout serves PATCH /api/rollouts/{id} with {"status": {...}}.
func (s *Server) patchRollout(ctx *fasthttp.RequestCtx, id string) {
	body, ok := bodyRaw(ctx, false)
	if !ok {
		return
	}
	// AGL's RolloutPatch: members other than status are ignored.
	in, ok := members(body)
	if !ok {
		invalid(ctx, notObject([]any{"body"}, body))
		return
	}
	var p statusPatch
	if raw := in["status"]; given(raw) {
		var errs []fieldError
		if p, errs = decodeStatusPatch(raw); len(errs) > 0 {
			invalid(ctx, errs...)
			return
		}
	}
	c, cancel := storeCtx()
	defer cancel()
	st, ch, err := s.d.Queue.Update(c, id, func(st *tasks.State) (*tasks.Edit, error) {
		if p.empty() {
			return nil, nil
		}
		var e tasks.Edit
		if v := p.State; v.set {
			from := aglState(st.Status)
			to := v.s
			if v.null {
				to = "None"
			}
			if !allowed(from, to) {
				return nil, &errConflict{fmt.Sprintf("Rollout %s: cannot transition %s -> %s", id, from, to)}
			}
			q := queueStatus(to)
			e.Status = &q
		}
		if v := p.LastAttemptID; v.set {
			e.AttemptID = &v.s
		}
		if v := p.ErrorMessage; v.set {
			e.LastError = &v.s
		}
		meta, ex := splitMetadata(st.Metadata)
		if v := p.K8sJobName; v.set {
			ex.K8sJobName = nil
			if !v.null {
				ex.K8sJobName = &v.s
			}
		}
		if len(ex.Config) == 0 {
			ex.Config = json.RawMessage(defaultConfig)
		}
		ex.Version++
		m, err := joinMetadata(meta, ex)
		if err != nil {
			return nil, err
		}
		e.Metadata = m
		return &e, nil
	})
	var conflict *errConflict
	switch {
	case errors.Is(err, tasks.ErrNotFound):
		detail(ctx, fasthttp.StatusNotFound, "Rollout not found: "+id)
		return
	case errors.As(err, &conflict):
		detail(ctx, fasthttp.StatusConflict, conflict.msg)
		return
	case err != nil:
		s.storeError(ctx, "updating rollout "+id, err)
		return
	}
	if ch != nil && s.d.Mirror != nil {
		s.d.Mirror(c, []tasks.Change{*ch})
	}
	writeJSON(ctx, fasthttp.StatusOK, view(st))
}

// deleteRollout serves DELETE /api/rollouts/{id}: 204, also for a missing id.
func (s *Server) deleteRollout(ctx *fasthttp.RequestCtx, id string) {
	c, cancel := storeCtx()
	defer cancel()
	if _, err := s.d.Queue.Delete(c, id); err != nil {
		s.storeError(ctx, "deleting rollout "+id, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
