package capture

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export/arrays"
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
// or Result call on the Assembler; copy what must outlive that.
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
	}
	// Error is "" or what went wrong: a backend error object (in the body or
	// mid-stream), invalid JSON, a limit reached.
	Error string
	// Model and ID are the response's "model" and "id".
	Model, ID string
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
}

// toolState accumulates one tool call of a streamed chat choice. Strings are
// kept JSON-escaped (without quotes): the interiors of valid JSON strings
// concatenate into a valid JSON string interior.
type toolState struct {
	index   uint32
	id      []byte
	typ     []byte
	name    []byte
	args    []byte
	hasID   bool
	hasType bool
	hasName bool
}

// choiceState accumulates one choice.
type choiceState struct {
	index uint32

	content      []byte // escaped interior (chat content or completions text)
	reasoning    []byte // escaped interior
	reasoningKey string // "reasoning_content" or "reasoning"
	hasContent   bool
	hasReason    bool
	tools        []toolState

	tokenIDs    []uint32
	promptIDs   []uint32
	hasTokenIDs bool
	hasPrompt   bool

	logprobs []float32
	hasLP    bool
	lpChat   []byte // comma-separated raw logprobs.content[] entries
	lpTokens []byte // completions: raw elements of the four arrays
	lpTokLP  []byte
	lpOffset []byte
	lpTop    []byte

	finish     []byte // raw JSON string token
	stopReason []byte // raw JSON token, non-null
	message    []byte // built message JSON (owned buffer)
	view       []byte // what ChoiceResult.Message shows: message, or a slice of the body
}

func (c *choiceState) reset(index uint32) {
	c.index = index
	c.content = trimBuf(c.content)
	c.reasoning = trimBuf(c.reasoning)
	c.reasoningKey = ""
	c.hasContent, c.hasReason = false, false
	c.tools = c.tools[:0]
	c.tokenIDs = trimU32(c.tokenIDs)
	c.promptIDs = trimU32(c.promptIDs)
	c.hasTokenIDs, c.hasPrompt = false, false
	c.logprobs = c.logprobs[:0]
	if cap(c.logprobs) > maxRetain/4 {
		c.logprobs = nil
	}
	c.hasLP = false
	c.lpChat = trimBuf(c.lpChat)
	c.lpTokens = trimBuf(c.lpTokens)
	c.lpTokLP = trimBuf(c.lpTokLP)
	c.lpOffset = trimBuf(c.lpOffset)
	c.lpTop = trimBuf(c.lpTop)
	c.finish = c.finish[:0]
	c.stopReason = c.stopReason[:0]
	c.message = trimBuf(c.message)
	c.view = nil
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

	body     []byte // non-stream: copy of the body; stream: assembled body
	respBody []byte // Responses stream: the final response object
	id       []byte // raw JSON token
	model    []byte // raw JSON token
	created  []byte // raw JSON token
	usage    []byte // raw JSON object
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

	res Assembled
}

// Reset prepares the Assembler for a new response to endpoint, keeping its
// buffers (except very large ones).
func (a *Assembler) Reset(endpoint openai.Endpoint) {
	a.endpoint, a.kind = endpoint, endpoint
	a.stream, a.built = false, false
	a.body = trimBuf(a.body)
	a.respBody = trimBuf(a.respBody)
	a.id = a.id[:0]
	a.model = a.model[:0]
	a.created = a.created[:0]
	a.usage = a.usage[:0]
	a.prompt = trimU32(a.prompt)
	a.hasPmt = false
	a.head = a.head[:0]
	a.errMsg = a.errMsg[:0]
	a.dropped, a.droppedT = 0, 0
	a.n = 0
	a.last = -1
	clear(a.byIndex)
	keepModel := a.res.Model
	a.res = Assembled{Choices: a.res.Choices[:0], Model: keepModel}
}

