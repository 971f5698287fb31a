package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export/arrays"
	"github.com/rollgate/rollgate/gateway/backends"
	"github.com/rollgate/rollgate/gateway/tokenin"
)

// Streamed token-in calls (stream: true): the engine streams its generate
// answer (engines.TokenIn's ParseGenerateChunk reads each event) and
// derenders chunk by chunk with a state it returns (DerenderStreamBody,
// DerenderStreamAnswer); vLLM 0.32.0's forms are in engines/vllm.
//
// The gateway turns that into the stream vLLM's chat serving would have sent
// with the gateway's injected fields (chat_completion/serving.py): a first
// chunk with the role and prompt_token_ids, then one chunk per generate
// chunk with the derendered delta, token_ids and logprobs, the finish
// reason on the last, the usage chunk and [DONE]; the stream body
// (streambody.go) then strips and captures it as any vLLM stream.

// tokenInStreamCall is what a streamed token-in call needs once its prompt
// is decided.
type tokenInStreamCall struct {
	genBody  []byte   // the generate request (render's answer, RenderAnswer's; prompt ids not set)
	prompt   []uint32 // the prompt ids sent
	chatReq  []byte   // the chat request as sent to the engine (injected fields included)
	outcome  string   // the token_in column's value
	deadline time.Time
	from     *fasthttp.Request // the call's upstream request: its headers go to generate
	n        int               // choices asked for
	// put records the answers for the attempt's next call.
	put func(choices []tokenin.Choice)
}

// serveTokenInStream starts a streamed generate call and leaves in resp an
// SSE body (text/event-stream) that a goroutine fills with the chat chunks
// (tokenInPump). An engine error status answers as it is. The error is a
// transport error of the generate request, for the caller's retry policy.
func (s *Server) serveTokenInStream(c *call, r *backends.Upstream, ti engines.TokenIn, resp *fasthttp.Response, tc tokenInStreamCall) error {
	opts := engines.GenerateOptions{Stream: true}
	if so := gjson.GetBytes(tc.chatReq, "stream_options"); so.IsObject() {
		opts.StreamOptions = []byte(so.Raw)
	}
	var rs *resumeState
	if tc.n <= 1 { // resumable after a pause in mode abort (resume.go)
		rs = newResumeState(c, r)
		opts.RequestID = rs.id
	}
	body, err := ti.GenerateBody(tc.genBody, tc.prompt, opts)
	if err != nil {
		return err
	}
	if rs != nil {
		rs.genBody = body
		rs.keepTrace(tc.from)
	}
	gen, err := s.startGenerate(r, ti, body, tc.from, tc.deadline)
	if err != nil {
		s.tokenInFailed(c, tc.outcome, err)
		return err
	}
	s.noteTokenIn(c, tc.outcome)
	if status := gen.StatusCode(); status != fasthttp.StatusOK {
		// The engine's own error (a prompt over the context, bad sampling
		// parameters) reaches the client as it is.
		out, rerr := readAll(gen, s.cfg.MaxResponseBodyBytes)
		abortResponse(gen, errTokenIn)
		if rerr != nil {
			return rerr
		}
		resp.SetStatusCode(status)
		resp.Header.SetContentType("application/json")
		resp.SetBody(out)
		return nil
	}
	pr, pw := io.Pipe()
	resp.SetStatusCode(fasthttp.StatusOK)
	resp.Header.SetContentType("text/event-stream")
	resp.SetBodyStream(pr, -1)
	p := &tokenInPump{s: s, r: r, ti: ti, tc: tc, w: pw, named: gjson.GetBytes(tc.chatReq, "tool_choice").IsObject(), ch: make([]pumpChoice, max(tc.n, 1))}
	p.tail = ti.DerenderStreamTail(tc.prompt, tc.chatReq)
	p.tc.chatReq, p.tc.genBody, p.tc.from = nil, nil, nil // pooled buffers: the handler reuses them once it returns
	if tl := gjson.GetBytes(tc.chatReq, "top_logprobs"); tl.Type == gjson.Number && tl.Num > 0 {
		p.topLogprobs = int(tl.Num)
	}
	if rs != nil {
		p.rs = rs
		s.resumables.add(s, rs)
	}
	go p.run(gen)
	return nil
}

