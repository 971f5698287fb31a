package mock

import (
	"bufio"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// planChoice is one generated output sequence.
type planChoice struct {
	v      *vocabulary // the server's (the text of ids)
	ids    []uint32
	prompt int    // index of the prompt this choice answers (completions)
	finish string // "stop", "length" or "tool_calls"
	seed   uint64 // drives the text and the logprobs
	offset int    // running text offset while streaming (completions logprobs)

	// eos: the last id is the end-of-turn token (Config.EndOfTurn), not part of the
	// text; a text choice sends it with its finish chunk, unless eosStep says the
	// engine sends it as a step of its own (llama.cpp completion streams).
	eos, eosStep bool
	// Stop string (stop.go): the matched string, the length of the text kept, and the
	// text each stream step sends (nil: each token's own text).
	stopStr  string
	textLen  int
	stepText []string
	// hidden marks the tokens llama.cpp never sends nor lists in logprobs (the text
	// ends inside a character, splitchar.go); nil when none.
	hidden []bool

	// Tool call (chat only): ids = prefix ids + argument ids + suffix ids.
	tool             bool
	nPrefix, nSuffix int
	name             []byte
	callID           uint64
	args             []byte

	// perToken (vLLM): a stream sends one output per sampled token and the
	// last one rides on the finish chunk, so steps() counts every id and the
	// wire's finish writes the last step (chat_completion/serving.py and
	// completion/serving.py, vLLM 0.32.0).
	perToken bool
	// nameAt and argDiff: what vLLM's hermes tool parser streams for a tool
	// call, token by token (hermes.go): the step that completes the name, and
	// the argument text each step adds.
	hermes  bool
	nameAt  int
	argDiff []string
}

// steps returns how many streamed token steps the choice takes.
func (c *planChoice) steps() int {
	if c.perToken {
		return len(c.ids)
	}
	if c.tool {
		return 1 + len(c.ids) - c.nPrefix - c.nSuffix
	}
	if c.eos && !c.eosStep {
		return len(c.ids) - 1
	}
	return len(c.ids)
}

// stepRange returns the ids c.ids[from:to] sent by stream step st: one token, or for a
// tool call the prefix ids (step 0) and then one argument token per step.
func (c *planChoice) stepRange(st int) (from, to int) {
	switch {
	case !c.tool:
		return st, st + 1
	case st == 0:
		return 0, c.nPrefix
	}
	from = c.nPrefix + st - 1
	return from, from + 1
}

// finishRange returns the ids c.ids[from:to] sent with the finish chunk: none, the
// suffix ids of a tool call (with its end-of-turn token), or a text choice's
// end-of-turn token.
func (c *planChoice) finishRange() (from, to int) {
	switch {
	case c.tool:
		return len(c.ids) - c.nSuffix, len(c.ids)
	case c.eos && !c.eosStep:
		return len(c.ids) - 1, len(c.ids)
	}
	return len(c.ids), len(c.ids)
}

// plan is everything needed to answer a generation request, computed up front so that the
// stream writer never touches the request. Plans are pooled.
type plan struct {
	s         *Server
	id        [32]byte // hex
	model     []byte
	prompts   []uint32 // concatenated prompt ids
	promptOff []int    // prompt i is prompts[promptOff[i]:promptOff[i+1]]
	choices   []planChoice

	returnIDs, logprobs, asTokenIDs, includeUsage bool
	stream                                        bool // a streamed generate (token-in)
	genPromptIDs                                  bool // a generate request's return_token_ids: prompt ids on its first chunk
	continuousUsage                               bool // usage on every chunk (vLLM)
	namedTool, requiredTool                       bool // tool_choice names a tool, or is "required"
	realThink, realTools                          bool // real-template mode: parse reasoning, tool calls (real.go)
	topLogprobs                                   int
	stops                                         []string // the request's stop strings
	k                                             knobs
	cached                                        int // prompt tokens served from the prefix cache

	// Responses API echoes.
	temperature float64
	maxOutput   int

	buf   []byte
	text  []byte
	timer *time.Timer

	abort   <-chan struct{} // closed by PathAbortRequests (a streamed generate); nil otherwise
	unabort func()          // removes the request from the abortable set
}

var planPool = sync.Pool{New: func() any { return new(plan) }}

func acquirePlan(s *Server, k *knobs) *plan {
	p := planPool.Get().(*plan)
	p.s = s
	p.k = *k
	p.model = p.model[:0]
	p.prompts = p.prompts[:0]
	p.promptOff = append(p.promptOff[:0], 0)
	p.choices = p.choices[:0]
	p.returnIDs, p.logprobs, p.asTokenIDs, p.includeUsage = false, false, false, false
	p.continuousUsage, p.namedTool, p.requiredTool = false, false, false
	p.realThink, p.realTools = false, false
	p.stream, p.genPromptIDs = false, false
	p.topLogprobs = 0
	p.stops = p.stops[:0]
	p.cached = 0
	return p
}

func (p *plan) release() {
	if p.unabort != nil {
		p.unabort()
	}
	p.abort, p.unabort = nil, nil
	p.s = nil
	planPool.Put(p)
}

// prompt returns the ids of prompt i.
func (p *plan) prompt(i int) []uint32 { return p.prompts[p.promptOff[i]:p.promptOff[i+1]] }

func (p *plan) numPrompts() int { return len(p.promptOff) - 1 }

// endPrompt closes the prompt whose ids were appended to p.prompts since the last call.
func (p *plan) endPrompt() { p.promptOff = append(p.promptOff, len(p.prompts)) }

// addChoice appends a choice, reusing its slices from earlier requests.
func (p *plan) addChoice() *planChoice {
	if len(p.choices) < cap(p.choices) {
		p.choices = p.choices[:len(p.choices)+1]
	} else {
		p.choices = append(p.choices, planChoice{})
	}
	c := &p.choices[len(p.choices)-1]
	*c = planChoice{v: p.s.v, ids: c.ids[:0], name: c.name[:0], args: c.args[:0], argDiff: c.argDiff[:0]}
	return c
}

func (p *plan) setModel(f *fields) {
	if f.model == "" {
		p.model = append(p.model, p.s.cfg.Model...)
	} else {
		p.model = append(p.model, f.model...)
	}
}

func (p *plan) setID(h hasher) {
	a := h.sum()
	b := mix64(a ^ 0x5851f42d4c957f2d)
	appendHex(appendHex(p.id[:0], a), b)
}

func (p *plan) promptTokens() int { return len(p.prompts) }

func (p *plan) completionTokens() int {
	n := 0
	for i := range p.choices {
		n += len(p.choices[i].ids)
	}
	return n
}

func (p *plan) maxSteps() int {
	m := 0
	for i := range p.choices {
		m = max(m, p.choices[i].steps())
	}
	return m
}

// checkContext returns vLLM's context-length error for a prompt of n tokens, or "".
func (p *plan) checkContext(n, limit int) string {
	maxLen := p.s.cfg.MaxModelLen
	if n >= maxLen || (limit != unset && n+limit > maxLen) {
		want := n
		if limit != unset {
			want += limit
		}
		return "This model's maximum context length is " + strconv.Itoa(maxLen) +
			" tokens. However, you requested " + strconv.Itoa(want) + " tokens (" + strconv.Itoa(n) +
			" in the messages, " + strconv.Itoa(max(limit, 0)) + " in the completion). Please reduce the length of the messages or completion."
	}
	return ""
}

// outputLen returns the number of tokens to generate and the finish reason.
func (p *plan) outputLen(limit int) (int, string) {
	if limit != unset && limit < p.k.tokens {
		return limit, "length"
	}
	return p.k.tokens, "stop"
}

// appendPrefix appends `{"id":"<idPrefix><hex>","object":"<object>","created":C,"model":"M","choices":[`.
func (p *plan) appendPrefix(dst []byte, idPrefix, object string) []byte {
	dst = append(dst, `{"id":"`...)
	dst = append(dst, idPrefix...)
	dst = append(dst, p.id[:]...)
	dst = append(dst, `","object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, p.s.cfg.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, b2s(p.model))
	return append(dst, `,"choices":[`...)
}

// appendTokenString appends the JSON string shown for token id in logprobs.
func (p *plan) appendTokenString(dst []byte, id uint32) []byte {
	if p.asTokenIDs {
		dst = append(dst, `"token_id:`...)
		dst = strconv.AppendUint(dst, uint64(id), 10)
		return append(dst, '"')
	}
	return appendJSONString(dst, p.s.v.pieces[id])
}

// delay waits as a non-streaming response would take: TTFT plus ITL per further step. It
// ends early with errClientLeft when the client closes the connection meanwhile (the
// request is then counted as aborted).
func (p *plan) delay(ctx *fasthttp.RequestCtx) error {
	d := p.k.ttft
	if n := p.maxSteps(); n > 1 {
		d += time.Duration(n-1) * p.k.itl
	}
	if d <= 0 {
		return nil
	}
	s := p.s
	s.generating.Add(1)
	defer s.generating.Add(-1)
	w := watchPeer(ctx.Conn())
	start := time.Now()
	err := s.waitOrAbort(&p.timer, d, w.leftCh(), p.abort)
	w.stop()
	if errors.Is(err, errAborted) { // a generate request aborted: its ids so far
		p.cutAborted(time.Since(start))
		return nil
	}
	if errors.Is(err, errClientLeft) {
		s.aborted.Add(1)
	}
	return err
}

// respond writes the non-streaming body produced by render, or a stream produced by streamFn.
func (p *plan) respond(ctx *fasthttp.RequestCtx, stream bool, render func(*plan, []byte) []byte, streamFn func(*plan, *bufio.Writer)) {
	if !stream {
		defer p.release()
		if p.k.midstream {
			p.s.writeError(ctx, fasthttp.StatusInternalServerError, "mock failure: midstream requested by x-mock-fail")
			return
		}
		if p.k.broken != "" {
			p.buf = render(p, p.buf[:0])
			body := p.buf[:len(p.buf)/2] // badjson, truncate: cut short
			if p.k.broken == "junk" {
				body = []byte("<html>upstream proxy error</html>")
			}
			writeJSON(ctx, body)
			return
		}
		if err := p.delay(ctx); err != nil {
			if errors.Is(err, errClientLeft) { // aborted: nothing is sent
				ctx.HijackSetNoResponse(true)
				ctx.Hijack(func(net.Conn) {}) // fasthttp closes the connection after this returns
				return
			}
			p.s.writeError(ctx, fasthttp.StatusServiceUnavailable, err.Error())
			return
		}
		p.buf = render(p, p.buf[:0])
		writeJSON(ctx, p.buf)
		return
	}
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	p.s.streams.Add(1)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		s := p.s
		defer s.streams.Add(-1)
		defer p.release()
		streamFn(p, w)
	})
}

