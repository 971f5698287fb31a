package mock

import (
	"bufio"
	"math"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Completions (POST /v1/completions). The prompt is a string, a list of strings, a list of
// token ids or a list of lists of token ids; each prompt gets n choices with index
// output_index + prompt_index*n. Streams (vllm flavour): per choice one chunk per token
// (prompt_token_ids on its first chunk when asked), the last one carrying the finish
// reason, then the usage chunk if include_usage, then [DONE]. echo, suffix and best_of
// are ignored.

func (s *Server) completions(ctx *fasthttp.RequestCtx, k *knobs) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, k)
	if msg := p.buildCompletions(&f); msg != "" {
		p.release()
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.prefill()
	switch s.cfg.Flavor {
	case FlavorSGLang:
		p.respond(ctx, f.stream, (*plan).appendSGLangCompletionFull, (*plan).streamSGLangCompletion)
	case FlavorLlamaCpp:
		p.respond(ctx, f.stream, (*plan).appendLlamaCppCompletionFull, (*plan).streamLlamaCppCompletion)
	default:
		p.respond(ctx, f.stream, (*plan).appendCompletionFull, (*plan).streamCompletion)
	}
}

// readPrompts fills p.prompts from a completions prompt or an embeddings input.
func (p *plan) readPrompts(v gjson.Result, field string) string {
	bad := field + ": Input should be a string, a list of strings, a list of token ids or a list of lists of token ids (each id below " + strconv.Itoa(len(vocab)) + ")"
	switch {
	case !v.Exists() || v.Type == gjson.Null:
		return field + ": Field required"
	case v.Type == gjson.String:
		p.prompts = p.s.v.encode(p.prompts, v.Str)
		p.endPrompt()
	case v.IsArray():
		first := v.Get("0")
		switch {
		case !first.Exists():
			return field + ": the prompt list must not be empty"
		case first.Type == gjson.Number:
			var ok bool
			if p.prompts, ok = tokenIDList(p.prompts, v, p.s.v.size()); !ok {
				return bad
			}
			p.endPrompt()
		default:
			msg := ""
			v.ForEach(func(_, e gjson.Result) bool {
				if e.Type == gjson.String && first.Type == gjson.String {
					p.prompts = p.s.v.encode(p.prompts, e.Str)
				} else if e.IsArray() && first.IsArray() {
					var ok bool
					if p.prompts, ok = tokenIDList(p.prompts, e, p.s.v.size()); !ok {
						msg = bad
						return false
					}
				} else {
					msg = bad
					return false
				}
				p.endPrompt()
				return len(p.promptOff) <= MaxN
			})
			if msg != "" {
				return msg
			}
			if len(p.promptOff) > MaxN {
				return field + ": at most " + strconv.Itoa(MaxN) + " prompts on this mock"
			}
		}
	default:
		return bad
	}
	for i := 0; i < p.numPrompts(); i++ {
		if len(p.prompt(i)) == 0 {
			return "The decoder prompt cannot be empty"
		}
	}
	return ""
}

