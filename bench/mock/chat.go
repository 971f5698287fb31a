package mock

import (
	"bufio"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Chat completions (POST /v1/chat/completions).
//
// Tools: when the request has tools, tool_choice is not "none" and the last message is a
// user message, every choice calls one tool (the first, or the one tool_choice names) with
// arguments that give every schema property a deterministic value, and finishes with
// "tool_calls" ("stop" for a named tool_choice in the vllm flavour, as vLLM 0.32.0). The
// generated ids are Encode(`<tool_call>{"name":"f","arguments":`) + Encode(arguments) +
// Encode(`}</tool_call>`); if max_tokens cuts them short the choice is plain text (their
// decoded prefix) with finish "length". Otherwise (e.g. the last message is a tool
// result) the answer is text.
//
// Streaming (vllm flavour, as vLLM 0.32.0 with the hermes tool parser): after TTFT, one
// role chunk per choice, then per step one output per token per choice (ITL between
// steps): a chunk with the text it adds, or the hermes parser's tool-call delta
// (hermes.go), or, when it adds nothing to send, an empty delta {} sent only with
// logprobs or return_token_ids; a choice's last token rides on its finish chunk; then the
// usage chunk if include_usage, then [DONE]. The sglang and llamacpp flavours stream a
// tool call as a header chunk (its ids: the prefix) and one chunk per argument token,
// and end each choice with a finish chunk of its own (their files).

func (s *Server) chat(ctx *fasthttp.RequestCtx, k *knobs) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, k)
	if msg := p.buildChat(&f); msg != "" {
		p.release()
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.prefill()
	switch s.cfg.Flavor {
	case FlavorSGLang:
		if f.stream && p.returnIDs {
			p.release()
			s.writeError(ctx, fasthttp.StatusBadRequest, sglangStreamIDsError)
			return
		}
		p.respond(ctx, f.stream, (*plan).appendSGLangChatFull, (*plan).streamSGLangChat)
	case FlavorLlamaCpp:
		if msg := p.llamaCppChatChecks(&f); msg != "" {
			p.release()
			s.writeError(ctx, fasthttp.StatusBadRequest, msg)
			return
		}
		p.respond(ctx, f.stream, (*plan).appendLlamaCppChatFull, (*plan).streamLlamaCppChat)
	default:
		p.respond(ctx, f.stream, (*plan).appendChatFull, (*plan).streamChat)
	}
}

func (p *plan) buildChat(f *fields) string {
	if f.err != "" {
		return f.err
	}
	if msg := p.commonChecks(f); msg != "" {
		return msg
	}
	p.readStops(f.stop)
	lastRole, msg := checkMessages(f)
	if msg != "" {
		return msg
	}
	if msg := p.readChatLogprobs(f); msg != "" {
		return msg
	}
	tool, useTool, msg := p.chooseTool(f, lastRole)
	if msg != "" {
		return msg
	}

	p.setModel(f)
	if p.text, msg = p.s.v.renderChat(p.text[:0], f); msg != "" {
		return msg
	}
	p.prompts = p.s.v.encode(p.prompts, b2s(p.text))
	p.endPrompt()
	limit := f.limit()
	if msg := p.checkContext(len(p.prompts), limit); msg != "" {
		return msg
	}
	p.returnIDs = p.wantIDs(f)
	p.asTokenIDs = p.wantTokenIDStrings(f)
	p.includeUsage = f.stream && f.includeUsage()
	p.continuousUsage = f.stream && f.continuousUsage()

	textSeed := p.seedAndID(f, limit)
	p.realThink, p.realTools = thinkingOn(f.kwargs), tool.Exists() && !(f.toolChoice.Type == gjson.String && f.toolChoice.Str == "none")
	p.genChatChoices(f.n, textSeed, limit, tool, useTool)
	return ""
}