// startGenerate sends a streamed generate request (body) to replica r, with
// from's headers (nil: none), and returns the engine's answer, its body
// still streaming.
func (s *Server) startGenerate(r *backends.Upstream, ti engines.TokenIn, body []byte, from *fasthttp.Request, deadline time.Time) (*fasthttp.Response, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	tokenInRequest(req, r, r.Origin()+ti.TokenInPaths().Generate, body, from)
	gen := fasthttp.AcquireResponse()
	gen.StreamBody = true
	err := s.transport.doStream(r.Client(), req, gen, deadline)
	if err != nil && staleConn(err) {
		r.Client().CloseIdleConnections() // see tokenInPost
		gen.Reset()
		gen.StreamBody = true
		err = s.transport.doStream(r.Client(), req, gen, deadline)
	}
	if err != nil {
		fasthttp.ReleaseResponse(gen)
		return nil, err
	}
	return gen, nil
}

// tokenInPump reads one streamed generate answer, derenders each chunk and
// writes the chat chunks to the client's pipe.
type tokenInPump struct {
	s           *Server
	r           *backends.Upstream
	ti          engines.TokenIn // r's kind's
	tc          tokenInStreamCall
	w           *io.PipeWriter
	named       bool // tool_choice names a function: the finish reason stays "stop"
	topLogprobs int  // the client's top_logprobs
	tail        []byte
	rs          *resumeState // nil: not resumable (n > 1)

	id      string // the chat chunks' id, model and created (derender's)
	model   string
	created int64
	out     []byte
	ch      []pumpChoice // by choice index
}

// pumpChoice is one choice's stream: generate streams each choice in
// chunks of its own, and derender's state is per choice.
type pumpChoice struct {
	state   []byte // derender's stream_state, nil before the first chunk
	ids     []uint32
	content []byte
	calls   []streamedCall
	ended   bool
	done    bool // its finish chunk came
}

// streamedCall is a tool call assembled from a stream's deltas.
type streamedCall struct {
	id, name string
	args     []byte
}

// errStreamCut is the error event of a generate stream that ended without
// [DONE] (the engine went away mid-answer).
var errStreamCut = errors.New("the engine's generate stream ended before data: [DONE]")

// run pumps the generate stream to the pipe. The client going away (a
// failed pipe write: streamBody closed the pipe) closes the generate
// connection so the engine aborts the generation; an engine or derender
// failure mid-stream reaches the client as an SSE error event.
func (p *tokenInPump) run(gen *fasthttp.Response) {
	defer func() {
		if rec := recover(); rec != nil {
			p.s.log.Error("panic while streaming a token-in answer; stream ended", "panic", rec)
			if gen != nil {
				abortResponse(gen, errTokenIn)
			}
			p.rs.settle(p.s)
			_ = p.w.CloseWithError(fmt.Errorf("internal error: %v", rec))
		}
	}()
	if p.rs != nil {
		defer p.s.resumables.remove(p.rs)
	}
	for gen != nil && p.pump(gen) { // parked by a pause in mode abort
		var err error
		gen = nil
		p.rs.park(p.s)
		if gen, err = p.resume(); err != nil {
			p.fail(fmt.Errorf("resuming at response token %d: %w", len(p.ch[0].ids), err))
			return
		}
	}
}

// pump pumps one generate stream to the pipe; parked true: the gateway
// aborted it for a pause in mode abort and the client's stream stays open.
func (p *tokenInPump) pump(gen *fasthttp.Response) (parked bool) {
	var sc capture.SSEScanner
	body := gen.BodyStream()
	buf := make([]byte, 4<<10)
	var failure error
	done := false
	for !done && failure == nil {
		n, rerr := body.Read(buf)
		sc.Feed(buf[:n])
		for !done && failure == nil {
			ev, ok := sc.Next()
			if !ok {
				break
			}
			if ev.Data == nil {
				continue
			}
			var werr error
			done, werr, failure = p.event(ev.Data)
			if werr != nil { // the client went away
				abortResponse(gen, errClientGone)
				p.rs.settle(p.s)
				_ = p.w.CloseWithError(werr)
				return false
			}
		}
		if failure == nil && len(sc.Rest()) > p.s.cfg.MaxResponseBodyBytes {
			failure = fmt.Errorf("%w: a generate stream event larger than %d bytes (raise max_response_body_bytes)", errTokenIn, p.s.cfg.MaxResponseBodyBytes)
		}
		if !done && failure == nil && rerr != nil {
			failure = rerr
			if errors.Is(rerr, io.EOF) {
				failure = errStreamCut
			}
		}
	}
	if failure != nil {
		abortResponse(gen, failure)
		p.fail(failure)
		return false
	}
	// The client has its answer (or, parked, waits for the rest); then the
	// body is read to its end (the chunked terminator after [DONE]) so its
	// connection goes back to the pool clean. An engine that sends more than
	// 64 KiB after [DONE] has its connection closed instead.
	parked = p.rs.isParked()
	if !parked {
		p.rs.settle(p.s)
		_ = p.w.Close()
	}
	if n, err := io.Copy(io.Discard, io.LimitReader(body, 64<<10)); err != nil || n == 64<<10 {
		abortResponse(gen, errStreamCut)
		return parked
	}
	fasthttp.ReleaseResponse(gen)
	return parked
}