func (p *plan) buildCompletions(f *fields) string {
	if f.err != "" {
		return f.err
	}
	if msg := p.commonChecks(f); msg != "" {
		return msg
	}
	p.readStops(f.stop)
	switch lp := f.logprobs; {
	case lp.Type == gjson.Null || !lp.Exists():
	case lp.Type == gjson.True || lp.Type == gjson.False:
		// An integer field read by a lax validator: vLLM's (and SGLang's)
		// pydantic int takes true as 1 and false as 0; llama.cpp's
		// json_value<int> converts a boolean the same way (n_probs).
		p.topLogprobs = 0
		if lp.Type == gjson.True {
			p.topLogprobs = 1
		}
		p.logprobs = p.topLogprobs > 0 || p.s.cfg.Flavor != FlavorLlamaCpp
	case lp.Type == gjson.Number && lp.Num == math.Trunc(lp.Num):
		if lp.Num < 0 || lp.Num > MaxLogprobs {
			return "logprobs: must be between 0 and " + strconv.Itoa(MaxLogprobs) + ", got " + lp.Raw
		}
		p.topLogprobs = int(lp.Num)
		// llama.cpp's n_probs 0 asks for nothing.
		p.logprobs = p.topLogprobs > 0 || p.s.cfg.Flavor != FlavorLlamaCpp
	default:
		return "logprobs: Input should be a valid integer"
	}
	if msg := p.readPrompts(f.prompt, "prompt"); msg != "" {
		return msg
	}
	limit := f.limit()
	for i := 0; i < p.numPrompts(); i++ {
		if msg := p.checkContext(len(p.prompt(i)), limit); msg != "" {
			return msg
		}
	}
	p.setModel(f)
	p.returnIDs = p.wantIDs(f)
	p.asTokenIDs = p.wantTokenIDStrings(f)
	p.includeUsage = f.stream && f.includeUsage()
	p.continuousUsage = f.stream && f.continuousUsage()

	idh := newHasher()
	idh.str(b2s(p.model))
	f.seedHash(&idh, p.s.cfg.Seed)
	idh.u64(uint64(f.n))
	idh.u64(uint64(limit))
	idh.u64(uint64(p.k.tokens))
	for pi := 0; pi < p.numPrompts(); pi++ {
		ids := p.prompt(pi)
		idh.ids(ids)
		h := newHasher()
		h.str(b2s(p.model))
		h.ids(ids)
		f.seedHash(&h, p.s.cfg.Seed)
		seed := h.sum()
		for o := 0; o < f.n; o++ {
			c := p.addChoice()
			c.prompt = pi
			c.seed = mix64(seed + uint64(o)*0x9e3779b97f4a7c15)
			c.perToken = p.s.cfg.Flavor == FlavorVLLM
			p.genText(c, limit)
			// llama.cpp streams a completion's end-of-turn token as a chunk
			// of its own (text "", with its logprobs).
			c.eosStep = c.eos && p.s.cfg.Flavor == FlavorLlamaCpp
		}
	}
	p.setID(idh)
	return ""
}

// appendCompletionLogprobs appends the completions logprobs object for c.ids[from:to]:
// vLLM (0.32.0) and SGLang {text_offset, token_logprobs, tokens, top_logprobs},
// llama.cpp the chat shape {"content":[...]}; null when not asked.
func (p *plan) appendCompletionLogprobs(dst []byte, c *planChoice, from, to, offset int) []byte {
	if !p.logprobs || from >= to {
		return append(dst, "null"...)
	}
	switch p.s.cfg.Flavor {
	case FlavorLlamaCpp:
		return p.appendChatLogprobs(dst, c, from, to)
	case FlavorSGLang:
		dst = append(dst, `{"text_offset":`...)
		dst = appendTextOffsets(dst, c, from, to, offset)
		dst = append(dst, `,"token_logprobs":`...)
		dst = appendTokenLogprobs(dst, c, from, to)
		dst = append(dst, `,"tokens":`...)
		dst = p.appendTokenStrings(dst, c, from, to)
	default:
		// vLLM 0.32.0 writes the lists in this order too
		// (completion/protocol.py CompletionLogProbs; TestMockMatchesRealVLLM).
		dst = append(dst, `{"text_offset":`...)
		dst = appendTextOffsets(dst, c, from, to, offset)
		dst = append(dst, `,"token_logprobs":`...)
		dst = appendTokenLogprobs(dst, c, from, to)
		dst = append(dst, `,"tokens":`...)
		dst = p.appendTokenStrings(dst, c, from, to)
	}
	dst = append(dst, `,"top_logprobs":[`...)
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = append(dst, '{')
		id := c.ids[pos]
		for r := 0; r <= p.topLogprobs; r++ {
			if r > 0 {
				dst = append(dst, ',')
			}
			t := id
			if r > 0 {
				t = altToken(id, r)
			}
			dst = p.appendTokenString(dst, t)
			dst = append(dst, ':')
			dst = appendFloat(dst, logprob(c.seed, pos, r))
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}

// appendTokenStrings appends the JSON list of the strings of c.ids[from:to].
func (p *plan) appendTokenStrings(dst []byte, c *planChoice, from, to int) []byte {
	dst = append(dst, '[')
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = p.appendTokenString(dst, c.ids[pos])
	}
	return append(dst, ']')
}

// appendTokenLogprobs appends the JSON list of the sampled logprobs at from..to-1.
func appendTokenLogprobs(dst []byte, c *planChoice, from, to int) []byte {
	dst = append(dst, '[')
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = appendFloat(dst, logprob(c.seed, pos, 0))
	}
	return append(dst, ']')
}