// checkMessages validates messages (a non-empty list of objects with a
// string "role") and returns the last message's role.
func checkMessages(f *fields) (lastRole, msg string) {
	if !f.messages.Exists() || f.messages.Type == gjson.Null {
		return "", "messages: Field required"
	}
	if !f.messages.IsArray() {
		return "", "messages: Input should be a valid list"
	}
	count := 0
	f.messages.ForEach(func(_, m gjson.Result) bool {
		count++
		role := m.Get("role")
		if !m.IsObject() || role.Type != gjson.String {
			msg = "messages." + strconv.Itoa(count-1) + ": each message must be an object with a string \"role\""
			return false
		}
		lastRole = role.Str
		return true
	})
	if msg != "" {
		return "", msg
	}
	if count == 0 {
		return "", "messages: List should have at least 1 item after validation, not 0"
	}
	return lastRole, ""
}

// readChatLogprobs reads and checks logprobs and top_logprobs.
func (p *plan) readChatLogprobs(f *fields) string {
	if err := boolOf(f.logprobs, "logprobs", &p.logprobs); err != "" {
		return err
	}
	if f.topLogprobs == unset {
		return ""
	}
	switch {
	case f.topLogprobs < 0:
		return "`top_logprobs` must be a positive value."
	case f.topLogprobs > MaxLogprobs:
		return "Requested top logprobs of " + strconv.Itoa(f.topLogprobs) + ", which is greater than max allowed: " + strconv.Itoa(MaxLogprobs)
	case f.topLogprobs > 0 && !p.logprobs:
		return "when using `top_logprobs`, `logprobs` must be set to true."
	}
	p.topLogprobs = f.topLogprobs
	return ""
}

// chooseTool checks tools and tool_choice and picks the tool the choices
// call (the first, or the one tool_choice names): useTool when there is
// one, tool_choice is not "none" and the last message is the user's.
func (p *plan) chooseTool(f *fields, lastRole string) (tool gjson.Result, useTool bool, msg string) {
	if !f.tools.Exists() || f.tools.Type == gjson.Null {
		return tool, false, ""
	}
	if !f.tools.IsArray() {
		return tool, false, "tools: Input should be a valid list"
	}
	want := ""
	switch tc := f.toolChoice; {
	case tc.IsObject():
		want = tc.Get("function.name").String()
		if want == "" {
			return tool, false, "tool_choice: a named tool choice needs function.name"
		}
	case tc.Type == gjson.String && tc.Str != "none" && tc.Str != "auto" && tc.Str != "required":
		return tool, false, "tool_choice: Input should be 'none', 'auto', 'required' or a named tool"
	}
	f.tools.ForEach(func(_, t gjson.Result) bool {
		name := t.Get("function.name")
		if !t.IsObject() || name.Type != gjson.String || name.Str == "" {
			msg = "tools: each tool must be {\"type\":\"function\",\"function\":{\"name\":...}}"
			return false
		}
		if !tool.Exists() && (want == "" || name.Str == want) {
			tool = t
		}
		return true
	})
	if msg != "" {
		return tool, false, msg
	}
	if want != "" && !tool.Exists() {
		return tool, false, "Tool '" + want + "' has not been passed in `tools`."
	}
	useTool = tool.Exists() && !(f.toolChoice.Type == gjson.String && f.toolChoice.Str == "none") && lastRole == "user"
	p.namedTool = want != ""
	p.requiredTool = f.toolChoice.Type == gjson.String && f.toolChoice.Str == "required"
	return tool, useTool, ""
}

// genChatChoices generates the n choices: text, or a call of tool.
func (p *plan) genChatChoices(n int, textSeed uint64, limit int, tool gjson.Result, useTool bool) {
	var name string
	var params gjson.Result
	if useTool {
		name = tool.Get("function.name").Str
		params = tool.Get("function.parameters")
	}
	vllm := p.s.cfg.Flavor == FlavorVLLM
	for i := 0; i < n; i++ {
		c := p.addChoice()
		c.seed = mix64(textSeed + uint64(i)*0x9e3779b97f4a7c15)
		c.perToken = vllm
		if !useTool {
			p.genText(c, limit)
			continue
		}
		p.genToolCall(c, name, params, limit)
		if vllm && p.namedTool && c.finish == "tool_calls" {
			// vLLM: "tool_calls" for auto and required, "stop" for a named
			// choice (chat_completion/serving.py, 0.32.0).
			c.finish = "stop"
		}
		if vllm && p.s.v.real == nil {
			planHermes(c) // a call cut short streams what the parser made of it
		}
	}
}

