package mock

import (
	"math"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// vLLM 0.32's token-in ("scale-out") endpoints, vLLM flavour only, served
// when Config.ScaleOut is set (flag --enable-scale-out, as vLLM's); without
// it they answer 403 PermissionDeniedError as vLLM does
// (vllm/entrypoints/scale_out/factories.py, register_scale_out_api_routers).
//
//   - POST /v1/chat/completions/render (scale_out/render/api_router.py,
//     render/serving.py render_chat_request): a chat request in, vLLM's
//     GenerateRequest out (token_ids from the mock's template and tokenizer,
//     the same ids the chat path reports as prompt_token_ids, and the
//     resolved sampling_params: max_tokens, temperature, seed, n, stop,
//     logprobs), validated as the chat path validates.
//   - POST /inference/v1/generate (token_in_token_out/api_router.py,
//     protocol.py GenerateRequest / GenerateTokensResponse): token_ids and
//     sampling_params in; choices[].token_ids (the end-of-turn token
//     included when Config.EndOfTurn), finish_reason, stop_reason and
//     logprobs keyed by token id out; streamed with stream: true
//     (tokenin_stream.go).
//   - POST /v1/chat/completions/derender (derender/api_router.py,
//     derender/serving.py derender_chat_response,
//     renderers/online_derenderer.py _derender_chat): a DerenderChatRequest
//     in, a ChatCompletionResponse out; with tools in chat_request the text
//     is parsed as vLLM's hermes tool parser does (<tool_call>JSON</tool_call>;
//     content is the text before the first call, null when empty, "" for
//     required or named tool choices).
//
// Same answer both ways: generate seeds its choices as the chat path does,
// from the model, the prompt's text (Decode(token_ids); the toy tokenizer
// decodes every id sequence to the text it was encoded from) and the
// sampling parameters, so a prompt whose ids decode to the chat path's
// rendered prompt samples the same ids, text and logprobs. A real model
// decides from the prompt whether to call a tool; the mock's chat path
// decides from the request (tools, tool_choice, the last message's role),
// so render records that decision in sampling_params.extra_args (vLLM's
// SamplingParams field for plugins) as {"mock_tool_call":{"name","parameters"}}
// and generate follows it. Two deviations keep the chat path's answers:
// sampling_params.temperature is present exactly when the chat request set
// it (vLLM omits a temperature of 1.0), and derender keeps tool-call
// arguments as generated (vLLM's hermes parser re-serialises them with
// json.dumps; the mock's chat path returns them as generated).

// Token-in routes (vLLM flavour, Config.ScaleOut).
const (
	PathRender   = "/v1/chat/completions/render"
	PathGenerate = "/inference/v1/generate"
	PathDerender = "/v1/chat/completions/derender"
)

// scaleOutDisabled is vLLM's message when --enable-scale-out is off (factories.py).
const scaleOutDisabled = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."

// knownRoles are the roles the toy template renders; render refuses others
// (as a real model's template does: Qwen's raises on an unknown role), so a
// history it cannot render is a 400 there. The chat path renders any role.
var knownRoles = []string{"system", "developer", "user", "assistant", "tool"}

// scaleOut serves the token-in routes.
func (s *Server) scaleOut(ctx *fasthttp.RequestCtx, path string, k *knobs) {
	if s.cfg.Flavor != FlavorVLLM {
		s.writeError(ctx, fasthttp.StatusNotFound, "Not Found")
		return
	}
	if !s.cfg.ScaleOut {
		ctx.Response.ResetBody()
		ctx.SetStatusCode(fasthttp.StatusForbidden)
		ctx.SetContentType("application/json")
		body := append([]byte(`{"error":{"message":`), appendJSONString(nil, scaleOutDisabled)...)
		ctx.Response.SetBodyRaw(append(body, `,"type":"PermissionDeniedError","param":null,"code":403}}`...))
		return
	}
	if !s.method(ctx, fasthttp.MethodPost) {
		return
	}
	switch path {
	case PathRender:
		s.render(ctx, k)
	case PathGenerate:
		s.generate(ctx, k)
	case PathAbortRequests:
		s.abortRequests(ctx)
	default:
		s.derender(ctx)
	}
}

// render answers a chat request with the GenerateRequest vLLM's render
// builds (render/serving.py render_chat_request).
// defaultSamplingMaxTokens is vLLM's SamplingParams.max_tokens default.
const defaultSamplingMaxTokens = 16

func (s *Server) render(ctx *fasthttp.RequestCtx, k *knobs) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, k)
	defer p.release()
	msg := p.buildChat(&f)
	if msg == "" {
		f.messages.ForEach(func(i, m gjson.Result) bool {
			if r := m.Get("role").Str; !containsStr(knownRoles, r) {
				msg = "messages." + i.String() + ".role: the chat template cannot render role " + strconv.Quote(r) + " (known: " + strings.Join(knownRoles, ", ") + ")"
				return false
			}
			return true
		})
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	limit := f.limit()
	if limit == unset { // get_max_tokens (vllm/entrypoints/serve/utils/api_utils.py): what the context leaves
		limit = s.cfg.MaxModelLen - len(p.prompts)
	}
	b := append(p.buf[:0], `{"request_id":"chatcmpl-`...)
	b = append(b, p.id[:]...)
	b = append(b, `","token_ids":`...)
	b = appendIDs(b, p.prompts)
	b = append(b, `,"token_offsets":null,"features":null,"content_parts":null,"sampling_params":{`...)
	if f.n != 1 {
		b = strconv.AppendInt(append(b, `"n":`...), int64(f.n), 10)
		b = append(b, ',')
	}
	if f.tempSet {
		b = appendFloat(append(b, `"temperature":`...), f.temperature)
		b = append(b, ',')
	}
	if f.seedSet {
		b = strconv.AppendInt(append(b, `"seed":`...), f.seed, 10)
		b = append(b, ',')
	}
	b = append(b, `"stop":[`...)
	for i, st := range p.stops {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, st)
	}
	b = append(b, `],"stop_token_ids":[]`...)
	// vLLM 0.32's SamplingParams is a msgspec Struct with omit_defaults=True
	// (vllm/sampling_params.py), so a max_tokens equal to its default, 16,
	// is left out of render's answer; generate then applies its own
	// default, what the context leaves (token_in_token_out/serving.py,
	// is_sampling_param_provided). The mock omits it too.
	if limit != defaultSamplingMaxTokens {
		b = strconv.AppendInt(append(b, `,"max_tokens":`...), int64(limit), 10)
	}
	if p.logprobs {
		b = strconv.AppendInt(append(b, `,"logprobs":`...), int64(p.topLogprobs), 10)
	}
	b = append(b, `,"bad_words":[],"skip_reading_prefix_cache":false`...)
	if len(p.choices) > 0 && len(p.choices[0].name) > 0 {
		name := b2s(p.choices[0].name)
		var params gjson.Result
		f.tools.ForEach(func(_, t gjson.Result) bool {
			if t.Get("function.name").Str == name {
				params = t.Get("function.parameters")
				return false
			}
			return true
		})
		b = append(b, `,"extra_args":{"mock_tool_call":{"name":`...)
		b = appendJSONString(b, name)
		b = append(b, `,"parameters":`...)
		if params.Exists() {
			b = appendCompactJSON(b, params.Raw)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, "}}"...)
	}
	b = append(b, `},"model":`...)
	if f.model == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, f.model)
	}
	// stream and stream_options as the chat request's (render/serving.py:
	// stream_options only when streamed).
	b = append(b, `,"reasoning_ended":null,"reasoning_parser_kwargs":null,"return_token_ids":null,"output_mode":"tokens","stream":`...)
	b = strconv.AppendBool(b, f.stream)
	b = append(b, `,"stream_options":`...)
	if f.stream && f.streamOptions.IsObject() {
		b = appendCompactJSON(b, f.streamOptions.Raw)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"cache_salt":null,"priority":0,"kv_transfer_params":null,"ec_transfer_params":null}`...)
	p.buf = b
	writeJSON(ctx, b)
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// generate samples from token ids (token_in_token_out/serving.py
// serve_tokens; the answer is a GenerateTokensResponse).
func (s *Server) generate(ctx *fasthttp.RequestCtx, k *knobs) {
	s.mu.Lock()
	ctx.Request.Header.CopyTo(&s.genHdr)
	s.mu.Unlock()
	p := acquirePlan(s, k)
	if msg := p.buildGenerate(ctx.PostBody()); msg != "" {
		p.release()
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.prefill()
	p.abort, p.unabort = s.aborts.register(generateID(ctx, ctx.PostBody(), p.id[:]))
	p.respond(ctx, p.stream, (*plan).appendGenerateFull, streamGenerate)
}

// buildGenerate reads a GenerateRequest into p and samples its choices as
// buildChat would for the prompt text the ids decode to.
func (p *plan) buildGenerate(body []byte) string {
	if jsonscan.Validate(body) != nil {
		return "JSON decode error: the request body is not valid JSON (or nested more than 512 levels deep)"
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return "Input should be a valid dictionary or object to extract fields from"
	}
	var ok bool
	if p.prompts, ok = tokenIDList(p.prompts, root.Get("token_ids"), p.s.v.size()); !ok {
		return "token_ids: Input should be a list of token ids, each at least 0 and below the vocabulary size " + strconv.Itoa(p.s.v.size())
	}
	if len(p.prompts) == 0 {
		return "token_ids: List should have at least 1 item after validation, not 0"
	}
	p.endPrompt()
	f := fields{n: 1, maxTokens: unset, maxCompletion: unset, maxOutput: unset, topLogprobs: unset}
	if st := root.Get("stream"); st.Type == gjson.True {
		f.stream = true
	} else if st.Exists() && st.Type != gjson.Null && st.Type != gjson.False {
		return "stream: Input should be a valid boolean"
	}
	if so := root.Get("stream_options"); so.Exists() && so.Type != gjson.Null {
		if !so.IsObject() {
			return "stream_options: Input should be a valid dictionary or object to extract fields from"
		}
		f.streamOptions = so
	}
	if om := root.Get("output_mode"); om.Exists() && om.Type != gjson.Null && om.Str != "tokens" {
		return "output_mode: the mock's generate answers output_mode \"tokens\" only"
	}
	sp := root.Get("sampling_params")
	if !sp.IsObject() {
		return "sampling_params: Field required (an object)"
	}
	// The chat fields these sampling parameters resolve (ChatCompletionRequest.to_sampling_params).
	if m := root.Get("model"); m.Type == gjson.String {
		f.model = m.Str
	} else if m.Exists() && m.Type != gjson.Null {
		return "model: Input should be a valid string"
	}
	sp.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "n":
			intField(v, "sampling_params.n", &f.n, &f.err)
		case "max_tokens":
			intField(v, "sampling_params.max_tokens", &f.maxTokens, &f.err)
		case "logprobs":
			if v.Type != gjson.Null {
				intField(v, "sampling_params.logprobs", &f.topLogprobs, &f.err)
				p.logprobs = true
			}
		case "stop":
			f.stop = v
		case "seed":
			if v.Type == gjson.Number && v.Num == math.Trunc(v.Num) {
				f.seed, f.seedSet = v.Int(), true
			} else if v.Type != gjson.Null {
				f.err = "sampling_params.seed: Input should be a valid integer"
			}
		case "temperature":
			if v.Type == gjson.Number {
				f.temperature, f.tempSet = v.Num, true
			} else if v.Type != gjson.Null {
				f.err = "sampling_params.temperature: Input should be a valid number"
			}
		}
		return f.err == ""
	})
	if f.err != "" {
		return f.err
	}
	if msg := p.commonChecks(&f); msg != "" {
		return msg
	}
	if f.topLogprobs > MaxLogprobs {
		return "sampling_params.logprobs: requested " + strconv.Itoa(f.topLogprobs) + " logprobs, more than the maximum " + strconv.Itoa(MaxLogprobs)
	}
	p.topLogprobs = max(f.topLogprobs, 0)
	p.readStops(f.stop)
	limit := f.limit()
	if msg := p.checkContext(len(p.prompts), limit); msg != "" {
		return msg
	}
	p.setModel(&f)
	p.returnIDs = true
	p.stream = f.stream
	p.includeUsage = f.stream && f.includeUsage()
	p.continuousUsage = f.stream && f.continuousUsage()
	p.genPromptIDs = root.Get("return_token_ids").Type == gjson.True

	p.text = p.s.v.decode(p.text[:0], p.prompts)
	textSeed := p.seedAndID(&f, limit)

	tool := sp.Get("extra_args.mock_tool_call")
	name := tool.Get("name")
	for i := 0; i < f.n; i++ {
		c := p.addChoice()
		c.seed = mix64(textSeed + uint64(i)*0x9e3779b97f4a7c15)
		c.perToken = p.stream // one chunk per sampled id (serve_tokens_stream_generator)
		if name.Type != gjson.String || name.Str == "" {
			p.genText(c, limit)
			continue
		}
		p.genToolCall(c, name.Str, tool.Get("parameters"), limit)
	}
	return ""
}

// genToolCall fills c with the tool call buildChat generates: ids of
// `<tool_call>{"name":NAME,"arguments":` + arguments + `}</tool_call>`, cut
// to plain text by the output limit.
func (p *plan) genToolCall(c *planChoice, name string, params gjson.Result, limit int) {
	if p.s.v.real != nil {
		p.genReal(c, name, params, limit)
		return
	}
	r := rng(c.seed)
	c.tool = true
	c.name = append(c.name, name...)
	c.callID = r.next()
	c.args = appendToolArgs(c.args, params, &r, 0)
	p.text = append(p.text[:0], `<tool_call>{"name":`...)
	p.text = appendJSONString(p.text, name)
	p.text = append(p.text, `,"arguments":`...)
	c.ids = appendEncode(c.ids, b2s(p.text))
	c.nPrefix = len(c.ids)
	c.ids = appendEncode(c.ids, b2s(c.args))
	n := len(c.ids)
	c.ids = appendEncode(c.ids, "}</tool_call>")
	c.nSuffix = len(c.ids) - n
	c.finish = "tool_calls"
	if limit != unset && limit < len(c.ids) {
		c.ids = c.ids[:limit]
		c.tool = false
		c.finish = "length"
	}
	p.endTurn(c, limit)
}

// appendGenerateFull appends the GenerateTokensResponse (protocol.py): the
// engine's finish reason ("stop" for a tool call too: vLLM's chat serving,
// not the engine, reports "tool_calls"), stop_reason (the stop string, or
// null), every sampled id, and logprobs by token id with the sampled token
// first in top_logprobs.
func (p *plan) appendGenerateFull(dst []byte) []byte {
	dst = append(dst, `{"request_id":"chatcmpl-`...)
	dst = append(dst, p.id[:]...)
	dst = append(dst, `","model":`...)
	dst = appendJSONString(dst, b2s(p.model))
	dst = append(dst, `,"created":`...)
	dst = strconv.AppendInt(dst, p.s.cfg.Created, 10)
	dst = append(dst, `,"usage":`...)
	dst = p.appendUsageOf(dst)
	dst = append(dst, `,"prompt_logprobs":null,"prompt_token_id_logprobs":null,"prompt_token_ids":null,"mm_placeholders":null,"metrics":null,"kv_transfer_params":null,"ec_transfer_params":null,"output_mode":"tokens","choices":[`...)
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		finish := c.finish
		if finish == "tool_calls" {
			finish = "stop"
		}
		dst = strconv.AppendInt(append(dst, `{"index":`...), int64(i), 10)
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, finish...)
		dst = append(dst, `","stop_reason":`...)
		dst = appendStopReason(dst, c)
		dst = append(dst, `,"token_ids":`...)
		dst = appendIDs(dst, c.ids)
		dst = appendWeightVersions(append(dst, `,"routed_experts":null,"sampling_mask":null,"weight_versions":`...), len(c.ids))
		dst = append(dst, `,"logprobs":`...)
		if !p.logprobs {
			dst = append(dst, "null}"...)
			continue
		}
		dst = append(p.appendGenLogprobs(dst, c, 0, len(c.ids)), '}')
	}
	return append(dst, "]}"...)
}