// footprint is roughly the bytes the Assembler's buffers hold (their
// capacities), for a pool deciding whether to keep it.
func (a *Assembler) footprint() int {
	n := cap(a.body) + cap(a.respBody) + 4*cap(a.prompt)
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
	if !gjson.ValidBytes(a.body) {
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
	// A chunk that repeats the previous chunk's head is read without it (see
	// Assembler.head): '{' and what follows the head.
	// The rest must open a member: the head ends with a comma, so "{" and a
	// rest of "}" would be valid where the chunk is not.
	sameHead := len(a.head) > 0 && !a.noHead && len(data) > len(a.head) && bytes.Equal(data[:len(a.head)], a.head) &&
		(a.kind == openai.ChatCompletions || a.kind == openai.Completions)
	if sameHead {
		i := skipWS(b2s(data), len(a.head))
		sameHead = i < len(data) && data[i] == '"'
	}
	if sameHead {
		a.tail = append(append(a.tail[:0], '{'), data[len(a.head):]...)
		data = a.tail
	}
	if !gjson.ValidBytes(data) {
		// The raw payload is not valid JSON either: LogprobIDs skips it.
		a.setErr("invalid JSON in stream event")
		return false
	}
	top := gjson.Parse(b2s(data))
	if !top.IsObject() {
		a.setErr("stream event is not a JSON object")
		return true
	}
	mayLogprobs = bytes.Contains(data, escapeU)
	if a.kind == openai.Responses {
		a.responsesEvent(top)
		return mayLogprobs || bytes.Contains(data, choicesKey)
	}
	var choices gjson.Result
	nChoices := 0
	flatErr := false
	headKeys, headEnd := !sameHead && !mayLogprobs, 0 // whether only head members came before "choices"; where it starts
	eachMember(top.Raw, func(k string, v gjson.Result) bool {
		if headKeys && nChoices == 0 {
			switch k {
			case "id", "object", "created", "model":
			case "choices":
				// k is top.Raw's own bytes: its opening quote ends the head.
				headEnd = int(uintptr(unsafe.Pointer(unsafe.StringData(k)))-uintptr(unsafe.Pointer(unsafe.StringData(top.Raw)))) - 1
			default:
				headKeys = false
			}
		}
		switch k {
		case "id":
			if len(a.id) == 0 && v.Type == gjson.String {
				a.id = append(a.id, v.Raw...)
			}
		case "object":
			a.guessKind(v)
			flatErr = decodeStr(v) == "error"
		case "created":
			if len(a.created) == 0 && v.Type == gjson.Number {
				a.created = append(a.created, v.Raw...)
			}
		case "model":
			if len(a.model) == 0 && v.Type == gjson.String {
				a.model = append(a.model, v.Raw...)
			}
		case "choices":
			choices = v
			nChoices++
		case "usage":
			if v.IsObject() {
				a.usage = append(a.usage[:0], v.Raw...)
			}
		case "prompt_token_ids":
			if !a.hasPmt && v.IsArray() {
				a.prompt, a.hasPmt = appendIDs(a.prompt, v), true
			}
		case "error":
			a.errorValue(v)
		case "type":
			// A Responses API event while the endpoint was unknown.
			if a.kind != openai.Unknown {
				break
			}
			if t := decodeStr(v); strings.HasPrefix(t, "response.") {
				a.kind = openai.Responses
				a.responsesEvent(top)
				return false
			} else if t == "error" {
				a.responsesEvent(top)
			}
		}
		return true
	})
	if flatErr {
		// Older vLLM and SGLang: {"object":"error","message":...,"type":...}
		a.errorValue(top)
	}
	if a.kind == openai.Responses {
		return mayLogprobs || bytes.Contains(data, choicesKey)
	}
	// gjson reads the first "choices" and iterates an object's members too.
	if nChoices > 1 || choices.IsObject() {
		mayLogprobs = true
	}
	if !sameHead {
		a.head = a.head[:0]
		if headKeys && headEnd > 1 && !flatErr && choices.IsArray() &&
			(a.kind == openai.ChatCompletions || a.kind == openai.Completions) {
			a.head = append(a.head, top.Raw[:headEnd]...)
		}
	}
	if choices.IsArray() {
		eachElem(choices.Raw, func(ch gjson.Result) bool {
			if ch.IsObject() && a.streamChoice(ch) {
				mayLogprobs = true
			}
			return true
		})
	}
	return mayLogprobs
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
	if a.stream && a.kind != openai.Responses {
		for i := range a.n {
			a.buildMessage(&a.choices[i])
		}
		a.buildBody()
	}
	switch {
	case a.stream && a.kind == openai.Responses:
		r.ResponseBody = a.respBody
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
	r.Usage.PromptTokens, r.Usage.CompletionTokens, r.Usage.Present = 0, 0, false
	if len(a.usage) > 0 {
		u := gjson.Parse(b2s(a.usage))
		p, c := u.Get("prompt_tokens"), u.Get("completion_tokens")
		if !p.Exists() && !c.Exists() {
			p, c = u.Get("input_tokens"), u.Get("output_tokens")
		}
		r.Usage.PromptTokens, r.Usage.CompletionTokens = clampU32(p), clampU32(c)
		r.Usage.Present = true
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

// choice returns the state of the choice with this index, creating it; nil
// when MaxChoices is reached.
func (a *Assembler) choice(index uint32) *choiceState {
	if a.last >= 0 && a.choices[a.last].index == index {
		return &a.choices[a.last]
	}
	if a.n <= 8 { // few choices: a linear scan beats the map
		for i := range a.n {
			if a.choices[i].index == index {
				a.last = int32(i)
				return &a.choices[i]
			}
		}
	} else if i, ok := a.byIndex[index]; ok {
		a.last = i
		return &a.choices[i]
	}
	if a.n >= MaxChoices {
		a.dropped++
		return nil
	}
	if a.n == len(a.choices) {
		a.choices = append(a.choices, choiceState{})
	}
	c := &a.choices[a.n]
	c.reset(index)
	a.last = int32(a.n)
	a.n++
	if a.n > 8 {
		if a.byIndex == nil {
			a.byIndex = make(map[uint32]int32)
		}
		if len(a.byIndex) == 0 { // switching from scan to map: index all
			for i := range a.n {
				a.byIndex[a.choices[i].index] = int32(i)
			}
		} else {
			a.byIndex[index] = a.last
		}
	}
	return c
}

// choiceFields are the fields of one element of "choices".
type choiceFields struct {
	index, delta, message, text, logprobs, finish, stop, tokenIDs, promptIDs gjson.Result
	// anyLogprobs: some "logprobs" member (not only the last) is an object.
	anyLogprobs bool
}

func readChoice(ch gjson.Result) (f choiceFields) {
	eachMember(ch.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "index":
			f.index = v
		case "delta":
			f.delta = v
		case "message":
			f.message = v
		case "text":
			f.text = v
		case "logprobs":
			f.logprobs = v
			f.anyLogprobs = f.anyLogprobs || v.IsObject()
		case "finish_reason":
			f.finish = v
		case "stop_reason":
			f.stop = v
		case "token_ids":
			f.tokenIDs = v
		case "prompt_token_ids":
			f.promptIDs = v
		}
		return true
	})
	return f
}

// streamChoice merges one element of a chunk's "choices" into its state. It
// reports whether the element has a "logprobs" object (see addChunk).
func (a *Assembler) streamChoice(ch gjson.Result) (hasLogprobs bool) {
	f := readChoice(ch)
	c := a.choice(clampU32(f.index))
	if c == nil {
		return f.anyLogprobs
	}
	if f.delta.IsObject() {
		a.mergeDelta(c, f.delta)
	} else if f.message.IsObject() {
		// A whole non-streaming object sent as one event (best_of, beam search).
		a.mergeDelta(c, f.message)
	}
	if f.text.Type == gjson.String {
		c.content = appendInterior(c.content, f.text.Raw)
		c.hasContent = true
	}
	a.commonChoice(c, &f, true)
	return f.anyLogprobs
}

// commonChoice handles the fields streamed and non-streamed choices share.
func (a *Assembler) commonChoice(c *choiceState, f *choiceFields, stream bool) {
	if f.logprobs.IsObject() {
		a.mergeLogprobs(c, f.logprobs, stream)
	}
	if f.finish.Type == gjson.String {
		c.finish = append(c.finish[:0], f.finish.Raw...)
	}
	if f.stop.Exists() && f.stop.Type != gjson.Null {
		c.stopReason = append(c.stopReason[:0], f.stop.Raw...)
	}
	if f.tokenIDs.IsArray() {
		c.tokenIDs = appendIDs(c.tokenIDs, f.tokenIDs)
		c.hasTokenIDs = true
	}
	if !c.hasPrompt && f.promptIDs.IsArray() {
		c.promptIDs = appendIDs(c.promptIDs, f.promptIDs)
		c.hasPrompt = true
	}
}

// mergeDelta merges a chat delta (or a whole message) into c.
func (a *Assembler) mergeDelta(c *choiceState, d gjson.Result) {
	eachMember(d.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "content":
			if v.Type == gjson.String {
				c.content = appendInterior(c.content, v.Raw)
				c.hasContent = true
			}
		case "reasoning_content", "reasoning":
			if v.Type == gjson.String {
				c.reasoning = appendInterior(c.reasoning, v.Raw)
				c.hasReason = true
				if c.reasoningKey == "" {
					c.reasoningKey = "reasoning"
					if len(k) > len("reasoning") {
						c.reasoningKey = "reasoning_content"
					}
				}
			}
		case "tool_calls":
			if v.IsArray() {
				pos := uint32(0)
				eachElem(v.Raw, func(tc gjson.Result) bool {
					if tc.IsObject() {
						a.mergeTool(c, tc, pos)
					}
					pos++
					return true
				})
			}
		}
		return true
	})
}