// commonChecks validates n, stream_options and the output limit.
func (p *plan) commonChecks(f *fields) string {
	switch {
	case f.n < 1:
		return "n must be at least 1, got " + strconv.Itoa(f.n) + "."
	case f.n > MaxN:
		return "n must be at most " + strconv.Itoa(MaxN) + " on this mock, got " + strconv.Itoa(f.n) + "."
	case f.streamOptionsSet() && !f.stream && p.s.cfg.Flavor == FlavorVLLM:
		return "Stream options can only be defined when `stream=True`."
	case f.n > 1 && f.tempSet && f.temperature < 1e-5 && p.s.cfg.Flavor == FlavorVLLM:
		// SamplingParams._verify_greedy_sampling (vllm/sampling_params.py,
		// 0.32.0; _SAMPLING_EPS 1e-5): found by TestMockMatchesRealVLLM.
		return "n must be 1 when using greedy sampling, got " + strconv.Itoa(f.n) + "."
	}
	if l := f.limit(); l != unset && l < 1 {
		return "max_tokens must be at least 1, got " + strconv.Itoa(l) + "."
	}
	return ""
}

func boolOf(v gjson.Result, name string, dst *bool) string {
	var msg string
	boolField(v, name, dst, &msg)
	return msg
}

// appendCallID appends "chatcmpl-tool-<32 hex>".
func appendCallID(dst []byte, c *planChoice) []byte {
	dst = append(dst, `"chatcmpl-tool-`...)
	dst = appendHex(dst, c.callID)
	dst = appendHex(dst, mix64(c.callID))
	return append(dst, '"')
}