// appendGenLogprobs appends GenerateLogProbs for c.ids[from:to]: each
// token id with its logprob and rank, the sampled token first in
// top_logprobs (token_in_token_out/serving.py _create_tokens_logprobs).
func (p *plan) appendGenLogprobs(dst []byte, c *planChoice, from, to int) []byte {
	dst = append(dst, `{"content":[`...)
	for pos := from; pos < to; pos++ {
		id := c.ids[pos]
		if pos > from {
			dst = append(dst, ',')
		}
		dst = appendGenLogprob(dst, id, logprob(c.seed, pos, 0), 1)
		dst = append(dst, `,"top_logprobs":[`...)
		// The sampled token is always among them, also with logprobs 0
		// (TestTokenInStreamShapesMatchRealVLLM).
		for r := 0; r < max(p.topLogprobs, 1); r++ {
			if r > 0 {
				dst = append(dst, ',')
			}
			t := id
			if r > 0 {
				t = altToken(id, r)
			}
			dst = append(appendGenLogprob(dst, t, logprob(c.seed, pos, r), r+1), '}')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}

// appendGenLogprob appends an unclosed GenerateLogProb object.
func appendGenLogprob(dst []byte, id uint32, lp float64, rank int) []byte {
	dst = strconv.AppendUint(append(dst, `{"token_id":`...), uint64(id), 10)
	dst = appendFloat(append(dst, `,"logprob":`...), lp)
	return strconv.AppendInt(append(dst, `,"rank":`...), int64(rank), 10)
}

// derender turns a GenerateTokensResponse into a ChatCompletionResponse
// (derender/serving.py derender_chat_response, online_derenderer.py
// _derender_chat and _parse_and_assemble).
func (s *Server) derender(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	if jsonscan.Validate(body) != nil {
		s.writeError(ctx, fasthttp.StatusBadRequest, "JSON decode error: the request body is not valid JSON (or nested more than 512 levels deep)")
		return
	}
	root := gjson.ParseBytes(body)
	out, msg := s.appendDerender(nil, root)
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	writeJSON(ctx, out)
}

func (s *Server) appendDerender(dst []byte, root gjson.Result) ([]byte, string) {
	if !root.IsObject() {
		return dst, "Input should be a valid dictionary or object to extract fields from"
	}
	if root.Get("stream").Type == gjson.True {
		return s.appendDerenderStream(dst, root)
	}
	gen := root.Get("generate_response")
	if !gen.IsObject() {
		return dst, "generate_response: Field required (a GenerateTokensResponse object)"
	}
	if om := gen.Get("output_mode"); om.Exists() && om.Type != gjson.Null && om.Str != "tokens" {
		return dst, "generate_response.output_mode: only \"tokens\" responses can be derendered"
	}
	choices := gen.Get("choices")
	if !choices.IsArray() {
		return dst, "generate_response.choices: Field required (a list)"
	}
	req := root.Get("chat_request")
	if req.Exists() && req.Type != gjson.Null && !req.IsObject() {
		return dst, "chat_request: Input should be a ChatCompletionRequest object"
	}
	tc := req.Get("tool_choice")
	parseTools := req.Get("tools").IsArray() && !(tc.Type == gjson.String && tc.Str == "none")
	forced := tc.IsObject() || (tc.Type == gjson.String && tc.Str == "required")
	asIDs := req.Get("return_tokens_as_token_ids").Type == gjson.True
	think := thinkingOn(req.Get("chat_template_kwargs"))
	prompt := root.Get("prompt_tokens")
	if prompt.Exists() && prompt.Type != gjson.Null && (prompt.Type != gjson.Number || prompt.Num < 0 || prompt.Num != float64(int64(prompt.Num))) {
		return dst, "prompt_tokens: Input should be a non-negative integer"
	}
	model := root.Get("model")
	if model.Type != gjson.String {
		model = gjson.Result{Type: gjson.String, Str: s.cfg.Model}
	}

	dst = append(dst, `{"id":`...)
	dst = appendJSONString(dst, gen.Get("request_id").String())
	dst = append(dst, `,"object":"chat.completion","created":`...)
	dst = strconv.AppendInt(dst, s.cfg.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, model.Str)
	dst = append(dst, `,"choices":[`...)
	var ids []uint32
	var text []byte
	completion, n := 0, 0
	msg := ""
	choices.ForEach(func(_, ch gjson.Result) bool {
		var ok bool
		if ids, ok = tokenIDList(ids[:0], ch.Get("token_ids"), s.v.size()); !ok || len(ids) == 0 {
			msg = "choice " + strconv.Itoa(n) + " has empty or null token_ids (each id at least 0 and below " + strconv.Itoa(s.v.size()) + ")"
			return false
		}
		completion += len(ids)
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		text = text[:0]
		for _, id := range ids {
			text = append(text, s.v.text(id)...)
		}
		stop := ch.Get("stop_reason")
		if stop.Type == gjson.String && stop.Str != "" {
			if i := strings.Index(b2s(text), stop.Str); i >= 0 {
				text = text[:i] // the engine's stop-string cut (the chat path's text)
			}
		}
		idx := ch.Get("index")
		dst = strconv.AppendInt(append(dst, `{"index":`...), idx.Int(), 10)
		dst = append(dst, `,"message":{"role":"assistant","content":`...)
		if s.v.real != nil {
			a := s.v.real.parse(b2s(text), think, parseTools, true)
			dst = appendParsedMessage(dst, &a, forced, ids, idx.Int())
		} else {
			dst = appendHermes(dst, b2s(text), parseTools, forced, ids, idx.Int())
		}
		dst = append(dst, `},"logprobs":`...)
		dst = s.v.appendDerenderLogprobs(dst, ch.Get("logprobs.content"), asIDs)
		dst = append(dst, `,"finish_reason":`...)
		dst = appendJSONOrNull(dst, ch.Get("finish_reason"))
		dst = append(dst, `,"stop_reason":`...)
		dst = appendJSONOrNull(dst, stop)
		dst = append(dst, `,"token_ids":null}`...)
		return true
	})
	if msg != "" {
		return dst, msg
	}
	pt := int(prompt.Int())
	dst = append(dst, `],"service_tier":null,"system_fingerprint":null,"usage":`...)
	dst = appendUsage(dst, pt, completion)
	dst = append(dst, `,"prompt_logprobs":null,"prompt_token_ids":null,"kv_transfer_params":null}`...)
	return dst, ""
}

// appendJSONOrNull appends v's JSON (a string or number), or null.
func appendJSONOrNull(dst []byte, v gjson.Result) []byte {
	switch v.Type {
	case gjson.String:
		return appendJSONString(dst, v.Str)
	case gjson.Number:
		return append(dst, v.Raw...)
	}
	return append(dst, "null"...)
}

// appendHermes appends a message's content and tool calls from its text as
// vLLM's hermes tool parser reads it (tool_parsers/hermes_tool_parser.py:
// <tool_call>JSON</tool_call>, or an unclosed last one; content is the
// text before the first call, null when empty; text whose calls are not
// JSON objects with a name is all content). forced (required or a named
// tool choice) makes a null content "" (online_derenderer.py
// _parse_and_assemble). The call ids are derived from the ids, so the
// same answer gets the same ids (vLLM draws random ones).
func appendHermes(dst []byte, text string, parse, forced bool, ids []uint32, index int64) []byte {
	type call struct{ name, args string }
	var calls []call
	content := text
	if start := strings.Index(text, "<tool_call>"); parse && start >= 0 {
		rest := text[start:]
		for strings.HasPrefix(rest, "<tool_call>") {
			inner := rest[len("<tool_call>"):]
			end := strings.Index(inner, "</tool_call>")
			if end >= 0 {
				rest = strings.TrimLeft(inner[end+len("</tool_call>"):], " \n")
				inner = inner[:end]
			} else {
				rest = ""
			}
			obj := gjson.Parse(strings.TrimSpace(inner))
			name := obj.Get("name")
			if !obj.IsObject() || name.Type != gjson.String || !gjson.Valid(inner) {
				calls = nil
				break
			}
			args := obj.Get("arguments")
			a := "{}"
			if args.Exists() {
				// The hermes parser's json.dumps, as on the chat path (hermes.go).
				a = string(appendPyJSON(nil, appendCompactJSON(nil, args.Raw)))
			}
			calls = append(calls, call{name.Str, a})
		}
		if calls != nil {
			content = text[:start]
		}
	}
	switch {
	case content != "" || (forced && calls != nil) || calls == nil:
		dst = appendJSONString(dst, content)
	default:
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[`...)
	for i, c := range calls {
		if i > 0 {
			dst = append(dst, ',')
		}
		h := newHasher()
		h.ids(ids)
		h.u64(uint64(index))
		h.u64(uint64(i))
		v := h.sum()
		dst = append(dst, `{"id":"chatcmpl-tool-`...)
		dst = appendHex(appendHex(dst, v), mix64(v))
		dst = append(dst, `","type":"function","function":{"name":`...)
		dst = appendJSONString(dst, c.name)
		dst = append(dst, `,"arguments":`...)
		dst = appendJSONString(dst, c.args)
		dst = append(dst, "}}"...)
	}
	return append(dst, `],"reasoning":null`...)
}

// appendDerenderLogprobs appends the chat logprobs of a generate choice's
// logprobs.content (online_derenderer.py _resolve_logprobs: each token id
// decoded to its string and bytes), or null.
func (voc *vocabulary) appendDerenderLogprobs(dst []byte, content gjson.Result, asIDs bool) []byte {
	if !content.IsArray() {
		return append(dst, "null"...)
	}
	entry := func(dst []byte, e gjson.Result) []byte {
		id := uint32(0)
		if v := e.Get("token_id"); v.Type == gjson.Number && v.Num >= 0 && v.Num < float64(voc.size()) {
			id = uint32(v.Num)
		}
		dst = append(dst, `{"token":`...)
		if asIDs {
			dst = strconv.AppendUint(append(dst, `"token_id:`...), uint64(id), 10)
			dst = append(dst, '"')
		} else {
			dst = appendJSONString(dst, voc.pieces[id])
		}
		dst = appendFloat(append(dst, `,"logprob":`...), e.Get("logprob").Float())
		return voc.appendTokenBytes(append(dst, `,"bytes":`...), id)
	}
	dst = append(dst, `{"content":[`...)
	first := true
	content.ForEach(func(_, e gjson.Result) bool {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(entry(dst, e), `,"top_logprobs":[`...)
		tf := true
		e.Get("top_logprobs").ForEach(func(_, t gjson.Result) bool {
			if !tf {
				dst = append(dst, ',')
			}
			tf = false
			dst = append(entry(dst, t), '}')
			return true
		})
		dst = append(dst, "]}"...)
		return true
	})
	return append(dst, "]}"...)
}