// mergeTool merges one tool_calls delta; pos is its position in the array,
// used when it has no "index".
func (a *Assembler) mergeTool(c *choiceState, tc gjson.Result, pos uint32) {
	var idx, id, typ, fn gjson.Result
	eachMember(tc.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "index":
			idx = v
		case "id":
			id = v
		case "type":
			typ = v
		case "function":
			fn = v
		}
		return true
	})
	index := pos
	if idx.Type == gjson.Number {
		index = clampU32(idx)
	}
	var t *toolState
	for i := range c.tools {
		if c.tools[i].index == index {
			t = &c.tools[i]
			break
		}
	}
	if t == nil {
		if len(c.tools) >= MaxToolCalls {
			a.droppedT++
			return
		}
		if len(c.tools) < cap(c.tools) {
			c.tools = c.tools[:len(c.tools)+1]
		} else {
			c.tools = append(c.tools, toolState{})
		}
		t = &c.tools[len(c.tools)-1]
		t.index = index
		t.id, t.typ, t.name, t.args = t.id[:0], t.typ[:0], t.name[:0], t.args[:0]
		t.hasID, t.hasType, t.hasName = false, false, false
	}
	if !t.hasID && id.Type == gjson.String {
		t.id, t.hasID = appendInterior(t.id, id.Raw), true
	}
	if !t.hasType && typ.Type == gjson.String {
		t.typ, t.hasType = appendInterior(t.typ, typ.Raw), true
	}
	if fn.IsObject() {
		eachMember(fn.Raw, func(k string, v gjson.Result) bool {
			if v.Type != gjson.String {
				return true
			}
			switch k {
			case "name":
				if !t.hasName {
					t.name, t.hasName = appendInterior(t.name, v.Raw), true
				}
			case "arguments":
				t.args = appendInterior(t.args, v.Raw)
			}
			return true
		})
	}
}

