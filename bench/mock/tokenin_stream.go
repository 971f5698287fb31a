package mock

import (
	"bufio"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Streamed token-in, as vLLM 0.32.0 serves it:
//
//   - POST /inference/v1/generate with stream: true
//     (token_in_token_out/serving.py, serve_tokens_stream_generator): one
//     GenerateTokensStreamResponse per sampled token and choice,
//     {"request_id","usage":null,"output_mode":"tokens","choices":[{"index",
//     "finish_reason","stop_reason","token_ids","routed_experts",
//     "sampling_mask","weight_versions","logprobs"}]} (prompt_token_ids on the
//     first when the request set return_token_ids; usage on every chunk with
//     continuous_usage_stats); the last token rides on the finish chunk; then
//     with include_usage a chunk with no choices and the usage (written with
//     exclude_none), and data: [DONE].
//   - POST /v1/chat/completions/derender with stream: true
//     (derender/serving.py derender_chat_stream_response,
//     renderers/online_derenderer.py _derender_chat_stream_parsed: the mock
//     imitates a server with the hermes tool parser configured): one generate
//     chunk and the stream_state from the previous call in,
//     {"chunk": ChatCompletionStreamResponse, "stream_state":
//     DerenderStreamState} out (every member written, nulls included: the
//     router returns model_dump()). chat_request and prompt_token_ids are
//     required; at most one choice per chunk. The state carries every output
//     id and the chunk lengths (vLLM replays them through a fresh parser);
//     the role goes on the first chunk with a choice; the hermes tool call
//     streams its name once complete, then its arguments as raw text diffs up
//     to the end of the arguments' JSON value (hermes.go); the finish reason
//     becomes "tool_calls" once a call streamed unless the tool choice names
//     a function; no logprobs (the parsed path resolves none); token_ids
//     when chat_request.return_token_ids (and include_reasoning, default
//     true). Text held back for stop strings is not modelled here.

// streamGenerate writes a streamed generate answer.
func streamGenerate(p *plan, w *bufio.Writer) { p.streamWith(w, &generateWire) }

var generateWire = perTokenWire(nil, (*plan).appendGenerateStep, (*plan).appendGenerateUsageChunk)

// appendGenerateStep appends the GenerateTokensStreamResponse of token
// c.ids[st] of choice i.
func (p *plan) appendGenerateStep(dst []byte, i int, c *planChoice, st int, final bool) []byte {
	dst = append(dst, `{"request_id":"chatcmpl-`...)
	dst = append(dst, p.id[:]...)
	dst = append(dst, `","usage":`...)
	if p.continuousUsage {
		dst = appendUsage(dst, p.promptTokens(), st+1)
	} else {
		dst = append(dst, "null"...)
	}
	if p.genPromptIDs && i == 0 && st == 0 {
		dst = appendIDs(append(dst, `,"prompt_token_ids":`...), p.prompts)
	}
	dst = strconv.AppendInt(append(dst, `,"output_mode":"tokens","choices":[{"index":`...), int64(i), 10)
	if final {
		finish := c.finish
		if finish == "tool_calls" {
			finish = "stop" // the engine's reason: chat serving, not generate, says tool_calls
		}
		dst = append(append(append(dst, `,"finish_reason":"`...), finish...), `","stop_reason":`...)
		dst = appendStopReason(dst, c)
	} else {
		dst = append(dst, `,"finish_reason":null,"stop_reason":null`...)
	}
	dst = appendIDs(append(dst, `,"token_ids":`...), c.ids[st:st+1])
	dst = append(dst, `,"routed_experts":null,"sampling_mask":null,"weight_versions":`...)
	if final {
		dst = appendWeightVersions(dst, len(c.ids))
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"logprobs":`...)
	if p.logprobs {
		dst = p.appendGenLogprobs(dst, c, st, st+1)
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, "}]}"...)
}

// appendWeightVersions appends the weight-version spans of a finished
// choice of n tokens: vLLM labels the output tokens [start, end) with the
// version of the weights that sampled them, on the finished output only
// (vllm/outputs.py WeightVersionSpan, v1/engine/output_processor.py
// _weight_version_spans). The mock's weights never change: one span, "0".
func appendWeightVersions(dst []byte, n int) []byte {
	dst = append(dst, `[{"version":"0","start":0,"end":`...)
	dst = strconv.AppendInt(dst, int64(n), 10)
	return append(dst, "}]"...)
}

// appendGenerateUsageChunk appends the last chunk of a streamed generate
// with include_usage: no choices, the usage.
func (p *plan) appendGenerateUsageChunk(dst []byte) []byte {
	dst = append(dst, `{"request_id":"chatcmpl-`...)
	dst = append(dst, p.id[:]...)
	dst = append(dst, `","usage":`...)
	dst = p.appendUsageOf(dst)
	return append(dst, `,"output_mode":"tokens","choices":[]}`...)
}

// derenderState is the mock's reading of a DerenderStreamState (the
// members the parsed path uses).
type derenderState struct {
	roleSent, toolsStreamed bool
	ids                     []uint32
	chunkLens               []int64
	callIDs                 []string
}

// appendDerenderStream answers one streaming derender call.
func (s *Server) appendDerenderStream(dst []byte, root gjson.Result) ([]byte, string) {
	gen := root.Get("generate_chunk")
	if !gen.IsObject() {
		return dst, "generate_chunk: Field required (a GenerateTokensStreamResponse object)"
	}
	req := root.Get("chat_request")
	if !req.IsObject() {
		return dst, "chat_request is required when a tool or reasoning parser is configured because plain detokenization would leak raw parser markup into content."
	}
	promptIDs := root.Get("prompt_token_ids")
	if _, ok := tokenIDList(nil, promptIDs, s.v.size()); !ok {
		return dst, "prompt_token_ids is required when a tool or reasoning parser is configured. Without it parse_delta cannot tell whether the prompt left reasoning open (e.g. a chat template that pre-opens <think>) and would misclassify reasoning content as plain content."
	}
	choices := gen.Get("choices")
	if !choices.IsArray() {
		return dst, "generate_chunk.choices: Field required (a list)"
	}
	if n := len(choices.Array()); n > 1 {
		return dst, "derender_chat_stream expects at most one choice per chunk (got " + strconv.Itoa(n) + ")."
	}
	var st derenderState
	if msg := readDerenderState(&st, root.Get("stream_state"), s.v.size()); msg != "" {
		return dst, msg
	}
	model := root.Get("model")
	if model.Type != gjson.String {
		model = gjson.Result{Type: gjson.String, Str: s.cfg.Model}
	}
	tc := req.Get("tool_choice")
	parseTools := req.Get("tools").IsArray() && !(tc.Type == gjson.String && tc.Str == "none")
	returnIDs := req.Get("return_token_ids").Type == gjson.True && req.Get("include_reasoning").Type != gjson.False
	think := thinkingOn(req.Get("chat_template_kwargs"))

	dst = append(dst, `{"chunk":{"id":`...)
	dst = appendJSONString(dst, gen.Get("request_id").String())
	dst = append(dst, `,"object":"chat.completion.chunk","created":`...)
	dst = strconv.AppendInt(dst, s.cfg.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, model.Str)
	dst = append(dst, `,"choices":[`...)
	if ch := choices.Get("0"); ch.Exists() {
		delta, ok := tokenIDList(nil, ch.Get("token_ids"), s.v.size())
		if !ok && ch.Get("token_ids").Type != gjson.Null {
			return dst, "generate_chunk.choices.0.token_ids: Input should be a list of token ids, each at least 0 and below the vocabulary size " + strconv.Itoa(s.v.size())
		}
		dst = strconv.AppendInt(append(dst, `{"index":`...), ch.Get("index").Int(), 10)
		dst = append(dst, `,"delta":{"role":`...)
		if st.roleSent {
			dst = append(dst, "null"...)
		} else {
			dst = append(dst, `"assistant"`...)
			st.roleSent = true
		}
		if s.v.real != nil {
			was := s.v.real.parse(string(s.v.decodeText(nil, st.ids)), think, parseTools, false)
			now := s.v.real.parse(string(s.v.decodeText(s.v.decodeText(nil, st.ids), delta)), think, parseTools, false)
			dst = append(dst, ',')
			dst, _ = appendParsedDelta(dst, &was, &now, true, st.callID)
			if len(now.calls) > 0 {
				st.toolsStreamed = true
			}
		} else {
			dst = st.appendParsedDelta(dst, s.v, delta, parseTools)
		}
		finish := ch.Get("finish_reason")
		dst = append(dst, `},"logprobs":null,"finish_reason":`...)
		if finish.Type == gjson.String && st.toolsStreamed && !tc.IsObject() { // any finish reason, as vLLM's derender
			dst = append(dst, `"tool_calls"`...)
		} else {
			dst = appendJSONOrNull(dst, finish)
		}
		dst = appendJSONOrNull(append(dst, `,"stop_reason":`...), ch.Get("stop_reason"))
		dst = append(dst, `,"token_ids":`...)
		if returnIDs && ok {
			dst = appendIDs(dst, delta)
		} else {
			dst = append(dst, "null"...)
		}
		dst = append(dst, '}')
		if len(delta) > 0 {
			st.ids = append(st.ids, delta...)
			st.chunkLens = append(st.chunkLens, int64(len(delta)))
		}
	}
	dst = append(dst, `],"usage":`...)
	if u := gen.Get("usage"); u.IsObject() {
		pt := int(u.Get("prompt_tokens").Int())
		if v := root.Get("prompt_tokens"); v.Type == gjson.Number {
			pt = int(v.Int())
		}
		// UsageInfo written whole (model_dump): the details are null.
		dst = appendUsage(dst, pt, int(u.Get("completion_tokens").Int()))
		dst = append(dst[:len(dst)-1], `,"prompt_tokens_details":null,"completion_tokens_details":null}`...)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"system_fingerprint":null,"prompt_token_ids":null,"prompt_text":null,"metrics":null},"stream_state":`...)
	return append(st.append(dst), '}'), ""
}

// readDerenderState reads a stream_state (null: the first call).
func readDerenderState(st *derenderState, v gjson.Result, size int) string {
	if !v.Exists() || v.Type == gjson.Null {
		return ""
	}
	if !v.IsObject() {
		return "stream_state: Input should be a valid dictionary or object to extract fields from"
	}
	var ok bool
	if st.ids, ok = tokenIDList(nil, v.Get("output_token_ids"), size); !ok && v.Get("output_token_ids").Exists() {
		return "stream_state.output_token_ids: Input should be a list of token ids"
	}
	sum := int64(0)
	for _, n := range v.Get("output_chunk_lens").Array() {
		if n.Type != gjson.Number || n.Int() <= 0 {
			return "stream_state.output_chunk_lens: each length should be greater than 0"
		}
		st.chunkLens = append(st.chunkLens, n.Int())
		sum += n.Int()
	}
	if sum != int64(len(st.ids)) {
		return "stream_state: output_chunk_lens must sum to len(output_token_ids) (got sum=" + strconv.FormatInt(sum, 10) + ", len(output_token_ids)=" + strconv.Itoa(len(st.ids)) + ")"
	}
	st.roleSent = v.Get("role_sent").Type == gjson.True
	st.toolsStreamed = v.Get("tools_streamed").Type == gjson.True
	for _, id := range v.Get("last_tool_call_ids").Array() {
		st.callIDs = append(st.callIDs, id.String())
	}
	return ""
}

// append appends the DerenderStreamState (protocol.py, declaration order).
func (st *derenderState) append(dst []byte) []byte {
	dst = append(dst, `{"prev_tokens":[],"prefix_offset":0,"read_offset":0,"role_sent":`...)
	dst = strconv.AppendBool(dst, st.roleSent)
	dst = append(dst, `,"logprob_context_token_ids":[],"logprob_text_offset":0,"output_token_ids":`...)
	dst = appendIDs(dst, st.ids)
	dst = append(dst, `,"output_chunk_lens":[`...)
	for i, n := range st.chunkLens {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, n, 10)
	}
	dst = append(dst, `],"tools_streamed":`...)
	dst = strconv.AppendBool(dst, st.toolsStreamed)
	dst = append(dst, `,"last_tool_call_ids":[`...)
	for i, id := range st.callIDs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, id)
	}
	return append(dst, "]}"...)
}

// appendParsedDelta appends a DeltaMessage's members after role for the
// chunk's ids delta, given the output so far in st.ids: the text as
// content, or (parseTools, an output that opens with <tool_call>) the
// hermes parser's tool-call delta.
func (st *derenderState) appendParsedDelta(dst []byte, v *vocabulary, delta []uint32, parseTools bool) []byte {
	var before, now strings.Builder
	for _, id := range st.ids {
		before.WriteString(v.text(id))
	}
	now.WriteString(before.String())
	for _, id := range delta {
		now.WriteString(v.text(id))
	}
	text, from := now.String(), before.Len()
	if !parseTools || !strings.HasPrefix(text, "<tool_call>") {
		dst = append(dst, `,"content":`...)
		if from == len(text) {
			dst = append(dst, "null"...)
		} else {
			dst = appendJSONString(dst, text[from:])
		}
		return append(dst, `,"reasoning":null`...)
	}
	const head = `<tool_call>{"name":`
	nameEnd := -1
	if strings.HasPrefix(text, head) {
		if n := jsonValueLen(text[len(head):]); n > 0 && text[len(head)] == '"' {
			nameEnd = len(head) + n
		}
	}
	sendName := nameEnd > from && nameEnd <= len(text)
	args := ""
	if argsStart := nameEnd + len(`,"arguments":`); nameEnd > 0 && strings.HasPrefix(text[nameEnd:], `,"arguments":`) && argsStart < len(text) {
		argsEnd := len(text)
		if n := jsonValueLen(text[argsStart:]); n > 0 {
			argsEnd = argsStart + n
		}
		if lo, hi := max(argsStart, from), min(argsEnd, len(text)); hi > lo {
			args = text[lo:hi]
		}
	}
	if !sendName && args == "" {
		return append(dst, `,"content":null,"reasoning":null`...)
	}
	dst = append(dst, `,"content":null,"reasoning":null,"tool_calls":[`...)
	if sendName {
		h := newHasher()
		h.ids(st.ids)
		h.ids(delta)
		v := h.sum()
		id := "chatcmpl-tool-" + string(appendHex(appendHex(nil, v), mix64(v)))
		if len(st.callIDs) > 0 {
			id = st.callIDs[0] // pinned (last_tool_call_ids)
		} else {
			st.callIDs = append(st.callIDs, id)
		}
		st.toolsStreamed = true
		dst = append(dst, `{"id":`...)
		dst = appendJSONString(dst, id)
		var name string
		_ = jsonUnquote(text[len(head):nameEnd], &name)
		dst = append(dst, `,"type":"function","index":0,"function":{"name":`...)
		dst = appendJSONString(dst, name)
		dst = append(dst, `,"arguments":null}}`...)
		if args != "" {
			dst = append(dst, ',')
		}
	}
	if args != "" {
		dst = append(dst, `{"id":null,"type":null,"index":0,"function":{"name":null,"arguments":`...)
		dst = appendJSONString(dst, args)
		dst = append(dst, "}}"...)
	}
	return append(dst, ']')
}

// jsonValueLen is the length of the complete JSON string, object or array
// s starts with, or 0 when it is not complete yet (or not one of those).
func jsonValueLen(s string) int {
	if s == "" || (s[0] != '"' && s[0] != '{' && s[0] != '[') {
		return 0
	}
	depth, inStr, esc := 0, false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
			if !inStr && depth == 0 {
				return i + 1
			}
		case inStr:
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return 0
}

// jsonUnquote reads a JSON string into dst.
func jsonUnquote(s string, dst *string) bool {
	v := gjson.Parse(s)
	if v.Type != gjson.String {
		return false
	}
	*dst = v.Str
	return true
}

// callID is the id of streamed tool call i: pinned in last_tool_call_ids
// once drawn (derived from the ids so far).
func (st *derenderState) callID(i int) string {
	for len(st.callIDs) <= i {
		st.callIDs = append(st.callIDs, callIDOf(st.ids, 0, len(st.callIDs)))
	}
	return st.callIDs[i]
}
