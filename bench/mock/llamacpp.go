package mock

import (
	"bufio"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// llama.cpp flavour (FlavorLlamaCpp): nlohmann::ordered_json objects, so keys come in the
// server's insertion order ("choices" first); ids are "chatcmpl-<hex>" for chat and
// completions; no token_ids or prompt_token_ids ever (return_token_ids is ignored); with
// logprobs every logprobs.content[] entry (and each top_logprobs entry) carries the token
// "id", the only way to get output ids from /v1/chat/completions. The ids are the mock's
// own tokenizer's, so /apply-template + /tokenize of the messages gives exactly the
// prompt ids counted in usage.prompt_tokens, and the logprob ids are the output ids.
//
// Chat, non-streaming:
//
//	{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"Hi"},
//	 "logprobs":{"content":[{"id":N,"token":" Hi","bytes":[...],"logprob":-0.1,"top_logprobs":[]}]}}],
//	 "created":C,"model":"m","system_fingerprint":"b6000-0000000","object":"chat.completion",
//	 "usage":{"completion_tokens":1,"prompt_tokens":9,"total_tokens":10,
//	 "prompt_tokens_details":{"cached_tokens":0}},"id":"chatcmpl-<hex>"}
//
// Streams open each choice with delta {"role":"assistant","content":null}, then one chunk
// per token ({"content":"w"} plus its logprobs when asked), a finish chunk with delta {},
// the usage chunk (choices []) if asked, then [DONE].

// Errors of llama.cpp's chat parameter parsing (server-common.cpp
// oaicompat_chat_params_parse), answered 400.
const (
	llamaCppToolsStreamLogprobs = "logprobs is not supported with tools + stream"
	llamaCppTopLogprobsAlone    = "top_logprobs requires logprobs to be set to true"
)

// llamaCppDefaultNProbs is n_probs when logprobs is true and top_logprobs absent.
const llamaCppDefaultNProbs = 20

// llamaCppChatChecks applies llama.cpp's own rules for logprobs on the chat route: a
// streamed request with a non-empty tools list may not ask for logprobs; top_logprobs
// (any non-null value) needs logprobs true; logprobs without top_logprobs returns 20
// alternatives per token. It returns the error message, or "".
func (p *plan) llamaCppChatChecks(f *fields) string {
	if p.logprobs {
		if f.stream && f.tools.IsArray() && len(f.tools.Array()) > 0 {
			return llamaCppToolsStreamLogprobs
		}
		if f.topLogprobs == unset {
			p.topLogprobs = llamaCppDefaultNProbs
		}
		return ""
	}
	if f.topLogprobs != unset {
		return llamaCppTopLogprobsAlone
	}
	return ""
}

// appendLlamaCppCallID appends the 32-hex tool call id.
func appendLlamaCppCallID(dst []byte, c *planChoice) []byte {
	dst = append(dst, '"')
	dst = appendHex(dst, c.callID)
	dst = appendHex(dst, mix64(c.callID))
	return append(dst, '"')
}

// appendLlamaCppTail appends the keys after "choices" of a non-streamed answer, up to "usage".
func (p *plan) appendLlamaCppTail(dst []byte, object string) []byte {
	dst = append(dst, `],"created":`...)
	dst = strconv.AppendInt(dst, p.s.cfg.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, b2s(p.model))
	dst = append(dst, `,"system_fingerprint":"`+llamaCppBuildInfo+`","object":"`...)
	dst = append(dst, object...)
	return append(dst, '"')
}

// appendLlamaCppID appends `,"id":"chatcmpl-<hex>"}`, closing a non-streamed answer.
func (p *plan) appendLlamaCppID(dst []byte) []byte {
	return append(p.appendLlamaCppIDOpen(dst), '}')
}

// appendLlamaCppIDOpen appends `,"id":"chatcmpl-<hex>"` (unclosed).
func (p *plan) appendLlamaCppIDOpen(dst []byte) []byte {
	dst = append(dst, `,"id":"chatcmpl-`...)
	dst = append(dst, p.id[:]...)
	return append(dst, '"')
}

// appendLlamaCppTimings appends `,"timings":{...}}`, closing the answer or chunk that
// carries the final result's timings (server-task.cpp result_timings::to_json): the
// prompt's tokens split into cache_n (reused; at least one is always evaluated, so
// a fully cached prompt has cache_n = n-1) and prompt_n, and predicted_n = the tokens
// generated (usage.completion_tokens). The times follow the latency knobs.
func (p *plan) appendLlamaCppTimings(dst []byte) []byte {
	n := p.promptTokens()
	cache := min(p.cached, max(n-1, 0))
	pred := p.completionTokens()
	promptMS := float64(p.k.ttft) / 1e6
	predMS := float64(p.k.itl) / 1e6 * float64(max(pred-1, 0))
	dst = append(dst, `,"timings":{"cache_n":`...)
	dst = strconv.AppendInt(dst, int64(cache), 10)
	dst = append(dst, `,"prompt_n":`...)
	dst = strconv.AppendInt(dst, int64(n-cache), 10)
	dst = append(dst, `,"prompt_ms":`...)
	dst = appendFloat(dst, promptMS)
	dst = append(dst, `,"prompt_per_token_ms":`...)
	dst = appendFloat(dst, promptMS/float64(max(n-cache, 1)))
	dst = append(dst, `,"prompt_per_second":`...)
	dst = appendFloat(dst, rate(n-cache, promptMS))
	dst = append(dst, `,"predicted_n":`...)
	dst = strconv.AppendInt(dst, int64(pred), 10)
	dst = append(dst, `,"predicted_ms":`...)
	dst = appendFloat(dst, predMS)
	dst = append(dst, `,"predicted_per_token_ms":`...)
	dst = appendFloat(dst, predMS/float64(max(pred, 1)))
	dst = append(dst, `,"predicted_per_second":`...)
	dst = appendFloat(dst, rate(pred, predMS))
	return append(dst, "}}"...)
}

// rate is n per second over ms milliseconds (0 when no time passed).
func rate(n int, ms float64) float64 {
	if ms <= 0 {
		return 0
	}
	return float64(n) * 1e3 / ms
}

// appendLlamaCppStreamTail appends the keys after "choices" of a chat chunk (unclosed).
func (p *plan) appendLlamaCppStreamTail(dst []byte) []byte {
	dst = append(dst, `],"created":`...)
	dst = strconv.AppendInt(dst, p.s.cfg.Created, 10)
	dst = append(dst, `,"id":"chatcmpl-`...)
	dst = append(dst, p.id[:]...)
	dst = append(dst, `","model":`...)
	dst = appendJSONString(dst, b2s(p.model))
	return append(dst, `,"system_fingerprint":"`+llamaCppBuildInfo+`","object":"chat.completion.chunk"`...)
}

// appendLlamaCppLogprobs appends `,"logprobs":{"content":[...]}` for c.ids[from:to], or
// nothing when not asked or empty (llama.cpp omits the key).
func (p *plan) appendLlamaCppLogprobs(dst []byte, c *planChoice, from, to int) []byte {
	if !p.logprobs || from >= to {
		return dst
	}
	dst = append(dst, `,"logprobs":`...)
	return p.appendChatLogprobs(dst, c, from, to)
}

func (p *plan) appendLlamaCppChatFull(dst []byte) []byte {
	dst = append(dst, `{"choices":[`...)
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"finish_reason":"`...)
		dst = append(dst, c.finish...)
		dst = append(dst, `","index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"message":{"role":"assistant","content":`...)
		if c.tool {
			dst = append(dst, `null,"tool_calls":[{"type":"function","function":{"name":`...)
			dst = appendJSONString(dst, b2s(c.name))
			dst = append(dst, `,"arguments":`...)
			dst = appendJSONString(dst, b2s(c.args))
			dst = append(dst, `},"id":`...)
			dst = appendLlamaCppCallID(dst, c)
			dst = append(dst, "}]}"...)
		} else {
			dst = append(dst, '"')
			dst = appendChoiceText(dst, c)
			dst = append(dst, `"}`...)
		}
		dst = p.appendLlamaCppLogprobs(dst, c, 0, p.logprobEnd(c))
		dst = append(dst, '}')
	}
	dst = p.appendLlamaCppTail(dst, "chat.completion")
	dst = append(dst, `,"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return p.appendLlamaCppTimings(p.appendLlamaCppIDOpen(dst))
}

func (p *plan) streamLlamaCppChat(w *bufio.Writer) { p.streamWith(w, &llamaCppChatWire) }

var llamaCppChatWire = wire{
	role:   (*plan).appendLlamaCppChatRole,
	chunk:  (*plan).appendLlamaCppChatChunk,
	finish: (*plan).appendLlamaCppChatFinish,
	usage:  (*plan).appendLlamaCppChatUsage,
}

func (p *plan) appendLlamaCppChatRole(dst []byte, i int) []byte {
	dst = append(dst, `{"choices":[{"finish_reason":null,"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"delta":{"role":"assistant","content":null}}`...)
	dst = p.appendLlamaCppStreamTail(dst)
	return append(dst, '}')
}

func (p *plan) appendLlamaCppChatChunk(dst []byte, i int, c *planChoice, st int) []byte {
	if !c.tool && (c.stepTextOf(st) == "" || c.hiddenAt(st)) {
		return dst // no text, no delta: no chunk (and no logprobs) for this token
	}
	dst = append(dst, `{"choices":[{"finish_reason":null,"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	from, to := c.stepRange(st)
	switch {
	case !c.tool:
		dst = append(dst, `,"delta":{"content":"`...)
		dst = appendJSONStringBody(dst, c.stepTextOf(st))
		dst = append(dst, `"}`...)
	case st == 0:
		dst = append(dst, `,"delta":{"tool_calls":[{"index":0,"id":`...)
		dst = appendLlamaCppCallID(dst, c)
		dst = append(dst, `,"type":"function","function":{"name":`...)
		dst = appendJSONString(dst, b2s(c.name))
		dst = append(dst, `,"arguments":""}}]}`...)
	default:
		dst = append(dst, `,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"`...)
		dst = appendJSONStringBody(dst, vocab[c.ids[from]])
		dst = append(dst, `"}}]}`...)
	}
	dst = p.appendLlamaCppLogprobs(dst, c, from, to)
	dst = append(dst, '}')
	dst = p.appendLlamaCppStreamTail(dst)
	return append(dst, '}')
}

func (p *plan) appendLlamaCppChatFinish(dst []byte, i int, c *planChoice) []byte {
	dst = append(dst, `{"choices":[{"finish_reason":"`...)
	dst = append(dst, c.finish...)
	dst = append(dst, `","index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"delta":{}`...)
	from, to := c.finishRange()
	if c.eos {
		// The end-of-turn token adds no text, so no chunk carries its
		// logprobs (server-task.cpp: a partial result's logprobs ride on its
		// last delta; an empty text makes no delta).
		to--
	}
	dst = p.appendLlamaCppLogprobs(dst, c, from, to)
	dst = append(dst, '}')
	dst = p.appendLlamaCppStreamTail(dst)
	if !p.includeUsage {
		// The final result's last chunk carries the timings: this one,
		// or the usage chunk when include_usage is set.
		return p.appendLlamaCppTimings(dst)
	}
	return append(dst, '}')
}

func (p *plan) appendLlamaCppChatUsage(dst []byte) []byte {
	dst = append(dst, `{"choices":[`...)
	dst = p.appendLlamaCppStreamTail(dst)
	dst = append(dst, `,"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return p.appendLlamaCppTimings(dst)
}

func (p *plan) appendLlamaCppCompletionFull(dst []byte) []byte {
	dst = append(dst, `{"choices":[`...)
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"text":"`...)
		dst = appendChoiceText(dst, c)
		dst = append(dst, `","index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"logprobs":`...)
		dst = p.appendCompletionLogprobs(dst, c, 0, p.logprobEnd(c), 0)
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, c.finish...)
		dst = append(dst, `"}`...)
	}
	dst = p.appendLlamaCppTail(dst, "text_completion")
	dst = append(dst, `,"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return p.appendLlamaCppTimings(p.appendLlamaCppIDOpen(dst))
}

// streamLlamaCppCompletion streams a completion: the final result is the same object
// as a non-streamed answer's (server-task.cpp to_json_oaicompat), so the finish chunk
// carries usage and timings whether or not include_usage was asked, and there is no
// separate usage chunk.
func (p *plan) streamLlamaCppCompletion(w *bufio.Writer) {
	p.includeUsage = false
	p.streamWith(w, &llamaCppCompletionWire)
}

var llamaCppCompletionWire = wire{
	chunk:  (*plan).appendLlamaCppCompletionChunk,
	finish: (*plan).appendLlamaCppCompletionFinish,
}

func (p *plan) appendLlamaCppCompletionChunk(dst []byte, i int, c *planChoice, st int) []byte {
	if c.hiddenAt(st) {
		return dst // never sent while the text ends inside a character
	}
	dst = append(dst, `{"choices":[{"text":"`...)
	dst = appendJSONStringBody(dst, c.stepTextOf(st))
	dst = append(dst, `","index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"logprobs":`...)
	dst = p.appendCompletionLogprobs(dst, c, st, st+1, 0)
	dst = append(dst, `,"finish_reason":null}`...)
	dst = p.appendLlamaCppTail(dst, "text_completion")
	return p.appendLlamaCppID(dst)
}

func (p *plan) appendLlamaCppCompletionFinish(dst []byte, i int, c *planChoice) []byte {
	dst = append(dst, `{"choices":[{"text":"","index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"logprobs":null,"finish_reason":"`...)
	dst = append(dst, c.finish...)
	dst = append(dst, `"}`...)
	dst = p.appendLlamaCppTail(dst, "text_completion")
	dst = append(dst, `,"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return p.appendLlamaCppTimings(p.appendLlamaCppIDOpen(dst))
}

// llamaCppTokenize serves llama.cpp's POST /tokenize: {"content","add_special",
// "parse_special","with_pieces"} -> {"tokens":[...]}, or with with_pieces
// {"tokens":[{"id":N,"piece":"..."}]} (a piece that is not valid UTF-8 is a list of bytes).
// parse_special (default true) false encodes special-token text as plain text; the toy
// vocabulary has no BOS, so add_special changes nothing.
func (s *Server) llamaCppTokenize(ctx *fasthttp.RequestCtx, f *fields, p *plan) {
	msg := f.err
	special, pieces := true, false
	switch {
	case msg != "":
	case f.content.Type != gjson.String:
		msg = "\"content\" must be provided"
	default:
		boolField(f.parseSpecial, "parse_special", &special, &msg)
		boolField(f.withPieces, "with_pieces", &pieces, &msg)
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.prompts = appendEncodeSpecial(p.prompts, f.content.Str, special)
	b := append(p.buf[:0], `{"tokens":`...)
	if !pieces {
		b = appendIDs(b, p.prompts)
	} else {
		b = append(b, '[')
		for i, id := range p.prompts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = strconv.AppendUint(b, uint64(id), 10)
			b = append(b, `,"piece":`...)
			if p.s.v.validUTF8(id) {
				b = appendJSONString(b, vocab[id])
			} else {
				b = appendRawBytes(b, vocab[id])
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	p.buf = append(b, '}')
	writeJSON(ctx, p.buf)
}

// applyTemplate serves llama.cpp's POST /apply-template: {"messages", "tools",
// "add_generation_prompt"} -> {"prompt":"..."}, the chat template rendered exactly as the
// chat route renders it.
func (s *Server) applyTemplate(ctx *fasthttp.RequestCtx) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, &knobs{})
	defer p.release()
	msg := f.err
	switch {
	case msg != "":
	case !f.messages.Exists() || f.messages.Type == gjson.Null:
		msg = "'messages' is required"
	case !f.messages.IsArray():
		msg = "Expected 'messages' to be an array"
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.text = appendRenderChat(p.text[:0], f.messages.Raw, f.tools.Raw, f.addGenPrompt)
	b := append(p.buf[:0], `{"prompt":`...)
	b = appendJSONString(b, b2s(p.text))
	p.buf = append(b, '}')
	writeJSON(ctx, p.buf)
}

// llamaCppChatTemplate is the chat template reported by GET /props (the toy template of
// template.go written as Jinja).
const llamaCppChatTemplate = "{%- if tools %}<|im_start|>system\nTools<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools><|im_end|>\n{%- endif %}" +
	"{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}" +
	"{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"

// appendProps appends the GET /props body.
func (s *Server) appendProps(dst []byte) []byte {
	dst = append(dst, `{"default_generation_settings":{"id":0,"id_task":-1,"n_ctx":`...)
	dst = strconv.AppendInt(dst, int64(s.cfg.MaxModelLen), 10)
	dst = append(dst, `,"speculative":false,"is_processing":false,"params":{"n_predict":-1,"seed":4294967295,"temperature":0.800000011920929}},"total_slots":1,"model_path":`...)
	dst = appendJSONString(dst, s.cfg.Model)
	dst = append(dst, `,"modalities":{"vision":false,"audio":false},"chat_template":`...)
	dst = appendJSONString(dst, llamaCppChatTemplate)
	dst = append(dst, `,"bos_token":"","eos_token":"<|im_end|>","build_info":"`+llamaCppBuildInfo+`","is_sleeping":false}`...)
	return dst
}