// mergeLogprobs reads a choice's logprobs object (chat or completions form).
// When keep is true the raw entries are kept to rebuild the body.
func (a *Assembler) mergeLogprobs(c *choiceState, lp gjson.Result, keep bool) {
	eachMember(lp.Raw, func(k string, v gjson.Result) bool {
		if !v.IsArray() {
			return true
		}
		switch k {
		case "content": // chat
			c.hasLP = true
			eachElem(v.Raw, func(e gjson.Result) bool {
				l := e.Get("logprob")
				if l.Type == gjson.Number {
					c.logprobs = append(c.logprobs, float32(l.Num))
				} else {
					c.logprobs = append(c.logprobs, float32(math.NaN()))
				}
				if keep {
					c.lpChat = appendElem(c.lpChat, e.Raw)
				}
				return true
			})
		case "token_logprobs": // completions
			c.hasLP = true
			eachElem(v.Raw, func(e gjson.Result) bool {
				if e.Type == gjson.Number {
					c.logprobs = append(c.logprobs, float32(numOf(e)))
				} else {
					c.logprobs = append(c.logprobs, float32(math.NaN()))
				}
				if keep {
					c.lpTokLP = appendElem(c.lpTokLP, e.Raw)
				}
				return true
			})
		case "tokens":
			if keep {
				c.lpTokens = appendElems(c.lpTokens, v.Raw)
			}
		case "text_offset":
			if keep {
				c.lpOffset = appendElems(c.lpOffset, v.Raw)
			}
		case "top_logprobs":
			if keep {
				c.lpTop = appendElems(c.lpTop, v.Raw)
			}
		}
		return true
	})
}