// fail ends the client's stream with an error event naming the backend and
// the failure, then [DONE].
func (p *tokenInPump) fail(failure error) {
	p.s.log.Warn("token-in: stream failed", "backend", p.r.Name(), "err", failure)
	msg := fmt.Sprintf("backend %s: token-in stream: %v", p.r.Name(), failure)
	ev := append([]byte("data: "), appendError(nil, fasthttp.StatusBadGateway, errUpstream, msg)...)
	p.rs.settle(p.s)
	if _, err := p.w.Write(append(ev, "\n\ndata: [DONE]\n\n"...)); err != nil {
		_ = p.w.CloseWithError(err)
		return
	}
	_ = p.w.Close()
}

// event handles one generate SSE event: done after [DONE]; werr when the
// client cannot be written to; failure when the stream cannot go on.
func (p *tokenInPump) event(data []byte) (done bool, werr, failure error) {
	if string(data) == "[DONE]" {
		if p.rs.isParked() {
			return true, nil, nil // the aborted generation's end: the client's stream goes on
		}
		return true, p.write([]byte("[DONE]")), nil
	}
	g, err := p.ti.ParseGenerateChunk(data)
	switch {
	case err != nil:
		return false, nil, err
	case g.Error:
		// The engine's error event (a generation error) goes on as it is.
		return false, p.write(data), nil
	case !g.HasChoice:
		if g.Usage.IsObject() && !p.rs.isParked() {
			p.out = p.appendHead(p.out[:0], g.RequestID)
			p.out = append(p.out, `[],"usage":`...)
			p.out = append(append(p.out, p.rs.fixUsage(g.Usage)...), '}')
			return false, p.write(p.out), nil
		}
		return false, nil, nil
	}
	ch := g.Choice
	if ch.Index < 0 || ch.Index >= len(p.ch) || p.ch[ch.Index].done {
		return false, nil, fmt.Errorf("%w: a generate stream chunk for choice %d of %d", errTokenIn, ch.Index, len(p.ch))
	}
	c := &p.ch[ch.Index]
	ids := ch.IDs
	parked := p.rs.parkOn(ch.Finish)
	if parked { // aborted by the gateway: no finish for the client
		if len(ids) == 0 {
			return false, nil, nil
		}
		ch.Finish = ""
	}
	chunk, err := p.derender(c, data, ch, parked)
	if err != nil {
		return false, nil, err
	}
	dch := chunk.Get("choices.0")
	if p.id == "" {
		p.id, p.model, p.created = chunk.Get("id").String(), chunk.Get("model").String(), chunk.Get("created").Int()
		for i := range p.ch {
			if werr := p.write(p.appendRoleChunk(p.out[:0], i)); werr != nil {
				return false, werr, nil
			}
		}
	}
	c.ids = append(c.ids, ids...)
	out := p.appendHead(p.out[:0], g.RequestID)
	out = strconv.AppendInt(append(out, `[{"index":`...), int64(ch.Index), 10)
	out = append(out, `,"delta":`...)
	out = appendDelta(out, dch.Get("delta"), c)
	out = append(out, `,"logprobs":`...)
	out = p.appendLogprobs(out, dch.Get("logprobs"), ch.Logprobs)
	if ch.Finish == "" {
		out = append(out, `,"finish_reason":null`...)
	} else {
		// The engine's reason, "tool_calls" for a stop after streamed tool
		// calls unless the tool choice names a function, as vLLM's chat
		// serving streams it (chat_completion/serving.py, 0.32.0). Not
		// derender's: it says "tool_calls" for any finish once a call
		// streamed, an answer cut by max_tokens included
		// (online_derenderer.py _derender_chat_stream_parsed).
		reason := ch.Finish
		if reason == "stop" && len(c.calls) > 0 && !p.named {
			reason = "tool_calls"
		}
		out = appendJSONString(append(out, `,"finish_reason":`...), reason)
		out = append(out, `,"stop_reason":`...)
		if st := ch.StopReason; st.Type == gjson.String || st.Type == gjson.Number {
			out = append(out, st.Raw...)
		} else {
			out = append(out, "null"...)
		}
		c.done, c.ended = true, ch.EndedOnTurn
		p.remember()
	}
	out = append(out, `,"token_ids":`...)
	out = arrays.AppendUint32s(out, ids)
	out = append(out, "}]"...)
	if u := g.Usage; u.IsObject() { // continuous_usage_stats
		out = append(append(out, `,"usage":`...), p.rs.fixUsage(u)...)
	}
	p.out = append(out, '}')
	return false, p.write(p.out), nil
}

