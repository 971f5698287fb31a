package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
)

// The engine's chat answer turned into the Messages answer, as vLLM 0.32
// builds it (vllm/entrypoints/anthropic/serving.py,
// messages_full_converter and message_stream_converter).

type anthContent struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	Thinking  *string         `json:"thinking,omitempty"`
	Signature *string         `json:"signature,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
}

type anthUsage struct {
	InputTokens          int64  `json:"input_tokens"`
	OutputTokens         int64  `json:"output_tokens"`
	CacheReadInputTokens *int64 `json:"cache_read_input_tokens,omitempty"`
}

type anthMessage struct {
	ID           string        `json:"id"`
	Type         string        `json:"type"`
	Role         string        `json:"role"`
	Content      []anthContent `json:"content"`
	Model        string        `json:"model"`
	StopReason   *string       `json:"stop_reason"`
	StopSequence *string       `json:"stop_sequence"`
	Usage        anthUsage     `json:"usage"`
}

// usageOf reads a chat usage object the way vLLM's _build_anthropic_usage
// does: cached prompt tokens are reported apart from input_tokens.
func usageOf(u gjson.Result) anthUsage {
	out := anthUsage{InputTokens: u.Get("prompt_tokens").Int(), OutputTokens: u.Get("completion_tokens").Int()}
	if c := u.Get("prompt_tokens_details.cached_tokens"); c.Exists() && c.Type == gjson.Number {
		n := c.Int()
		out.CacheReadInputTokens = &n
		out.InputTokens = max(0, out.InputTokens-n)
	}
	return out
}

// stopReason maps a chat finish_reason (and vLLM's stop_reason, the matched
// stop string) to Anthropic's stop_reason and stop_sequence
// (_to_anthropic_stop_reason).
func stopReason(finish string, stop gjson.Result, toolUsed bool) (*string, *string) {
	s := func(v string) *string { return &v }
	switch {
	case finish == "length":
		return s("max_tokens"), nil
	case finish != "stop" && finish != "tool_calls":
		return nil, nil
	case toolUsed && finish == "tool_calls":
		return s("tool_use"), nil
	case stop.Type == gjson.String:
		return s("stop_sequence"), s(stop.String())
	case toolUsed || finish == "tool_calls":
		return s("tool_use"), nil
	}
	return s("end_turn"), nil
}

// toolInput is a tool call's arguments as a tool_use input: the JSON object
// the model wrote, or {} when it wrote none or not an object (llama.cpp's
// rule; the row keeps the arguments as the engine returned them).
func toolInput(args string) json.RawMessage {
	r := gjson.Parse(args)
	if !gjson.Valid(args) || !r.IsObject() {
		return json.RawMessage("{}")
	}
	return json.RawMessage(args)
}

// chatToMessage builds the Messages answer from a chat completion.
func chatToMessage(body []byte) ([]byte, error) {
	if !gjson.ValidBytes(body) {
		return nil, errors.New("the engine's chat answer is not JSON")
	}
	r := gjson.ParseBytes(body)
	ch := r.Get("choices.0")
	if !ch.Exists() {
		return nil, errors.New("the engine's chat answer has no choices")
	}
	msg := ch.Get("message")
	out := anthMessage{ID: r.Get("id").String(), Type: "message", Role: "assistant", Model: r.Get("model").String(), Content: []anthContent{}, Usage: usageOf(r.Get("usage"))}
	if rs := reasoningOf(msg); rs != "" {
		sig := ""
		out.Content = append(out.Content, anthContent{Type: "thinking", Thinking: &rs, Signature: &sig})
	}
	if t := msg.Get("content").String(); t != "" {
		out.Content = append(out.Content, anthContent{Type: "text", Text: &t})
	}
	calls := msg.Get("tool_calls").Array()
	for _, tc := range calls {
		out.Content = append(out.Content, anthContent{Type: "tool_use", ID: tc.Get("id").String(), Name: tc.Get("function.name").String(), Input: toolInput(tc.Get("function.arguments").String())})
	}
	if len(out.Content) == 0 {
		empty := ""
		out.Content = append(out.Content, anthContent{Type: "text", Text: &empty})
	}
	out.StopReason, out.StopSequence = stopReason(ch.Get("finish_reason").String(), ch.Get("stop_reason"), len(calls) > 0)
	return marshalJSON(&out)
}

// reasoningOf is a chat message's (or delta's) reasoning: vLLM's
// "reasoning", SGLang's and llama.cpp's "reasoning_content".
func reasoningOf(m gjson.Result) string {
	if r := m.Get("reasoning"); r.Type == gjson.String {
		return r.String()
	}
	return m.Get("reasoning_content").String()
}

// anthropicErrorType is Anthropic's error type for an HTTP status.
func anthropicErrorType(status int) string {
	switch status {
	case 400, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 529, 503:
		return "overloaded_error"
	case 504:
		return "timeout_error"
	}
	return "api_error"
}

// marshalJSON is json.Marshal without HTML escaping (<, >, & as they are,
// as the engines write them).
func marshalJSON(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// appendAnthropicError appends {"type":"error","error":{"type":…,"message":…}}.
func appendAnthropicError(dst []byte, typ, msg string) []byte {
	b, _ := marshalJSON(struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}{Type: "error", Error: struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}{typ, msg}})
	return append(dst, b...)
}

// errorMessageOf is the message of an error body in the OpenAI, flat
// ({"message"}) or FastAPI ({"detail"}) style; the body itself otherwise.
func errorMessageOf(body []byte) string {
	r := gjson.ParseBytes(body)
	for _, p := range []string{"error.message", "message", "detail"} {
		if m := r.Get(p); m.Exists() && m.String() != "" {
			return m.String()
		}
	}
	return truncate(string(body), 500)
}

// messagesStream turns the engine's chat stream (as the gateway forwards
// it: stripped of what it injected) into Anthropic's Messages events. It
// reads the gateway's stream body (which captures the chat stream) and
// passes CloseWithError on, so the call ends as any stream does.
type messagesStream struct {
	in      io.Reader
	sc      capture.SSEScanner
	buf     []byte
	out     []byte
	off     int
	done    bool
	started bool

	id, model  string
	block      string // type of the open block, "" when none
	index      int    // index of the open block (or the next one)
	toolIdx    int64  // the open tool_use block's chat tool call index
	toolUsed   bool
	finish     string
	stopStr    gjson.Result
	usage      anthUsage
	sawUsage   bool
	sawDone    bool
	sawErr     bool
	maxPending int
}

// maxMessagesEvent bounds one engine event the converter holds.
const maxMessagesEvent = 16 << 20

func newMessagesStream(in io.Reader) *messagesStream {
	return &messagesStream{in: in, buf: make([]byte, 8<<10), toolIdx: -1, maxPending: maxMessagesEvent}
}

// Read returns the next bytes of Anthropic events.
func (m *messagesStream) Read(p []byte) (int, error) {
	for m.off >= len(m.out) {
		if m.done {
			return 0, io.EOF
		}
		m.out, m.off = m.out[:0], 0
		n, err := m.in.Read(m.buf)
		if n > 0 {
			m.sc.Feed(m.buf[:n])
			for {
				ev, ok := m.sc.Next()
				if !ok {
					break
				}
				m.event(ev.Data)
			}
			if len(m.sc.Rest()) > m.maxPending {
				m.fail(fmt.Sprintf("an event from the engine is larger than %d bytes", m.maxPending))
				m.done = true
			}
		}
		if errors.Is(err, io.EOF) {
			for {
				ev, ok := m.sc.Finish()
				if !ok {
					break
				}
				m.event(ev.Data)
			}
			m.end()
			m.done = true
		} else if err != nil {
			if len(m.out) == 0 {
				return 0, err
			}
			m.done = true
		}
	}
	n := copy(p, m.out[m.off:])
	m.off += n
	return n, nil
}

// CloseWithError ends the underlying stream body (capture and slot).
func (m *messagesStream) CloseWithError(err error) error {
	if c, ok := m.in.(fasthttp.ReadCloserWithError); ok {
		return c.CloseWithError(err)
	}
	return nil
}

func (m *messagesStream) emit(name string, v any) {
	b, err := marshalJSON(v)
	if err != nil {
		b = appendAnthropicError(nil, "api_error", "encoding an event: "+err.Error())
		name = "error"
	}
	m.out = append(m.out, "event: "...)
	m.out = append(m.out, name...)
	m.out = append(m.out, "\ndata: "...)
	m.out = append(m.out, b...)
	m.out = append(m.out, "\n\n"...)
}

func (m *messagesStream) fail(msg string) {
	if m.sawErr {
		return
	}
	m.sawErr = true
	m.out = append(m.out, "event: error\ndata: "...)
	m.out = appendAnthropicError(m.out, "api_error", msg)
	m.out = append(m.out, "\n\n"...)
}

type blockEvent struct {
	Type         string       `json:"type"`
	Index        int          `json:"index"`
	ContentBlock *anthContent `json:"content_block,omitempty"`
	Delta        any          `json:"delta,omitempty"`
}

type textDelta struct {
	Type        string  `json:"type"`
	Text        *string `json:"text,omitempty"`
	Thinking    *string `json:"thinking,omitempty"`
	PartialJSON *string `json:"partial_json,omitempty"`
	Signature   *string `json:"signature,omitempty"`
}

func (m *messagesStream) start(c anthContent) {
	m.stop()
	m.block = c.Type
	m.emit("content_block_start", blockEvent{Type: "content_block_start", Index: m.index, ContentBlock: &c})
}

func (m *messagesStream) stop() {
	if m.block == "" {
		return
	}
	if m.block == "thinking" {
		sig := ""
		m.emit("content_block_delta", blockEvent{Type: "content_block_delta", Index: m.index, Delta: textDelta{Type: "signature_delta", Signature: &sig}})
	}
	m.emit("content_block_stop", blockEvent{Type: "content_block_stop", Index: m.index})
	m.block, m.toolIdx = "", -1
	m.index++
}

func (m *messagesStream) delta(d textDelta) {
	m.emit("content_block_delta", blockEvent{Type: "content_block_delta", Index: m.index, Delta: d})
}

// event handles one chat chunk.
func (m *messagesStream) event(data []byte) {
	if data == nil || m.sawErr {
		return
	}
	if string(data) == "[DONE]" {
		m.sawDone = true
		return
	}
	if !gjson.ValidBytes(data) {
		m.fail("the engine sent an event that is not JSON")
		return
	}
	r := gjson.ParseBytes(data)
	if e := r.Get("error"); e.Exists() {
		m.fail(errorMessageOf(data))
		return
	}
	if u := r.Get("usage"); u.IsObject() {
		m.usage, m.sawUsage = usageOf(u), true
	}
	if !m.started {
		m.started = true
		m.id, m.model = r.Get("id").String(), r.Get("model").String()
		msg := anthMessage{ID: m.id, Type: "message", Role: "assistant", Model: m.model, Content: []anthContent{}, Usage: anthUsage{InputTokens: m.usage.InputTokens}}
		m.emit("message_start", struct {
			Type    string      `json:"type"`
			Message anthMessage `json:"message"`
		}{"message_start", msg})
	}
	ch := r.Get("choices.0")
	if !ch.Exists() {
		return
	}
	d := ch.Get("delta")
	if rs := reasoningOf(d); rs != "" {
		if m.block != "thinking" {
			empty, sig := "", ""
			m.start(anthContent{Type: "thinking", Thinking: &empty, Signature: &sig})
		}
		m.delta(textDelta{Type: "thinking_delta", Thinking: &rs})
	}
	if t := d.Get("content"); t.Type == gjson.String && t.String() != "" {
		if m.block != "text" {
			empty := ""
			m.start(anthContent{Type: "text", Text: &empty})
		}
		s := t.String()
		m.delta(textDelta{Type: "text_delta", Text: &s})
	}
	for _, tc := range d.Get("tool_calls").Array() {
		idx := tc.Get("index").Int()
		if m.block != "tool_use" || idx != m.toolIdx {
			m.start(anthContent{Type: "tool_use", ID: tc.Get("id").String(), Name: tc.Get("function.name").String(), Input: json.RawMessage("{}")})
			m.toolIdx, m.toolUsed = idx, true
		}
		if a := tc.Get("function.arguments").String(); a != "" {
			m.delta(textDelta{Type: "input_json_delta", PartialJSON: &a})
		}
	}
	if f := ch.Get("finish_reason"); f.Type == gjson.String {
		m.finish, m.stopStr = f.String(), ch.Get("stop_reason")
	}
}

// end closes the message: the open block, message_delta with the stop
// reason and usage, message_stop. A stream that ended without a finish
// reason ends with an error event instead (the Anthropic SDK raises it).
func (m *messagesStream) end() {
	if m.sawErr {
		return
	}
	if m.finish == "" {
		m.fail("the engine's stream ended before the message was finished")
		return
	}
	m.stop()
	reason, seq := stopReason(m.finish, m.stopStr, m.toolUsed)
	type delta struct {
		StopReason   *string `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	m.emit("message_delta", struct {
		Type  string    `json:"type"`
		Delta delta     `json:"delta"`
		Usage anthUsage `json:"usage"`
	}{"message_delta", delta{reason, seq}, m.usage})
	m.emit("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
}
