package capture

import (
	"bytes"
	"errors"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// Limits that bound the memory an Assembler spends on one response beyond the
// size of the response itself.
const (
	// MaxChoices is the number of distinct choice indexes kept per response;
	// further choices are dropped and Error says so.
	MaxChoices = 1024
	// MaxToolCalls is the number of distinct tool calls kept per choice;
	// further tool calls are dropped and Error says so.
	MaxToolCalls = 128
	// maxErrorLen caps the length of Assembled.Error.
	maxErrorLen = 1024
	// maxRetain is the capacity above which a buffer is not kept by Reset.
	maxRetain = 1 << 20
)

// Assembled is what one call's response yields. Its slices point into the
// Assembler's buffers: they are valid until the next Reset, SetBody, AddChunk
// or Result call on the Assembler; copy what must outlive that. They must not
// be modified: the body and messages assembled from a chat or completions
// stream are views of strings (which Rows puts in the rows as they are).
type Assembled struct {
	// ResponseBody is the response JSON: the body itself for a non-streamed
	// response; for a stream, the equivalent non-streaming JSON assembled from
	// the chunks (vLLM's non-stream shape), or the "response" object of the
	// response.completed event for the Responses API. It is always valid JSON
	// when it is built from a stream.
	ResponseBody []byte
	// PromptTokenIDs are top-level prompt ids (vLLM chat); see also
	// ChoiceResult.PromptTokenIDs.
	PromptTokenIDs []uint32
	// Choices are sorted by Index. Empty for embeddings and errors.
	Choices []ChoiceResult
	// Usage is the usage object as returned (Responses API: input_tokens and
	// output_tokens). Values above 2^32-1 are clamped.
	Usage struct {
		PromptTokens, CompletionTokens uint32
		Present                        bool
		// FromTimings is true when a stream had no usage and the counts
		// come from llama.cpp's "timings" (prompt_tokens = cache_n +
		// prompt_n, completion_tokens = predicted_n; docs/engines.md).
		FromTimings bool
	}
	// Error is "" or what went wrong: a backend error object (in the body or
	// mid-stream), invalid JSON, a limit reached.
	Error string
	// Model and ID are the response's "model" and "id".
	Model, ID string

	// body is ResponseBody as a string when it was assembled from a chat or
	// completions stream ("" otherwise): its own memory, never written
	// again, so Rows keeps it without a copy.
	body string
	// tooDeep: the non-streamed body nests deeper than jsonscan.MaxDepth
	// (Error says so); Rows stores no response_body for it, so that no
	// reader of the stored row meets it.
	tooDeep bool
}

// ChoiceResult is one choice of a response.
type ChoiceResult struct {
	// Index is the choice's "index" (completions with a list of prompts:
	// output_index + prompt_index*n).
	Index uint32
	// Message is JSON: the assistant message for chat
	// ({"role","content","tool_calls"}, and the reasoning field when the
	// engine sent one), {"text":...} for completions, the "output" array for
	// the Responses API.
	Message []byte
	// PromptTokenIDs are per-choice prompt ids (completions, SGLang).
	PromptTokenIDs []uint32
	// TokenIDs are the generated ids; HasTokenIDs tells an empty list from
	// an absent (or null) one.
	TokenIDs    []uint32
	HasTokenIDs bool
	// Logprobs are the logprob of each generated token: chat
	// logprobs.content[].logprob, completions logprobs.token_logprobs[]
	// (a null entry there becomes NaN, to keep positions). Empty when absent.
	Logprobs []float32
	// FinishReason is as returned; for the Responses API, the
	// incomplete_details.reason or else the status ("completed", ...).
	FinishReason string

	// msg is Message as a string when it was assembled from a stream
	// (chat: a substring of Assembled.body), "" otherwise; see
	// Assembled.body.
	msg string
}

// Assembler turns one call's response — a non-streaming JSON body, or the data
// payloads of its SSE events — into per-choice results. It reads JSON with
// gjson and never unmarshals whole bodies.
//
// Use: Reset(endpoint); then SetBody(body) or AddChunk(data) per event; then
// Result(). Any input, however malformed, yields a result (with Error set)
// and never a panic. Memory is bounded by the size of the input plus
// MaxChoices choices of at most MaxToolCalls tool calls each.
//
// An Assembler is reusable (pool it): after Reset its buffers are kept, so a
// warm Assembler allocates little. It is not safe for concurrent use.
type Assembler struct {
	endpoint openai.Endpoint // as given to Reset
	kind     openai.Endpoint // endpoint, or guessed from "object"
	stream   bool
	built    bool

	body     []byte // non-stream: copy of the body
	bodyStr  string // chat or completions stream: the assembled body (buildBody)
	respBody []byte // Responses stream: the final response object
	id       []byte // raw JSON token
	model    []byte // raw JSON token
	created  []byte // raw JSON token
	usage    []byte // raw JSON object
	timings  []byte // raw JSON object: llama.cpp's last "timings" of a stream
	prompt   []uint32
	hasPmt   bool
	errMsg   []byte
	dropped  int // choices dropped over MaxChoices
	droppedT int // tool calls dropped over MaxToolCalls

	choices []choiceState // used prefix: [:n]
	n       int
	byIndex map[uint32]int32
	last    int32 // index into choices of the last choice looked up

	// head is the previous chunk's bytes before its "choices" key ('{' and
	// the members id, object, created, model with their commas) when they
	// were only those members, held no escape and did not mark an error: the
	// head every chunk of a vLLM or SGLang stream repeats. A chunk starting
	// with the same bytes is read as '{' and its rest (in tail): those
	// members were read already and reading them again changes nothing. This
	// halves the bytes validated and walked per token.
	head   []byte
	tail   []byte
	noHead bool // never take the shortcut (tests compare against it)

	// ends indexes the ends of the current chunk's objects and arrays while
	// addChunk walks it (empty otherwise), so that nested walks do not
	// rescan values; noIndex turns it off, and the fast path with it (tests
	// compare against that).
	ends    containerEnds
	noIndex bool

	// fast stages a regular chat or completions chunk read in one pass
	// (fastChunk) instead of the general path; noFast turns it off (tests
	// compare against that); nFast counts the chunks it took since Reset.
	fast   fastState
	noFast bool
	nFast  int

	// noLogprobIDs: a chat logprobs entry of a choice this Assembler keeps
	// (so a row of the call) certainly carries no token id — no "id" member
	// and no "token_id:NNN" token (tokenize/fallback.LogprobIDs' rules). The
	// fallback's output side then fails for the call whatever else the
	// stream holds, so Pending stops keeping payloads for it.
	noLogprobIDs bool

	// tooDeep: the non-streamed body nests deeper than jsonscan.MaxDepth;
	// it was not read, and the row leaves it out (Assembled.tooDeep).
	tooDeep bool

	res Assembled
}

// Reset prepares the Assembler for a new response to endpoint, keeping its
// buffers (except very large ones).
func (a *Assembler) Reset(endpoint openai.Endpoint) {
	a.endpoint, a.kind = endpoint, endpoint
	a.stream, a.built = false, false
	a.body = trimBuf(a.body)
	a.bodyStr = ""
	a.respBody = trimBuf(a.respBody)
	a.id = a.id[:0]
	a.model = a.model[:0]
	a.created = a.created[:0]
	a.usage = a.usage[:0]
	a.timings = a.timings[:0]
	a.prompt = trimU32(a.prompt)
	a.hasPmt = false
	a.head = a.head[:0]
	a.fast.trim()
	a.nFast = 0
	a.noLogprobIDs = false
	a.tooDeep = false
	a.errMsg = a.errMsg[:0]
	a.dropped, a.droppedT = 0, 0
	a.n = 0
	a.last = -1
	clear(a.byIndex)
	keepModel := a.res.Model
	a.res = Assembled{Choices: a.res.Choices[:0], Model: keepModel}
}

// release lets go of what the last call's rows may still reference: the
// assembled body and the messages and views into it. Strings are never
// reused, so keeping them in a pooled Assembler until its next call's first
// chunk only pins a finished call's answer (a few KiB per pooled Pending,
// 4 MB of live heap under 1,024 open streams); the buffers are kept.
func (a *Assembler) release() {
	a.bodyStr = ""
	for i := range a.choices {
		a.choices[i].view, a.choices[i].msgStr = nil, ""
	}
	clear(a.res.Choices[:cap(a.res.Choices)])
	a.res.Choices = a.res.Choices[:0]
	a.res.ResponseBody, a.res.PromptTokenIDs, a.res.body = nil, nil, ""
}

// footprint is roughly the bytes the Assembler's buffers hold (their
// capacities), for a pool deciding whether to keep it.
func (a *Assembler) footprint() int {
	n := cap(a.body) + cap(a.respBody) + 4*cap(a.prompt) + 4*a.ends.Cap() + a.fast.footprint()
	for i := range a.choices {
		c := &a.choices[i]
		n += cap(c.content) + cap(c.reasoning) + 4*cap(c.tokenIDs) + 4*cap(c.promptIDs) + 4*cap(c.logprobs) +
			cap(c.lpChat) + cap(c.lpTokens) + cap(c.lpTokLP) + cap(c.lpOffset) + cap(c.lpTop) + cap(c.message)
		for j := range c.tools {
			t := &c.tools[j]
			n += cap(t.id) + cap(t.typ) + cap(t.name) + cap(t.args)
		}
	}
	return n
}

// SetBody records a non-streaming response body (copied).
func (a *Assembler) SetBody(body []byte) {
	a.built = false
	a.body = append(a.body[:0], body...)
	// One scan validates the body and finds every container's end for
	// parseBody's walks: without the index each level of nesting (choices,
	// a choice, its logprobs, their content, each entry) rescans its values,
	// and logprobs, which the gateway asks for by default, are most of a body.
	indexed, err := a.indexChunk(a.body)
	if indexed {
		defer a.ends.Clear()
	}
	if err != nil {
		if errors.Is(err, jsonscan.ErrTooDeep) {
			// Nothing reads it further, and the row does not keep it
			// (Assembled.tooDeep): any recursive reader would overflow.
			a.tooDeep = true
			a.setErr("response body not captured: " + err.Error())
			return
		}
		a.setErr("invalid JSON in response body")
		return
	}
	a.parseBody(a.body)
}

// AddChunk records the data payload of one streamed SSE event. "[DONE]" and
// empty payloads are skipped; an {"error":...} payload records the error.
func (a *Assembler) AddChunk(data []byte) { a.addChunk(data) }

// addChunk is AddChunk. It also reports whether the payload may carry
// logprobs entries for the token-id fallback (tokenize/fallback.LogprobIDs,
// which reads choices[].logprobs with gjson): it returns false only when that
// reader would certainly find nothing in the payload, so that Pending keeps
// just the payloads the fallback can use. gjson unescapes keys, so a payload
// with a \u escape anywhere may spell "choices" or "logprobs" and is kept.
func (a *Assembler) addChunk(raw []byte) (mayLogprobs bool) {
	a.built = false
	a.stream = true
	data := bytes.TrimSpace(raw)
	if len(data) == 0 || string(data) == "[DONE]" {
		return false
	}
	sameHead := a.repeatsHead(data)
	// A regular chunk is read in one pass, without copying (fastChunk).
	if !a.noFast && !a.noIndex && (a.kind == openai.ChatCompletions || a.kind == openai.Completions) {
		if took, may := a.fastChunk(data, sameHead); took {
			a.nFast++
			return may
		}
	}
	if sameHead {
		a.tail = append(append(a.tail[:0], '{'), data[len(a.head):]...)
		data = a.tail
	}
	// One scan validates the chunk and finds every container's end for the
	// walks below (containerEnds).
	indexed, err := a.indexChunk(data)
	if indexed {
		defer a.ends.Clear()
	}
	if err != nil {
		// The raw payload is not valid JSON either (or nested too deep
		// for any recursive reader): LogprobIDs never sees it.
		if errors.Is(err, jsonscan.ErrTooDeep) {
			a.setErr("stream event not captured: " + err.Error())
		} else {
			a.setErr("invalid JSON in stream event")
		}
		return false
	}
	return a.readChunk(data, sameHead)
}

// repeatsHead reports whether the chunk repeats the previous chunk's head,
// to be read without it (see Assembler.head): '{' and what follows the
// head. The rest must open a member: the head ends with a comma, so "{" and
// a rest of "}" would be valid where the chunk is not.
func (a *Assembler) repeatsHead(data []byte) bool {
	if len(a.head) == 0 || a.noHead || len(data) <= len(a.head) || !bytes.Equal(data[:len(a.head)], a.head) ||
		(a.kind != openai.ChatCompletions && a.kind != openai.Completions) {
		return false
	}
	i := jsonscan.SkipWS(data, len(a.head))
	return i < len(data) && data[i] == '"'
}

// maxIndexedBody is the longest text indexChunk indexes: the index takes 4
// bytes per byte of text, and Clear keeps a buffer of up to 1 MiB of text
// (longer texts are walked without an index, rescanning nested values).
const maxIndexedBody = 1 << 20

// indexChunk validates a stream chunk or a whole body and, unless noIndex
// or it is longer than maxIndexedBody, indexes its containers' ends
// (indexed: the caller clears the index when done).
func (a *Assembler) indexChunk(data []byte) (indexed bool, err error) {
	if a.noIndex || len(data) > maxIndexedBody {
		return false, jsonscan.Validate(data)
	}
	if err := a.ends.Validate(data); err != nil {
		return false, err
	}
	return true, nil
}

// chunkScan is what the walk over a chunk's top-level members found.
type chunkScan struct {
	choices  gjson.Result // the last "choices"
	nChoices int
	flatErr  bool // "object":"error" (older vLLM and SGLang)
	// headKeys: only head members (id, object, created, model) came before
	// the first "choices"; headEnd is where that member starts.
	headKeys bool
	headEnd  int
}

// readChunk reads a valid, indexed chunk the fast path did not take: its
// top-level members, then its choices (streamChoice). It returns addChunk's
// mayLogprobs.
func (a *Assembler) readChunk(data []byte, sameHead bool) (mayLogprobs bool) {
	top := gjson.Parse(jsonscan.String(data))
	if !top.IsObject() {
		a.setErr("stream event is not a JSON object")
		return true
	}
	mayLogprobs = bytes.Contains(data, escapeU)
	if a.kind == openai.Responses {
		a.responsesEvent(top)
		return mayLogprobs || bytes.Contains(data, choicesKey)
	}
	cs := chunkScan{headKeys: !sameHead && !mayLogprobs}
	a.ends.eachMember(top.Raw, func(k string, v gjson.Result) bool {
		return a.chunkMember(top, k, v, &cs)
	})
	if cs.flatErr {
		// Older vLLM and SGLang: {"object":"error","message":...,"type":...}
		a.errorValue(top)
	}
	if a.kind == openai.Responses {
		return mayLogprobs || bytes.Contains(data, choicesKey)
	}
	// gjson reads the first "choices" and iterates an object's members too.
	if cs.nChoices > 1 || cs.choices.IsObject() {
		mayLogprobs = true
	}
	if !sameHead {
		a.head = a.head[:0]
		if cs.headKeys && cs.headEnd > 1 && !cs.flatErr && cs.choices.IsArray() &&
			(a.kind == openai.ChatCompletions || a.kind == openai.Completions) {
			a.head = append(a.head, top.Raw[:cs.headEnd]...)
		}
	}
	if cs.choices.IsArray() {
		a.ends.eachElem(cs.choices.Raw, func(ch gjson.Result) bool {
			if ch.IsObject() && a.streamChoice(ch) {
				mayLogprobs = true
			}
			return true
		})
	}
	return mayLogprobs
}

// chunkMember reads one top-level member k of chunk top into the Assembler
// (or cs); false stops the walk (the chunk turned out to be a Responses
// API event).
func (a *Assembler) chunkMember(top gjson.Result, k string, v gjson.Result, cs *chunkScan) bool {
	if cs.headKeys && cs.nChoices == 0 {
		switch k {
		case "id", "object", "created", "model":
		case "choices":
			// k is top.Raw's own bytes: its opening quote ends the head.
			cs.headEnd = jsonscan.Offset(top.Raw, k) - 1
		default:
			cs.headKeys = false
		}
	}
	switch k {
	case "id":
		if len(a.id) == 0 && v.Type == gjson.String {
			a.id = append(a.id, v.Raw...)
		}
	case "object":
		a.guessKind(v)
		cs.flatErr = decodeStr(v) == "error"
	case "created":
		if len(a.created) == 0 && v.Type == gjson.Number {
			a.created = append(a.created, v.Raw...)
		}
	case "model":
		if len(a.model) == 0 && v.Type == gjson.String {
			a.model = append(a.model, v.Raw...)
		}
	case "choices":
		cs.choices = v
		cs.nChoices++
	case "usage":
		if v.IsObject() {
			a.usage = append(a.usage[:0], v.Raw...)
		}
	case "timings":
		if v.IsObject() {
			a.timings = append(a.timings[:0], v.Raw...)
		}
	case "prompt_token_ids":
		if !a.hasPmt && v.IsArray() {
			a.prompt, a.hasPmt = appendIDs(a.prompt, v), true
		}
	case "error":
		a.errorValue(v)
	case "type":
		return a.typeMember(top, v)
	}
	return true
}

// typeMember reads a "type" member: a Responses API event while the
// endpoint was unknown (false: the chunk was read as one).
func (a *Assembler) typeMember(top, v gjson.Result) bool {
	if a.kind != openai.Unknown {
		return true
	}
	if t := decodeStr(v); strings.HasPrefix(t, "response.") {
		a.kind = openai.Responses
		a.responsesEvent(top)
		return false
	} else if t == "error" {
		a.responsesEvent(top)
	}
	return true
}

// Byte patterns addChunk looks for.
var (
	escapeU    = []byte(`\u`)
	choicesKey = []byte(`"choices"`)
)

// Result returns the assembled response. The returned value is owned by the
// Assembler (see Assembled for how long it stays valid).
func (a *Assembler) Result() *Assembled {
	if a.built {
		return &a.res
	}
	a.built = true
	r := &a.res
	r.Choices = r.Choices[:0]
	r.PromptTokenIDs = nil
	if a.hasPmt {
		r.PromptTokenIDs = a.prompt
	}
	if a.stream && a.kind == openai.Responses {
		if len(a.respBody) == 0 {
			a.setErr("stream ended before response.completed")
		} else {
			a.parseBody(a.respBody) // fills choices and usage
		}
	}
	a.sortChoices()
	r.body = ""
	r.tooDeep = a.tooDeep
	switch {
	case a.stream && a.kind == openai.Responses:
		r.ResponseBody = a.respBody
	case a.stream:
		a.buildBody()
		r.ResponseBody, r.body = jsonscan.Bytes(a.bodyStr), a.bodyStr
	default:
		r.ResponseBody = a.body
	}
	for i := range a.n {
		c := &a.choices[i]
		cr := ChoiceResult{
			Index:        c.index,
			Message:      c.view,
			HasTokenIDs:  c.hasTokenIDs,
			FinishReason: internFinish(c.finish),
		}
		if r.body != "" { // buildBody just built every message
			cr.msg = c.msgStr
		}
		if c.hasTokenIDs {
			cr.TokenIDs = c.tokenIDs
		}
		if c.hasPrompt {
			cr.PromptTokenIDs = c.promptIDs
		}
		if c.hasLP {
			cr.Logprobs = c.logprobs
		}
		r.Choices = append(r.Choices, cr)
	}
	r.Usage.PromptTokens, r.Usage.CompletionTokens, r.Usage.Present, r.Usage.FromTimings = 0, 0, false, false
	if len(a.usage) > 0 {
		u := gjson.Parse(jsonscan.String(a.usage))
		p, c := u.Get("prompt_tokens"), u.Get("completion_tokens")
		if !p.Exists() && !c.Exists() {
			p, c = u.Get("input_tokens"), u.Get("output_tokens")
		}
		r.Usage.PromptTokens, r.Usage.CompletionTokens = clampU32(p), clampU32(c)
		r.Usage.Present = true
	} else if a.stream && len(a.timings) > 0 {
		// llama.cpp without include_usage: its usage counts are n_decoded
		// (timings.predicted_n) and the prompt's tokens, cached
		// (timings.cache_n) plus processed (timings.prompt_n).
		t := gjson.Parse(jsonscan.String(a.timings))
		pn, cn, dn := t.Get("prompt_n"), t.Get("cache_n"), t.Get("predicted_n")
		if pn.Type == gjson.Number && cn.Type == gjson.Number && dn.Type == gjson.Number {
			r.Usage.PromptTokens = sat32(uint64(clampU32(pn)) + uint64(clampU32(cn)))
			r.Usage.CompletionTokens = clampU32(dn)
			r.Usage.Present, r.Usage.FromTimings = true, true
		}
	}
	r.Model = stringOf(r.Model, a.model)
	r.ID = stringOf(r.ID, a.id)
	if a.dropped > 0 {
		a.setErr("too many choices: " + strconv.Itoa(a.dropped) + " dropped over the limit of " + strconv.Itoa(MaxChoices))
	}
	if a.droppedT > 0 {
		a.setErr("too many tool calls: " + strconv.Itoa(a.droppedT) + " dropped over the limit of " + strconv.Itoa(MaxToolCalls) + " per choice")
	}
	r.Error = ""
	if len(a.errMsg) > 0 {
		r.Error = string(a.errMsg)
	}
	return r
}

// setErr records msg as the error unless one is already recorded.
func (a *Assembler) setErr(msg string) {
	if len(a.errMsg) > 0 || msg == "" {
		return
	}
	if len(msg) > maxErrorLen {
		msg = msg[:maxErrorLen]
	}
	a.errMsg = append(a.errMsg, msg...)
}

// errorValue records an "error" field: an object {message, type, code}, or a
// string. null is ignored.
func (a *Assembler) errorValue(v gjson.Result) {
	switch v.Type {
	case gjson.String:
		a.setErr(decodeStr(v))
	case gjson.JSON:
		if !v.IsObject() {
			a.setErr(truncate(v.Raw))
			return
		}
		msg, typ := v.Get("message"), v.Get("type")
		switch {
		case msg.Type == gjson.String && typ.Type == gjson.String && typ.Str != "":
			a.setErr(typ.Str + ": " + msg.Str)
		case msg.Type == gjson.String && msg.Str != "":
			a.setErr(msg.Str)
		default:
			a.setErr("backend error: " + truncate(v.Raw))
		}
	}
}

// guessKind sets the kind from an "object" value when Reset got no endpoint.
func (a *Assembler) guessKind(v gjson.Result) {
	if a.kind != openai.Unknown || v.Type != gjson.String {
		return
	}
	switch decodeStr(v) {
	case "chat.completion", "chat.completion.chunk":
		a.kind = openai.ChatCompletions
	case "text_completion":
		a.kind = openai.Completions
	case "response":
		a.kind = openai.Responses
	case "list":
		a.kind = openai.Embeddings
	}
}

// internFinish decodes a raw JSON string token, without allocating for the
// usual finish reasons.
func internFinish(raw []byte) string {
	if len(raw) < 2 {
		return ""
	}
	in := raw[1 : len(raw)-1]
	for _, s := range [...]string{"stop", "length", "tool_calls", "abort",
		"content_filter", "function_call", "completed", "incomplete",
		"failed", "max_output_tokens"} {
		if string(in) == s {
			return s
		}
	}
	return stringOf("", raw)
}

// stringOf decodes a raw JSON string token into a string that owns its
// memory; it returns prev itself when equal (no allocation).
func stringOf(prev string, raw []byte) string {
	if len(raw) < 2 {
		return ""
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 {
		if string(in) == prev {
			return prev
		}
		return string(in)
	}
	s := gjson.Parse(jsonscan.String(raw)).Str // unescaped: a new string
	if s == prev {
		return prev
	}
	return strings.Clone(s)
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 512
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

// trimBuf empties b, dropping it when it grew very large.
func trimBuf(b []byte) []byte {
	if cap(b) > maxRetain {
		return nil
	}
	return b[:0]
}

// trimU32 empties ids, dropping them when they grew very large.
func trimU32(ids []uint32) []uint32 {
	if cap(ids) > maxRetain/4 {
		return nil
	}
	return ids[:0]
}