// responsesEvent handles one event of a Responses API stream.
func (a *Assembler) responsesEvent(top gjson.Result) {
	typ := top.Get("type")
	switch typ.Str {
	case "response.completed", "response.incomplete", "response.failed":
		r := top.Get("response")
		if r.IsObject() {
			a.respBody = append(a.respBody[:0], r.Raw...)
		}
	case "error":
		msg := top.Get("message")
		if msg.Type == gjson.String && msg.Str != "" {
			a.setErr(msg.Str)
		} else {
			a.setErr("backend error: " + truncate(top.Raw))
		}
	default:
		if e := top.Get("error"); e.Exists() {
			a.errorValue(e)
		}
	}
}

// parseBody reads a whole (valid) JSON response: a non-streaming body, or the
// final object of a Responses stream. Slices of the result point into body.
func (a *Assembler) parseBody(body []byte) {
	top := gjson.Parse(b2s(body))
	if !top.IsObject() {
		a.setErr("response body is not a JSON object")
		return
	}
	var choices, output, status, incomplete gjson.Result
	eachMember(top.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "id":
			if v.Type == gjson.String {
				a.id = append(a.id[:0], v.Raw...)
			}
		case "object":
			a.guessKind(v)
			if decodeStr(v) == "error" {
				// Older vLLM and SGLang: {"object":"error","message":...}
				a.errorValue(top)
			}
		case "model":
			if v.Type == gjson.String {
				a.model = append(a.model[:0], v.Raw...)
			}
		case "created":
			if v.Type == gjson.Number {
				a.created = append(a.created[:0], v.Raw...)
			}
		case "choices":
			choices = v
		case "output":
			output = v
		case "status":
			status = v
		case "incomplete_details":
			incomplete = v
		case "usage":
			if v.IsObject() {
				a.usage = append(a.usage[:0], v.Raw...)
			}
		case "prompt_token_ids":
			if !a.hasPmt && v.IsArray() {
				a.prompt, a.hasPmt = appendIDs(a.prompt, v), true
			}
		case "error":
			a.errorValue(v)
		}
		return true
	})
	if a.kind == openai.Unknown && output.Exists() {
		a.kind = openai.Responses
	}
	switch a.kind {
	case openai.Embeddings:
		return
	case openai.Responses:
		if !output.Exists() && !status.Exists() {
			return
		}
		c := a.choice(0)
		if c == nil {
			return
		}
		if output.Exists() {
			c.view = s2b(output.Raw) // points into body
		}
		if r := incomplete.Get("reason"); r.Type == gjson.String {
			c.finish = append(c.finish[:0], r.Raw...)
		} else if status.Type == gjson.String {
			c.finish = append(c.finish[:0], status.Raw...)
		}
		return
	}
	if !choices.IsArray() {
		return
	}
	eachElem(choices.Raw, func(ch gjson.Result) bool {
		if !ch.IsObject() {
			return true
		}
		f := readChoice(ch)
		c := a.choice(clampU32(f.index))
		if c == nil {
			return true
		}
		switch {
		case f.message.IsObject():
			c.view = s2b(f.message.Raw) // points into body
		case f.text.Type == gjson.String:
			c.message = append(c.message[:0], `{"text":`...)
			c.message = append(c.message, f.text.Raw...)
			c.message = append(c.message, '}')
			c.view = c.message
		}
		a.commonChoice(c, &f, false)
		return true
	})
}