// derender sends one generate chunk (data, its choice read as ch; parked:
// it ends a generation the gateway aborted) to the streaming derender and keeps the state it returns; it returns the chat
// chunk.
func (p *tokenInPump) derender(c *pumpChoice, data []byte, ch engines.GenChoice, parked bool) (gjson.Result, error) {
	body, err := p.ti.DerenderStreamBody(make([]byte, 0, len(data)+len(c.state)+len(p.tail)+64), data, ch, parked, c.state, p.tail)
	if err != nil {
		return gjson.Result{}, err
	}
	out, status, err := p.s.tokenInPost(p.r, p.r.Origin()+p.r.BasePath()+p.ti.TokenInPaths().Derender, body, time.Now().Add(p.s.cfg.UpstreamTimeout), nil, nil)
	if err != nil {
		return gjson.Result{}, fmt.Errorf("derender: %w", err)
	}
	if status != fasthttp.StatusOK {
		return gjson.Result{}, fmt.Errorf("%w: derender answered HTTP %d: %s", errTokenIn, status, truncate(string(out), 300))
	}
	chunk, state, err := p.ti.DerenderStreamAnswer(out)
	if err != nil {
		return gjson.Result{}, err
	}
	c.state = append(c.state[:0], state.Raw...)
	return chunk, nil
}

// appendHead appends a chunk's members up to the opening of its choices.
func (p *tokenInPump) appendHead(dst []byte, requestID string) []byte {
	id := p.id
	if id == "" {
		id = requestID
	}
	dst = append(dst, `{"id":`...)
	dst = appendJSONString(dst, id)
	dst = append(dst, `,"object":"chat.completion.chunk","created":`...)
	dst = strconv.AppendInt(dst, p.created, 10)
	dst = append(dst, `,"model":`...)
	dst = appendJSONString(dst, p.model)
	return append(dst, `,"choices":`...)
}

