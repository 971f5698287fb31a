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
// output_index + prompt_index*n. Streams: per choice one chunk per token (prompt_token_ids
// on its first chunk when asked), then a finish chunk (text "", token_ids [] when asked),
// then the usage chunk if include_usage, then [DONE]. echo, suffix and best_of are ignored.

func (s *Server) completions(ctx *fasthttp.RequestCtx, k *knobs) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, k)
	if msg := p.buildCompletions(&f); msg != "" {
		p.release()
		writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.respond(ctx, f.stream, (*plan).appendCompletionFull, (*plan).streamCompletion)
}

// readPrompts fills p.prompts from a completions prompt or an embeddings input.
func (p *plan) readPrompts(v gjson.Result, field string) string {
	bad := field + ": Input should be a string, a list of strings, a list of token ids or a list of lists of token ids (each id below " + strconv.Itoa(len(vocab)) + ")"
	switch {
	case !v.Exists() || v.Type == gjson.Null:
		return field + ": Field required"
	case v.Type == gjson.String:
		p.prompts = appendEncode(p.prompts, v.Str)
		p.endPrompt()
	case v.IsArray():
		first := v.Get("0")
		switch {
		case !first.Exists():
			return field + ": the prompt list must not be empty"
		case first.Type == gjson.Number:
			var ok bool
			if p.prompts, ok = tokenIDList(p.prompts, v); !ok {
				return bad
			}
			p.endPrompt()
		default:
			msg := ""
			v.ForEach(func(_, e gjson.Result) bool {
				if e.Type == gjson.String && first.Type == gjson.String {
					p.prompts = appendEncode(p.prompts, e.Str)
				} else if e.IsArray() && first.IsArray() {
					var ok bool
					if p.prompts, ok = tokenIDList(p.prompts, e); !ok {
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
	switch lp := f.logprobs; {
	case lp.Type == gjson.Null || !lp.Exists():
	case lp.Type == gjson.Number && lp.Num == math.Trunc(lp.Num):
		if lp.Num < 0 || lp.Num > MaxLogprobs {
			return "logprobs: must be between 0 and " + strconv.Itoa(MaxLogprobs) + ", got " + lp.Raw
		}
		p.logprobs = true
		p.topLogprobs = int(lp.Num)
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
	p.asTokenIDs = f.asTokenIDs
	p.includeUsage = f.stream && f.includeUsage()

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
			p.genText(c, limit)
		}
	}
	p.setID(idh)
	return ""
}

// appendCompletionLogprobs appends the completions logprobs object for c.ids[from:to].
func (p *plan) appendCompletionLogprobs(dst []byte, c *planChoice, from, to, offset int) []byte {
	if !p.logprobs || from >= to {
		return append(dst, "null"...)
	}
	dst = append(dst, `{"tokens":[`...)
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = p.appendTokenString(dst, c.ids[pos])
	}
	dst = append(dst, `],"token_logprobs":[`...)
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = appendFloat(dst, logprob(c.seed, pos, 0))
	}
	dst = append(dst, `],"text_offset":[`...)
	for pos := from; pos < to; pos++ {
		if pos > from {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(offset), 10)
		offset += len(vocab[c.ids[pos]])
	}
	dst = append(dst, `],"top_logprobs":[`...)
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

func (p *plan) appendCompletionFull(dst []byte) []byte {
	dst = p.appendPrefix(dst, "cmpl-", "text_completion")
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"text":"`...)
		dst = appendTextOf(dst, c.ids)
		dst = append(dst, `","logprobs":`...)
		dst = p.appendCompletionLogprobs(dst, c, 0, len(c.ids), 0)
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, c.finish...)
		dst = append(dst, `","stop_reason":null,"prompt_logprobs":null,"prompt_token_ids":`...)
		dst = appendIDsOrNull(dst, p.prompt(c.prompt), p.returnIDs)
		dst = append(dst, `,"token_ids":`...)
		dst = appendIDsOrNull(dst, c.ids, p.returnIDs)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"usage":`...)
	dst = appendUsage(dst, p.promptTokens(), p.completionTokens())
	return append(dst, '}')
}

// streamCompletion writes the SSE stream of a completion.
func (p *plan) streamCompletion(w *bufio.Writer) {
	if p.s.wait(&p.timer, p.k.ttft) != nil {
		return
	}
	steps := p.maxSteps()
	failAt, breakAt := p.failStep(steps), p.breakStep(steps)
	for st := 0; st < steps; st++ {
		if st == failAt {
			_ = sse(w, []byte(midstreamError))
			return
		}
		if st == breakAt && p.breakStream(w) {
			return
		}
		if st > 0 && p.s.wait(&p.timer, p.k.itl) != nil {
			return
		}
		for i := range p.choices {
			c := &p.choices[i]
			if st >= len(c.ids) {
				continue
			}
			b := p.appendPrefix(p.buf[:0], "cmpl-", "text_completion")
			b = append(b, `{"index":`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `,"text":"`...)
			b = appendJSONStringBody(b, vocab[c.ids[st]])
			b = append(b, `","logprobs":`...)
			b = p.appendCompletionLogprobs(b, c, st, st+1, c.offset)
			c.offset += len(vocab[c.ids[st]])
			b = append(b, `,"finish_reason":null,"stop_reason":null,"prompt_token_ids":`...)
			b = appendIDsOrNull(b, p.prompt(c.prompt), p.returnIDs && st == 0)
			b = append(b, `,"token_ids":`...)
			b = appendIDsOrNull(b, c.ids[st:st+1], p.returnIDs && !p.dropIDs(st+1))
			p.buf = append(b, `}],"usage":null}`...)
			if sse(w, p.buf) != nil {
				return
			}
			if st == len(c.ids)-1 {
				b = p.appendPrefix(p.buf[:0], "cmpl-", "text_completion")
				b = append(b, `{"index":`...)
				b = strconv.AppendInt(b, int64(i), 10)
				b = append(b, `,"text":"","logprobs":null,"finish_reason":"`...)
				b = append(b, c.finish...)
				b = append(b, `","stop_reason":null,"prompt_token_ids":null,"token_ids":`...)
				b = appendIDsOrNull(b, nil, p.returnIDs)
				p.buf = append(b, `}],"usage":null}`...)
				if sse(w, p.buf) != nil {
					return
				}
			}
		}
	}
	if p.includeUsage {
		b := p.appendPrefix(p.buf[:0], "cmpl-", "text_completion")
		b = append(b, `],"usage":`...)
		b = appendUsage(b, p.promptTokens(), p.completionTokens())
		p.buf = append(b, '}')
		if sse(w, p.buf) != nil {
			return
		}
	}
	_ = sse(w, doneEvent)
}