// appendChatLogprobs appends {"content":[...]} for c.ids[from:to], or null.
func (p *plan) appendChatLogprobs(dst []byte, c *planChoice, from, to int) []byte {
	if !p.logprobs || from >= to {
		return append(dst, "null"...)
	}
	dst = append(dst, `{"content":[`...)
	first := true
	for pos := from; pos < to; pos++ {
		if c.hiddenAt(pos) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		id := c.ids[pos]
		dst = p.appendLogprobEntry(dst, id, logprob(c.seed, pos, 0))
		dst = append(dst, `,"top_logprobs":[`...)
		for r := 0; r < p.topLogprobs; r++ {
			if r > 0 {
				dst = append(dst, ',')
			}
			t := id
			if r > 0 {
				t = altToken(id, r)
			}
			dst = p.appendLogprobEntry(dst, t, logprob(c.seed, pos, r))
			dst = append(dst, '}')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}

// appendLogprobEntry appends an unclosed chat logprob object for token id, with the keys
// in the flavour's order: vLLM {"token","logprob","bytes", SGLang {"token","bytes","logprob",
// llama.cpp {"id","token","bytes","logprob".
func (p *plan) appendLogprobEntry(dst []byte, id uint32, lp float64) []byte {
	fl := p.s.cfg.Flavor
	if fl == FlavorVLLM {
		dst = append(dst, `{"token":`...)
		dst = p.appendTokenString(dst, id)
		dst = append(dst, `,"logprob":`...)
		dst = appendFloat(dst, lp)
		dst = append(dst, `,"bytes":`...)
		return p.s.v.appendTokenBytes(dst, id)
	}
	dst = append(dst, '{')
	if fl == FlavorLlamaCpp {
		dst = append(dst, `"id":`...)
		dst = strconv.AppendUint(dst, uint64(id), 10)
		dst = append(dst, ',')
	}
	dst = append(dst, `"token":`...)
	if fl == FlavorLlamaCpp && id == TokenIMEnd {
		// A control token's piece is "" (common_token_to_piece without
		// special): the end-of-turn token's entry has no text, no bytes.
		return appendFloat(append(dst, `"","bytes":[],"logprob":`...), lp)
	}
	dst = p.appendTokenString(dst, id)
	dst = append(dst, `,"bytes":`...)
	if fl == FlavorLlamaCpp {
		dst = appendRawBytes(dst, vocab[id]) // llama.cpp sends the raw bytes
	} else {
		dst = p.s.v.appendTokenBytes(dst, id)
	}
	dst = append(dst, `,"logprob":`...)
	return appendFloat(dst, lp)
}

// appendChatFull appends a whole chat answer as vLLM 0.32.0 writes it: every
// member of ChatCompletionResponse, ChatCompletionResponseChoice and
// ChatMessage, null when unset, in their declaration order, except a message's
// tool_calls, left out when empty (chat_completion/protocol.py,
// ChatMessage._serialize). A tool call's content is "" under a named or
// "required" tool_choice (content or ""), and the hermes parser's text before
// the call, none here, under "auto" (chat_completion/serving.py,
// chat_completion_full_generator).
func (p *plan) appendChatFull(dst []byte) []byte {
	dst = p.appendPrefix(dst, "chatcmpl-", "chat.completion")
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"message":{"role":"assistant","content":`...)
		if p.s.v.real != nil {
			a := p.s.v.real.parse(c.answerText(len(c.ids)), p.realThink, p.realTools, true)
			dst = append(appendParsedMessage(dst, &a, p.namedTool || p.requiredTool, c.ids, int64(i)), '}')
		} else {
			dst = p.appendToyMessage(dst, c)
		}
		dst = append(dst, `,"logprobs":`...)
		dst = p.appendChatLogprobs(dst, c, 0, len(c.ids))
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, c.finish...)
		dst = append(dst, `","stop_reason":`...)
		dst = appendStopReason(dst, c)
		dst = append(dst, `,"token_ids":`...)
		dst = appendIDsOrNull(dst, c.ids, p.returnIDs)
		dst = append(dst, `,"routed_experts":null}`...)
	}
	dst = append(dst, `],"service_tier":null`...)
	dst = appendFingerprint(dst, p)
	dst = append(dst, `,"usage":`...)
	dst = p.appendWholeUsage(dst)
	dst = append(dst, `,"prompt_logprobs":null,"prompt_token_ids":`...)
	dst = appendIDsOrNull(dst, p.prompts, p.returnIDs)
	return append(dst, `,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`...)
}

// appendToolMessage appends the toy answer's message members from
// content's value on: its text, or its tool call.
func (p *plan) appendToyMessage(dst []byte, c *planChoice) []byte {
	switch {
	case c.tool && (p.namedTool || p.requiredTool):
		dst = append(dst, `""`...)
	case c.tool:
		dst = append(dst, "null"...)
	default:
		dst = append(dst, '"')
		dst = appendChoiceText(dst, c)
		dst = append(dst, '"')
	}
	dst = append(dst, `,"refusal":null,"annotations":null,"audio":null,"function_call":null`...)
	if c.tool {
		dst = append(dst, `,"tool_calls":[{"id":`...)
		dst = appendCallID(dst, c)
		dst = append(dst, `,"type":"function","function":{"name":`...)
		dst = appendJSONString(dst, b2s(c.name))
		dst = append(dst, `,"arguments":`...)
		// The parser's json.dumps(arguments): a string of ", "/": " JSON.
		n := len(dst)
		dst = appendPyJSON(dst, c.args)
		dst = append(dst[:n], appendJSONString(p.text[:0], b2s(dst[n:]))...)
		dst = append(dst, "}}]"...)
	}
	return append(dst, `,"reasoning":null}`...)
}

// appendWholeUsage appends the usage of a whole vLLM answer: UsageInfo with
// every member, null when unset (vllm/entrypoints/serve/engine/protocol.py,
// 0.32.0). Stream usage chunks leave the nulls out (exclude_none).
func (p *plan) appendWholeUsage(dst []byte) []byte {
	dst = p.appendUsageOf(dst)
	dst = dst[:len(dst)-1]
	if p.cached == 0 {
		dst = append(dst, `,"prompt_tokens_details":null`...)
	}
	return append(dst, `,"completion_tokens_details":null}`...)
}

// appendChunkUsage appends the usage member of a chunk when the request asked
// for continuous_usage_stats: the prompt and the choice's tokens so far, with
// "completion_tokens_details": null on chat chunks, which pass it explicitly
// (chat_completion/serving.py and completion/serving.py, 0.32.0).
func (p *plan) appendChunkUsage(dst []byte, completion int, chat bool) []byte {
	if !p.continuousUsage {
		return dst
	}
	dst = append(dst, `,"usage":`...)
	dst = appendUsage(dst, p.promptTokens(), completion)
	if chat {
		dst = append(dst[:len(dst)-1], `,"completion_tokens_details":null}`...)
	}
	return dst
}

// streamChat writes the SSE stream of a chat completion.
func (p *plan) streamChat(w *bufio.Writer) { p.streamWith(w, &vllmChatWire) }

var vllmChatWire = perTokenWire((*plan).appendChatRole, (*plan).appendChatStep, (*plan).appendChatUsageChunk)

// appendChatRole appends the first chunk of choice i (the very first carries
// prompt_token_ids when asked).
func (p *plan) appendChatRole(dst []byte, i int) []byte {
	dst = p.appendPrefix(dst, "chatcmpl-", "chat.completion.chunk")
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	dst = p.appendChunkUsage(dst, 0, true)
	// vLLM passes prompt_token_ids (None when not asked) and prompt_text
	// explicitly on every role chunk, so both keys are always there
	// (chat_completion/serving.py, 0.32.0; TestMockMatchesRealVLLM).
	dst = append(dst, `,"prompt_token_ids":`...)
	dst = appendIDsOrNull(dst, p.prompts, p.returnIDs)
	return append(dst, `,"prompt_text":null}`...)
}

// appendChatUsageChunk appends the final usage chunk.
func (p *plan) appendChatUsageChunk(dst []byte) []byte {
	dst = p.appendPrefix(dst, "chatcmpl-", "chat.completion.chunk")
	dst = append(dst, `],"usage":`...)
	dst = p.appendUsageOf(dst)
	dst = appendFingerprint(dst, p)
	return append(dst, '}')
}

var doneEvent = []byte("[DONE]")

// appendChatStep appends the chunk vLLM sends for the token c.ids[st]: the
// text it adds ({"content":…}), or the hermes parser's tool-call delta
// (hermes.go), or an empty delta {} when the token adds nothing to send (an
// end-of-turn token, text held back for a stop string, a tool call's
// markup). vLLM (serving with a tool parser, as the mock imitates) sends such
// an empty chunk only when the client asked for logprobs or return_token_ids,
// or when it finishes the choice; otherwise the step sends nothing
// (chat_completion/serving.py, the `delta_message is None` branch, 0.32.0).
func (p *plan) appendChatStep(dst []byte, i int, c *planChoice, st int, final bool) []byte {
	start := len(dst)
	dst = p.appendPrefix(dst, "chatcmpl-", "chat.completion.chunk")
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"delta":`...)
	empty := false
	switch t := c.stepTextOf(st); {
	case c.v.real != nil:
		was := c.v.real.parse(c.answerText(st), p.realThink, p.realTools, false)
		now := c.v.real.parse(c.answerText(st+1), p.realThink, p.realTools, false)
		dst = append(dst, '{')
		dst, empty = appendParsedDelta(dst, &was, &now, false, func(k int) string { return callIDOf(c.ids, int64(i), k) })
		dst = append(dst, '}')
	case c.hermes:
		dst, empty = appendHermesDelta(dst, c, st)
	case t == "":
		dst, empty = append(dst, "{}"...), true
	default:
		dst = append(dst, `{"content":"`...)
		dst = appendJSONStringBody(dst, t)
		dst = append(dst, `"}`...)
	}
	if empty && !final && !p.logprobs && !p.returnIDs {
		return dst[:start]
	}
	dst = append(dst, `,"logprobs":`...)
	dst = p.appendChatLogprobs(dst, c, st, st+1)
	dst = appendFinishReason(dst, c, final, false)
	return p.appendStepTail(dst, c, st, final, true)
}

// perTokenWire is a vLLM stream format built from step, which appends the
// chunk of one token (final: the choice's last, with the finish reason):
// each token makes one output and the last one rides on the finish chunk
// (chat_completion/serving.py, completion/serving.py, vLLM 0.32.0).
func perTokenWire(role func(*plan, []byte, int) []byte, step func(p *plan, dst []byte, i int, c *planChoice, st int, final bool) []byte, usage func(*plan, []byte) []byte) wire {
	return wire{
		role: role,
		chunk: func(p *plan, dst []byte, i int, c *planChoice, st int) []byte {
			if st == c.steps()-1 {
				return dst // the finish chunk sends it
			}
			return step(p, dst, i, c, st, false)
		},
		finish: func(p *plan, dst []byte, i int, c *planChoice) []byte {
			return step(p, dst, i, c, c.steps()-1, true)
		},
		usage: usage,
	}
}

// appendFinishReason appends a vLLM chunk's finish_reason and, on the final
// chunk (or always, nullStop: completions), its stop_reason.
func appendFinishReason(dst []byte, c *planChoice, final, nullStop bool) []byte {
	switch {
	case final:
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, c.finish...)
		dst = append(dst, `","stop_reason":`...)
		return appendStopReason(dst, c)
	case nullStop:
		return append(dst, `,"finish_reason":null,"stop_reason":null`...)
	}
	return append(dst, `,"finish_reason":null`...)
}

// appendStepTail closes the chunk of token c.ids[st]: its token_ids, the
// usage of continuous usage stats, and on the final chunk the fingerprint
// when no usage chunk follows. vLLM passes token_ids explicitly (None when
// not asked): the key is always there. --drop-ids-every imitates versions
// before PR #29074, which sent no ids on a swallowed chunk.
func (p *plan) appendStepTail(dst []byte, c *planChoice, st int, final, chat bool) []byte {
	dst = append(dst, `,"token_ids":`...)
	dst = appendIDsOrNull(dst, c.ids[st:st+1], p.returnIDs && !p.dropIDs(st+1))
	dst = append(dst, "}]"...)
	dst = p.appendChunkUsage(dst, st+1, chat)
	if final && !p.includeUsage {
		dst = appendFingerprint(dst, p)
	}
	return append(dst, '}')
}

// appendFingerprint appends the system_fingerprint member vLLM stamps on a
// stream's last message: each choice's finish chunk, or, when the request
// asked for include_usage, the usage chunk instead
// (chat_completion/serving.py and completion/serving.py, 0.32.0; whole
// answers carry it too). The real value hashes the engine's configuration;
// the mock's names its version.
func appendFingerprint(dst []byte, p *plan) []byte {
	dst = append(dst, `,"system_fingerprint":"vllm-`...)
	dst = append(dst, p.s.cfg.Version...)
	return append(dst, `-mock"`...)
}

// seedAndID hashes the model, the prompt text (p.text) and the request's
// seed and temperature into the seed its choices are drawn from (the same
// prompt text samples the same answer on the chat and token-in paths), and
// sets the answer's id from that and n, the limit and the prefix cache.
func (p *plan) seedAndID(f *fields, limit int) uint64 {
	h := newHasher()
	h.str(b2s(p.model))
	h.str(b2s(p.text))
	f.seedHash(&h, p.s.cfg.Seed)
	textSeed := h.sum()
	h.u64(uint64(f.n))
	h.u64(uint64(limit))
	h.u64(uint64(p.k.tokens))
	p.setID(h)
	return textSeed
}