// appendRoleChunk appends vLLM's first chat chunk of choice i: the role,
// empty content and (return_token_ids) the prompt ids.
func (p *tokenInPump) appendRoleChunk(dst []byte, i int) []byte {
	dst = p.appendHead(dst, "")
	dst = strconv.AppendInt(append(dst, `[{"index":`...), int64(i), 10)
	dst = append(dst, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":`...)
	dst = arrays.AppendUint32s(dst, p.tc.prompt)
	return append(dst, `,"prompt_text":null}`...)
}

// appendDelta appends derender's delta as vLLM's chat serving writes one
// (no null members; "content": null beside tool calls) and assembles
// choice c's answer: the role is the role chunk's, so it is dropped here.
func appendDelta(dst []byte, d gjson.Result, c *pumpChoice) []byte {
	content, reasoning := d.Get("content"), d.Get("reasoning")
	calls := d.Get("tool_calls").Array()
	if content.Type == gjson.String {
		c.content = append(c.content, content.Str...)
	}
	if len(calls) == 0 {
		switch {
		case reasoning.Type == gjson.String && reasoning.Str != "":
			dst = append(dst, `{"reasoning":`...)
			dst = appendJSONString(dst, reasoning.Str)
			return append(dst, '}')
		case content.Type == gjson.String && content.Str != "":
			dst = append(dst, `{"content":`...)
			dst = appendJSONString(dst, content.Str)
			return append(dst, '}')
		}
		return append(dst, "{}"...)
	}
	dst = append(dst, `{"content":`...)
	if content.Type == gjson.String && content.Str != "" {
		dst = appendJSONString(dst, content.Str)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"tool_calls":[`...)
	for i, tc := range calls {
		if i > 0 {
			dst = append(dst, ',')
		}
		idx := int(tc.Get("index").Int())
		if idx < 0 || idx > len(c.calls) {
			idx = len(c.calls) // a parser's index past the calls seen: a new call
		}
		if idx == len(c.calls) {
			c.calls = append(c.calls, streamedCall{})
		}
		sc := &c.calls[idx]
		dst = append(dst, '{')
		if id := tc.Get("id"); id.Type == gjson.String {
			sc.id = id.Str
			dst = append(append(dst, `"id":`...), appendJSONString(nil, id.Str)...)
			dst = append(dst, `,"type":"function",`...)
		}
		dst = strconv.AppendInt(append(dst, `"index":`...), int64(idx), 10)
		dst = append(dst, `,"function":{`...)
		sep := ""
		if name := tc.Get("function.name"); name.Type == gjson.String {
			sc.name += name.Str
			dst = append(append(dst, `"name":`...), appendJSONString(nil, name.Str)...)
			sep = ","
		}
		if args := tc.Get("function.arguments"); args.Type == gjson.String && args.Str != "" {
			sc.args = append(sc.args, args.Str...)
			dst = append(append(dst, sep+`"arguments":`...), appendJSONString(nil, args.Str)...)
		}
		dst = append(dst, "}}"...)
	}
	return append(dst, "]}"...)
}

// appendLogprobs appends a chunk's chat logprobs: derender's when it
// resolved them (a server without a parser), else the generate chunk's
// (vLLM's parsed derender path gives none) with each token named
// "token_id:ID" (vLLM's return_tokens_as_token_ids form) and the client's
// top_logprobs alternatives. gen are the engine's entries (GenChoice.Logprobs).
func (p *tokenInPump) appendLogprobs(dst []byte, der, gen gjson.Result) []byte {
	if der.IsObject() && der.Get("content").IsArray() {
		return append(dst, der.Raw...)
	}
	if !gen.IsArray() {
		return append(dst, "null"...)
	}
	entry := func(dst []byte, e gjson.Result) []byte {
		dst = append(dst, `{"token":"token_id:`...)
		dst = strconv.AppendUint(dst, e.Get("token_id").Uint(), 10)
		dst = append(dst, `","logprob":`...)
		if lp := e.Get("logprob"); lp.Type == gjson.Number {
			dst = strconv.AppendFloat(dst, lp.Num, 'g', -1, 64)
		} else {
			dst = append(dst, "null"...)
		}
		return append(dst, `,"bytes":null`...)
	}
	dst = append(dst, `{"content":[`...)
	for i, e := range gen.Array() {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(entry(dst, e), `,"top_logprobs":[`...)
		for j, t := range e.Get("top_logprobs").Array() {
			if j >= p.topLogprobs {
				break
			}
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(entry(dst, t), '}')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}

// remember records the streamed answers for the attempt's next call once
// every choice has finished.
func (p *tokenInPump) remember() {
	choices := make([]tokenin.Choice, 0, len(p.ch))
	for i := range p.ch {
		c := &p.ch[i]
		if !c.done {
			return
		}
		answer, err := tokenin.CanonicalAnswer(assembledMessage(c))
		if err != nil {
			return
		}
		choices = append(choices, tokenin.Choice{Answer: answer, Response: slices.Clone(c.ids), Ended: c.ended})
	}
	p.tc.put(choices)
}

// assembledMessage is the assistant message a client assembles from choice
// c's deltas.
func assembledMessage(ch *pumpChoice) []byte {
	msg := []byte(`{"role":"assistant","content":`)
	msg = appendJSONString(msg, string(ch.content))
	if len(ch.calls) > 0 {
		msg = append(msg, `,"tool_calls":[`...)
		for i, c := range ch.calls {
			if i > 0 {
				msg = append(msg, ',')
			}
			msg = append(append(msg, `{"id":`...), appendJSONString(nil, c.id)...)
			msg = append(append(msg, `,"type":"function","function":{"name":`...), appendJSONString(nil, c.name)...)
			msg = append(append(msg, `,"arguments":`...), appendJSONString(nil, string(c.args))...)
			msg = append(msg, "}}"...)
		}
		msg = append(msg, ']')
	}
	return append(msg, '}')
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	b, err := json.Marshal(s)
	if err != nil { // invalid UTF-8 is replaced, never an error
		return append(dst, `""`...)
	}
	return append(dst, b...)
}

// write sends one SSE event with data to the client's pipe.
func (p *tokenInPump) write(data []byte) error {
	ev := make([]byte, 0, len(data)+8)
	ev = append(ev, "data: "...)
	ev = append(ev, data...)
	_, err := p.w.Write(append(ev, "\n\n"...))
	return err
}