// sortChoices orders the used choices by index (they usually already are).
func (a *Assembler) sortChoices() {
	cs := a.choices[:a.n]
	if slices.IsSortedFunc(cs, cmpChoice) {
		return
	}
	slices.SortStableFunc(cs, cmpChoice)
	a.last = -1
	if a.n > 8 {
		clear(a.byIndex)
		for i := range cs {
			a.byIndex[cs[i].index] = int32(i)
		}
	}
}

func cmpChoice(x, y choiceState) int {
	switch {
	case x.index < y.index:
		return -1
	case x.index > y.index:
		return 1
	}
	return 0
}

// buildMessage writes the message of a streamed choice into c.message.
func (a *Assembler) buildMessage(c *choiceState) {
	m := c.message[:0]
	if a.kind == openai.Completions {
		m = append(m, `{"text":"`...)
		m = append(m, c.content...)
		m = append(m, `"}`...)
		c.message, c.view = m, m
		return
	}
	m = append(m, `{"role":"assistant","content":`...)
	if c.hasContent && (len(c.content) > 0 || len(c.tools) == 0) {
		m = append(m, '"')
		m = append(m, c.content...)
		m = append(m, '"')
	} else {
		m = append(m, "null"...)
	}
	if c.hasReason {
		m = append(m, `,"`...)
		m = append(m, c.reasoningKey...)
		m = append(m, `":"`...)
		m = append(m, c.reasoning...)
		m = append(m, '"')
	}
	m = append(m, `,"tool_calls":[`...)
	slices.SortStableFunc(c.tools, func(x, y toolState) int {
		return int(int64(x.index) - int64(y.index))
	})
	for i := range c.tools {
		t := &c.tools[i]
		if i > 0 {
			m = append(m, ',')
		}
		m = append(m, '{')
		if t.hasID {
			m = append(m, `"id":"`...)
			m = append(m, t.id...)
			m = append(m, `",`...)
		}
		m = append(m, `"type":"`...)
		if t.hasType {
			m = append(m, t.typ...)
		} else {
			m = append(m, "function"...)
		}
		m = append(m, `","function":{"name":"`...)
		m = append(m, t.name...)
		m = append(m, `","arguments":"`...)
		m = append(m, t.args...)
		m = append(m, `"}}`...)
	}
	m = append(m, "]}"...)
	c.message, c.view = m, m
}