// wire is one stream format: role writes the opening chunk of a choice (nil: none, as in
// completions), chunk the chunk of one step, finish a choice's last chunk, usage the final
// usage chunk. Each appends one SSE payload to dst.
type wire struct {
	role   func(p *plan, dst []byte, i int) []byte
	chunk  func(p *plan, dst []byte, i int, c *planChoice, st int) []byte
	finish func(p *plan, dst []byte, i int, c *planChoice) []byte
	usage  func(p *plan, dst []byte) []byte
}

// streamWith writes a chat or completion stream in format wr: after TTFT the role chunks,
// then per step one chunk per unfinished choice (ITL between steps), each choice's finish
// chunk right after its last step, the usage chunk if asked, then [DONE]. The failure
// knobs act before step 3 (or the last step).
func (p *plan) streamWith(w *bufio.Writer, wr *wire) {
	p.s.enginePause.wait(false, p.abort, p.s.done) // a paused engine schedules nothing new
	if p.s.wait(&p.timer, p.k.ttft) != nil {
		return
	}
	if wr.role != nil {
		for i := range p.choices {
			p.buf = wr.role(p, p.buf[:0], i)
			if sse(w, p.buf) != nil {
				return
			}
		}
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
		if st > 0 && p.s.waitOrLeave(&p.timer, p.k.itl, p.abort) != nil && !p.aborted() {
			return
		}
		p.s.enginePause.wait(true, p.abort, p.s.done) // mode keep: frozen between two tokens
		if p.aborted() {
			p.streamAborted(w, st)
			return
		}
		for i := range p.choices {
			c := &p.choices[i]
			n := c.steps()
			if st >= n {
				continue
			}
			// An empty payload: the engine sends no chunk for this step.
			if p.buf = wr.chunk(p, p.buf[:0], i, c, st); len(p.buf) > 0 && sse(w, p.buf) != nil {
				return
			}
			if st == n-1 {
				p.buf = wr.finish(p, p.buf[:0], i, c)
				if sse(w, p.buf) != nil {
					return
				}
			}
		}
	}
	if p.includeUsage {
		p.buf = wr.usage(p, p.buf[:0])
		if sse(w, p.buf) != nil {
			return
		}
	}
	_ = sse(w, doneEvent)
}