// appendTextOffsets appends the JSON list of the text offsets of c.ids[from:to], the first
// being offset.
func appendTextOffsets(dst []byte, c *planChoice, from, to, offset int) []byte {
	dst = append(dst, '[')
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(offset), 10)
		offset += len(c.v.text(c.ids[pos]))
	}
	return append(dst, ']')
}

// appendCompletionFull appends a whole completion as vLLM 0.32.0 writes it:
// every member of CompletionResponse and CompletionResponseChoice, null when
// unset, in the order the engine sends them (completion/protocol.py; the
// choice's token_ids come before prompt_logprobs).
func (p *plan) appendCompletionFull(dst []byte) []byte {
	dst = p.appendPrefix(dst, "cmpl-", "text_completion")
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = p.appendCompletionChoiceHead(dst, i, c)
		dst = append(dst, `","stop_reason":`...)
		dst = appendStopReason(dst, c)
		dst = append(dst, `,"token_ids":`...)
		dst = appendIDsOrNull(dst, c.ids, p.returnIDs)
		dst = append(dst, `,"prompt_logprobs":null,"prompt_token_ids":`...)
		dst = appendIDsOrNull(dst, p.prompt(c.prompt), p.returnIDs)
		dst = append(dst, `,"routed_experts":null}`...)
	}
	dst = append(dst, `],"service_tier":null`...)
	dst = appendFingerprint(dst, p)
	dst = append(dst, `,"usage":`...)
	dst = p.appendWholeUsage(dst)
	return append(dst, `,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`...)
}

// appendCompletionChoiceHead appends the start of choice i of a whole
// completion, shared by the flavours: {"index","text","logprobs","finish_reason"
// (open: the caller closes the finish reason's string and the object).
func (p *plan) appendCompletionChoiceHead(dst []byte, i int, c *planChoice) []byte {
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"text":"`...)
	dst = appendChoiceText(dst, c)
	dst = append(dst, `","logprobs":`...)
	dst = p.appendCompletionLogprobs(dst, c, 0, p.logprobEnd(c), 0)
	dst = append(dst, `,"finish_reason":"`...)
	return append(dst, c.finish...)
}

// appendCompletionStepHead appends the start of choice i's chunk for step
// st, shared by the flavours: {"index","text","logprobs" (the object left
// open), advancing the choice's text offset.
func (p *plan) appendCompletionStepHead(dst []byte, i int, c *planChoice, st int) []byte {
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"text":"`...)
	dst = appendJSONStringBody(dst, c.stepTextOf(st))
	dst = append(dst, `","logprobs":`...)
	dst = p.appendCompletionLogprobs(dst, c, st, st+1, c.offset)
	// The offset advances by the tokens reported, not by the text sent: text
	// held back for stop strings lags the tokens (completion/serving.py,
	// vLLM 0.32.0).
	c.offset += len(c.v.text(c.ids[st]))
	return dst
}

// streamCompletion writes the SSE stream of a completion.
func (p *plan) streamCompletion(w *bufio.Writer) { p.streamWith(w, &vllmCompletionWire) }

var vllmCompletionWire = perTokenWire(nil, (*plan).appendCompletionStep, (*plan).appendCompletionUsageChunk)

// appendCompletionStep appends the chunk of token c.ids[st]: every key is
// present, and a chunk is sent for every token, text or not
// (completion/serving.py, vLLM 0.32.0).
func (p *plan) appendCompletionStep(dst []byte, i int, c *planChoice, st int, final bool) []byte {
	dst = p.appendPrefix(dst, "cmpl-", "text_completion")
	dst = p.appendCompletionStepHead(dst, i, c, st)
	dst = appendFinishReason(dst, c, final, true)
	dst = append(dst, `,"prompt_token_ids":`...)
	dst = appendIDsOrNull(dst, p.prompt(c.prompt), p.returnIDs && st == 0)
	// No usage key unless continuous usage stats were asked for.
	return p.appendStepTail(dst, c, st, final, false)
}

// appendCompletionUsageChunk appends the final usage chunk.
func (p *plan) appendCompletionUsageChunk(dst []byte) []byte {
	dst = p.appendPrefix(dst, "cmpl-", "text_completion")
	dst = append(dst, `],"usage":`...)
	dst = p.appendUsageOf(dst)
	dst = appendFingerprint(dst, p)
	return append(dst, '}')
}