// buildBody writes the non-streaming equivalent of a chat or completions
// stream into a.body, in vLLM's shape.
func (a *Assembler) buildBody() {
	chat := a.kind != openai.Completions
	b := a.body[:0]
	b = append(b, `{"id":`...)
	b = appendRawOr(b, a.id, `""`)
	if chat {
		b = append(b, `,"object":"chat.completion","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = appendRawOr(b, a.created, "0")
	b = append(b, `,"model":`...)
	b = appendRawOr(b, a.model, `""`)
	b = append(b, `,"choices":[`...)
	for i := range a.n {
		c := &a.choices[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendUint(b, uint64(c.index), 10)
		if chat {
			b = append(b, `,"message":`...)
			b = append(b, c.message...)
		} else {
			b = append(b, `,"text":"`...)
			b = append(b, c.content...)
			b = append(b, '"')
		}
		b = append(b, `,"logprobs":`...)
		switch {
		case !c.hasLP:
			b = append(b, "null"...)
		case chat:
			b = append(b, `{"content":[`...)
			b = append(b, c.lpChat...)
			b = append(b, "]}"...)
		default:
			b = append(b, `{"tokens":[`...)
			b = append(b, c.lpTokens...)
			b = append(b, `],"token_logprobs":[`...)
			b = append(b, c.lpTokLP...)
			b = append(b, `],"text_offset":[`...)
			b = append(b, c.lpOffset...)
			b = append(b, `],"top_logprobs":[`...)
			b = append(b, c.lpTop...)
			b = append(b, "]}"...)
		}
		b = append(b, `,"finish_reason":`...)
		b = appendRawOr(b, c.finish, "null")
		b = append(b, `,"stop_reason":`...)
		b = appendRawOr(b, c.stopReason, "null")
		if c.hasPrompt {
			b = append(b, `,"prompt_token_ids":`...)
			b = arrays.AppendUint32s(b, c.promptIDs)
		}
		if c.hasTokenIDs {
			b = append(b, `,"token_ids":`...)
			b = arrays.AppendUint32s(b, c.tokenIDs)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	if len(a.usage) > 0 {
		b = append(b, `,"usage":`...)
		b = append(b, a.usage...)
	}
	if a.hasPmt {
		b = append(b, `,"prompt_token_ids":`...)
		b = arrays.AppendUint32s(b, a.prompt)
	}
	b = append(b, '}')
	a.body = b
}

// appendRawOr appends raw, or def when raw is empty.
func appendRawOr(dst, raw []byte, def string) []byte {
	if len(raw) == 0 {
		return append(dst, def...)
	}
	return append(dst, raw...)
}

// appendIDs appends the token ids of a JSON array. Elements that are not
// numbers are skipped; numbers are clamped to [0, 2^32-1].
func appendIDs(dst []uint32, arr gjson.Result) []uint32 {
	// Fast path: plain non-negative integers, the shape engines send.
	raw := arr.Raw
	start := len(dst)
	var v uint64
	digits := 0
	for i := 1; i < len(raw); i++ {
		ch := raw[i]
		switch {
		case ch >= '0' && ch <= '9':
			v = v*10 + uint64(ch-'0')
			digits++
			if digits > 10 {
				goto slow
			}
		case ch == ',' || ch == ']':
			if digits == 0 {
				if ch == ']' && len(dst) == start {
					continue // empty array
				}
				goto slow
			}
			if v > math.MaxUint32 {
				goto slow
			}
			dst = append(dst, uint32(v))
			v, digits = 0, 0
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r':
			if digits > 0 {
				goto slow // "1 2" cannot happen in valid JSON, but be careful
			}
		default:
			goto slow
		}
	}
	return dst
slow:
	dst = dst[:start]
	eachElem(arr.Raw, func(e gjson.Result) bool {
		if e.Type == gjson.Number {
			dst = append(dst, clampU32(e))
		}
		return true
	})
	return dst
}

// clampU32 converts a JSON number to uint32, clamping; 0 for anything else.
func clampU32(r gjson.Result) uint32 {
	n := numOf(r)
	if !(n > 0) {
		return 0
	}
	if n >= math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}

// appendInterior appends the inside of a raw JSON string token (its escapes
// kept as they are).
func appendInterior(dst []byte, raw string) []byte {
	if len(raw) < 2 {
		return dst
	}
	return append(dst, raw[1:len(raw)-1]...)
}

// appendElem appends one raw JSON value to a comma-separated list.
func appendElem(dst []byte, raw string) []byte {
	if len(dst) > 0 {
		dst = append(dst, ',')
	}
	return append(dst, raw...)
}

// appendElems appends the elements of a raw JSON array to a comma-separated
// list.
func appendElems(dst []byte, rawArray string) []byte {
	in := strings.TrimSpace(rawArray)
	if len(in) < 2 {
		return dst
	}
	in = strings.TrimSpace(in[1 : len(in)-1])
	if in == "" {
		return dst
	}
	return appendElem(dst, in)
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
	s := gjson.Parse(b2s(raw)).Str // unescaped: a new string
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

// b2s views b as a string without copying. The string must not outlive b's
// contents: every value parsed from it is copied before b changes.
func b2s(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// s2b views a string obtained from b2s as bytes, without copying. The bytes
// must not be modified.
func s2b(s string) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// The JSON walkers below run on input already checked with gjson.Valid. They
// differ from gjson's ForEach in one way: string values are not unescaped
// (an allocation per escaped string, e.g. every token containing a newline);
// the raw token is what the assembler copies. They never read out of bounds,
// whatever the input.

// eachMember calls fn with each member of the JSON object obj: the key (its
// raw interior: keys with escapes do not match plain names) and the value
// (see rawValue). It stops when fn returns false.
func eachMember(obj string, fn func(key string, v gjson.Result) bool) {
	i := skipWS(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i++
	for {
		i = skipWS(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return // '}' or malformed
		}
		end := stringEnd(obj, i)
		if end < 0 {
			return
		}
		key := obj[i+1 : end-1]
		i = skipWS(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipWS(obj, i+1)
		vend := valueEnd(obj, i)
		if vend < 0 {
			return
		}
		if !fn(key, rawValue(obj[i:vend])) {
			return
		}
		i = skipWS(obj, vend)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i++
	}
}

// eachElem calls fn with each element of the JSON array arr (see rawValue).
// It stops when fn returns false.
func eachElem(arr string, fn func(v gjson.Result) bool) {
	i := skipWS(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return
	}
	i++
	for {
		i = skipWS(arr, i)
		if i >= len(arr) || arr[i] == ']' {
			return
		}
		vend := valueEnd(arr, i)
		if vend < 0 || vend == i {
			return
		}
		if !fn(rawValue(arr[i:vend])) {
			return
		}
		i = skipWS(arr, vend)
		if i >= len(arr) || arr[i] != ',' {
			return
		}
		i++
	}
}

// rawValue types a raw JSON value like gjson does, but leaves an escaped
// string's Str empty (use decodeStr) and Raw as the token.
func rawValue(raw string) gjson.Result {
	r := gjson.Result{Raw: raw}
	if raw == "" {
		return r
	}
	switch raw[0] {
	case '"':
		r.Type = gjson.String
		if in := raw[1 : len(raw)-1]; strings.IndexByte(in, '\\') < 0 {
			r.Str = in
		}
	case '{', '[':
		r.Type = gjson.JSON
	case 'n':
		r.Type = gjson.Null
	case 't':
		r.Type = gjson.True
	case 'f':
		r.Type = gjson.False
	default:
		r.Type = gjson.Number // Num is parsed on demand: see numOf
	}
	return r
}

// numOf returns the value of a number from rawValue or gjson.
func numOf(v gjson.Result) float64 {
	if v.Type != gjson.Number {
		return 0
	}
	if v.Num != 0 {
		return v.Num
	}
	f, _ := strconv.ParseFloat(v.Raw, 64)
	return f
}

// decodeStr returns the decoded value of a string from rawValue (allocating
// only when it has escapes); "" for anything else.
func decodeStr(v gjson.Result) string {
	if v.Type != gjson.String {
		return ""
	}
	if strings.IndexByte(v.Raw, '\\') < 0 {
		return v.Str
	}
	return gjson.Parse(v.Raw).Str
}

func isWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipWS(s string, i int) int {
	for i < len(s) && isWS(s[i]) {
		i++
	}
	return i
}

// stringEnd returns the offset after the string token starting at s[i] ('"'),
// or -1 when it is not terminated.
func stringEnd(s string, i int) int {
	j := i + 1
	for {
		q := strings.IndexByte(s[j:], '"')
		if q < 0 {
			return -1
		}
		j += q
		// The quote is escaped when an odd number of backslashes precede it.
		n := 0
		for k := j - 1; k > i && s[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}

// valueEnd returns the offset after the value starting at s[i], or -1.
func valueEnd(s string, i int) int {
	if i >= len(s) {
		return -1
	}
	switch s[i] {
	case '"':
		return stringEnd(s, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(s); j++ {
			switch s[j] {
			case '"':
				e := stringEnd(s, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(s) && s[j] != ',' && s[j] != '}' && s[j] != ']' && !isWS(s[j]) {
		j++
	}
	return j
}