// midstreamError is the event sent by x-mock-fail: midstream.
const midstreamError = `{"error":{"message":"mock failure: midstream requested by x-mock-fail","type":"InternalServerError","code":500}}`

// failStep returns the step before which a midstream failure happens, or -1.
func (p *plan) failStep(steps int) int {
	if !p.k.midstream {
		return -1
	}
	return max(0, min(3, steps-1))
}

// breakStep returns the step before which a broken-stream knob (badjson,
// junk, truncate) acts, or -1.
func (p *plan) breakStep(steps int) int {
	if p.k.broken == "" {
		return -1
	}
	return max(0, min(3, steps-1))
}

// breakStream writes what the broken-stream knob asks for and reports
// whether the stream ends there (truncate).
func (p *plan) breakStream(w *bufio.Writer) (end bool) {
	switch p.k.broken {
	case "badjson":
		_ = sse(w, []byte(`{"id":"chatcmpl-broken","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x`))
	case "junk":
		_, _ = w.WriteString("this line is not server-sent events\n\n")
		_ = w.Flush()
	case "truncate":
		_ = w.Flush()
		return true
	}
	return false
}

// dropIDs reports whether the ids of content chunk number n (1-based) are omitted.
func (p *plan) dropIDs(n int) bool {
	k := p.s.cfg.DropIDsEvery
	return k > 0 && n%k == 0
}

// wantIDs reads return_token_ids, honouring IgnoreReturnTokenIDs; llama.cpp ignores it.
func (p *plan) wantIDs(f *fields) bool {
	return f.returnIDs && !p.s.cfg.IgnoreReturnTokenIDs && p.s.cfg.Flavor != FlavorLlamaCpp
}

// wantTokenIDStrings reads return_tokens_as_token_ids, a vLLM-only field.
func (p *plan) wantTokenIDStrings(f *fields) bool {
	return f.asTokenIDs && p.s.cfg.Flavor == FlavorVLLM
}

// genText fills c with a text answer of up to limit tokens.
func (p *plan) genText(c *planChoice, limit int) {
	if p.s.v.real != nil {
		p.genReal(c, "", gjson.Result{}, limit)
		return
	}
	n, finish := p.outputLen(limit)
	c.ids = genTextIDs(c.ids, c.seed, n)
	c.finish = finish
	p.insertSplitChars(c)
	p.applyStop(c)
	p.endTurn(c, limit)
	p.holdBack(c)
}

// endTurn appends the end-of-turn token to a choice that stopped on its own, when
// Config.EndOfTurn is set, the output limit leaves room for it and the flavour is one
// whose behaviour was read (not SGLang).
func (p *plan) endTurn(c *planChoice, limit int) {
	if !p.s.cfg.EndOfTurn || p.s.cfg.Flavor == FlavorSGLang || c.finish == "length" || c.stopStr != "" {
		return
	}
	if limit != unset && len(c.ids) >= limit {
		// The end-of-turn token would be the next one sampled, but the
		// limit is reached first: vLLM finishes "length" (the scheduler's
		// max_tokens check, vllm/v1/core/sched/utils.py check_stop, 0.32.0)
		// and so does llama.cpp (n_predict: server-context.cpp).
		c.finish = "length"
		return
	}
	c.ids = append(c.ids, p.s.v.eot)
	c.eos = true
	if c.tool {
		c.nSuffix++
	}
}

// appendArgValue appends a deterministic JSON value conforming to the JSON schema.
func appendArgValue(dst []byte, schema gjson.Result, r *rng, depth int) []byte {
	if enum := schema.Get("enum"); enum.IsArray() {
		vals := enum.Array()
		if len(vals) > 0 {
			return appendCompactJSON(dst, vals[r.next()%uint64(len(vals))].Raw)
		}
	}
	typ := schema.Get("type")
	if typ.IsArray() { // ["string","null"]: take the first
		typ = typ.Get("0")
	}
	switch typ.Str {
	case "integer":
		return strconv.AppendUint(dst, r.next()%100, 10)
	case "number":
		return appendFloat(dst, float64(r.next()%1000)/10)
	case "boolean":
		return strconv.AppendBool(dst, r.next()%2 == 0)
	case "null":
		return append(dst, "null"...)
	case "array":
		if depth > 3 {
			return append(dst, "[]"...)
		}
		dst = append(dst, '[')
		dst = appendArgValue(dst, schema.Get("items"), r, depth+1)
		return append(dst, ']')
	case "object":
		if depth > 3 {
			return append(dst, "{}"...)
		}
		return appendToolArgs(dst, schema, r, depth+1)
	}
	w := genWords[r.next()%uint64(len(genWords))]
	return appendJSONString(dst, vocab[w][1:])
}

// appendToolArgs appends a JSON object with a value for every property of schema, in order.
func appendToolArgs(dst []byte, schema gjson.Result, r *rng, depth int) []byte {
	dst = append(dst, '{')
	first := true
	schema.Get("properties").ForEach(func(k, v gjson.Result) bool {
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendJSONString(dst, k.String())
		dst = append(dst, ':')
		dst = appendArgValue(dst, v, r, depth)
		return true
	})
	return append(dst, '}')
}
