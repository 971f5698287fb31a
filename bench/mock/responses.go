package mock

import (
	"bufio"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// Responses API (POST /v1/responses): one text output message, no token ids (vLLM gives
// none here). input is a string or a list of items (messages with a role, function_call,
// function_call_output); instructions become a system message. Tools are not called.
// "instructions" is echoed as null.

func (s *Server) responses(ctx *fasthttp.RequestCtx, k *knobs) {
	var f fields
	parseFields(ctx.PostBody(), &f)
	p := acquirePlan(s, k)
	if msg := p.buildResponses(&f); msg != "" {
		p.release()
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	p.respond(ctx, f.stream, (*plan).appendResponseFull, (*plan).streamResponse)
}

func (p *plan) buildResponses(f *fields) string {
	if f.err != "" {
		return f.err
	}
	if f.maxOutput != unset && f.maxOutput < 1 {
		return "max_output_tokens must be at least 1, got " + strconv.Itoa(f.maxOutput) + "."
	}
	in := f.input
	switch {
	case !in.Exists() || in.Type == gjson.Null:
		return "input: Field required"
	case in.Type != gjson.String && !in.IsArray():
		return "input: Input should be a valid string or a list of items"
	}
	t := p.text[:0]
	if f.instructions.Type == gjson.String && f.instructions.Str != "" {
		t = appendMessage(t, "system", f.instructions, gjson.Result{})
	}
	if in.Type == gjson.String {
		t = appendMessage(t, "user", in, gjson.Result{})
	} else {
		in.ForEach(func(_, item gjson.Result) bool {
			switch role, typ := item.Get("role"), item.Get("type").String(); {
			case role.Type == gjson.String:
				t = appendMessage(t, role.Str, item.Get("content"), gjson.Result{})
			case typ == "function_call_output":
				t = appendMessage(t, "tool", item.Get("output"), gjson.Result{})
			case typ == "function_call":
				t = append(t, "<|im_start|>assistant\n<tool_call>{\"name\":"...)
				t = appendJSONString(t, item.Get("name").String())
				t = append(t, `,"arguments":`...)
				t = append(t, item.Get("arguments").String()...)
				t = append(t, "}</tool_call><|im_end|>\n"...)
			}
			return true
		})
	}
	p.text = append(t, "<|im_start|>assistant\n"...)
	// The toy layout; in real-template mode encoded by the real tokenizer.
	p.prompts = p.s.v.encode(p.prompts, b2s(p.text))
	p.endPrompt()
	if msg := p.checkContext(len(p.prompts), f.maxOutput); msg != "" {
		return msg
	}
	p.setModel(f)
	p.temperature = 1
	if f.tempSet {
		p.temperature = f.temperature
	}
	p.maxOutput = f.maxOutput

	h := newHasher()
	h.str(b2s(p.model))
	h.str(b2s(p.text))
	f.seedHash(&h, p.s.cfg.Seed)
	c := p.addChoice()
	c.seed = mix64(h.sum())
	p.genText(c, f.maxOutput)
	h.u64(uint64(f.maxOutput))
	h.u64(uint64(p.k.tokens))
	p.setID(h)
	return ""
}

// appendMsgID appends the output message id "msg_<hex>".
func (p *plan) appendMsgID(dst []byte) []byte {
	dst = append(dst, `"msg_`...)
	dst = appendHex(dst, mix64(p.choices[0].seed^0x51))
	return append(dst, '"')
}

// appendMessageItem appends the output message item.
func (p *plan) appendMessageItem(dst []byte, done bool) []byte {
	dst = append(dst, `{"id":`...)
	dst = p.appendMsgID(dst)
	if !done {
		return append(dst, `,"content":[],"role":"assistant","status":"in_progress","type":"message"}`...)
	}
	dst = append(dst, `,"content":[`...)
	dst = p.appendOutputText(dst, true)
	return append(dst, `],"role":"assistant","status":"completed","type":"message"}`...)
}

func (p *plan) appendOutputText(dst []byte, done bool) []byte {
	dst = append(dst, `{"annotations":[],"text":"`...)
	if done {
		dst = p.s.v.appendText(dst, p.choices[0].ids)
	}
	dst = append(dst, `","type":"output_text","logprobs":`...)
	if done {
		return append(dst, "null}"...)
	}
	return append(dst, "[]}"...)
}

// appendResponseObj appends the response object; done selects the final form.
func (p *plan) appendResponseObj(dst []byte, done bool) []byte {
	c := &p.choices[0]
	dst = append(dst, `{"id":"resp_`...)
	dst = append(dst, p.id[:]...)
	dst = append(dst, `","created_at":`...)
	dst = strconv.AppendInt(dst, p.s.cfg.Created, 10)
	dst = append(dst, `,"incomplete_details":`...)
	status := "in_progress"
	if done {
		status = "completed"
		if c.finish == "length" {
			status = "incomplete"
			dst = append(dst, `{"reason":"max_output_tokens"}`...)
		} else {
			dst = append(dst, "null"...)
		}
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"instructions":null,"metadata":null,"model":`...)
	dst = appendJSONString(dst, b2s(p.model))
	dst = append(dst, `,"object":"response","output":[`...)
	if done {
		dst = p.appendMessageItem(dst, true)
	}
	dst = append(dst, `],"parallel_tool_calls":true,"temperature":`...)
	dst = appendFloat(dst, p.temperature)
	dst = append(dst, `,"tool_choice":"auto","tools":[],"top_p":1.0,"background":false,"max_output_tokens":`...)
	if p.maxOutput == unset {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendInt(dst, int64(p.maxOutput), 10)
	}
	dst = append(dst, `,"max_tool_calls":null,"previous_response_id":null,"prompt":null,"reasoning":null,"service_tier":"auto","status":"`...)
	dst = append(dst, status...)
	dst = append(dst, `","text":null,"top_logprobs":null,"truncation":"disabled","usage":`...)
	if done {
		dst = append(dst, `{"input_tokens":`...)
		dst = strconv.AppendInt(dst, int64(p.promptTokens()), 10)
		dst = append(dst, `,"input_tokens_details":{"cached_tokens":0},"output_tokens":`...)
		dst = strconv.AppendInt(dst, int64(len(c.ids)), 10)
		dst = append(dst, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		dst = strconv.AppendInt(dst, int64(p.promptTokens()+len(c.ids)), 10)
		dst = append(dst, '}')
	} else {
		dst = append(dst, "null"...)
	}
	return append(dst, `,"user":null}`...)
}

func (p *plan) appendResponseFull(dst []byte) []byte { return p.appendResponseObj(dst, true) }

// event writes one named SSE event and flushes it.
func event(w *bufio.Writer, name string, payload []byte) error {
	if _, err := w.WriteString("event: "); err != nil {
		return err
	}
	if _, err := w.WriteString(name); err != nil {
		return err
	}
	if _, err := w.WriteString("\n"); err != nil {
		return err
	}
	return sse(w, payload)
}

// eventHead appends `{"type":"<name>","sequence_number":N` and bumps *seq.
func eventHead(dst []byte, name string, seq *int) []byte {
	dst = append(dst, `{"type":"`...)
	dst = append(dst, name...)
	dst = append(dst, `","sequence_number":`...)
	dst = strconv.AppendInt(dst, int64(*seq), 10)
	*seq++
	return dst
}

// appendItemRef appends `,"item_id":"msg_..","output_index":0,"content_index":0`.
func (p *plan) appendItemRef(dst []byte) []byte {
	dst = append(dst, `,"item_id":`...)
	dst = p.appendMsgID(dst)
	return append(dst, `,"output_index":0,"content_index":0`...)
}

// streamResponse writes the Responses API event stream.
func (p *plan) streamResponse(w *bufio.Writer) {
	if p.s.wait(&p.timer, p.k.ttft) != nil {
		return
	}
	seq := 0
	emit := func(name string) bool { return event(w, name, p.buf) == nil }
	for _, name := range [...]string{"response.created", "response.in_progress"} {
		b := eventHead(p.buf[:0], name, &seq)
		b = append(b, `,"response":`...)
		b = p.appendResponseObj(b, false)
		p.buf = append(b, '}')
		if !emit(name) {
			return
		}
	}
	b := eventHead(p.buf[:0], "response.output_item.added", &seq)
	b = append(b, `,"output_index":0,"item":`...)
	b = p.appendMessageItem(b, false)
	p.buf = append(b, '}')
	if !emit("response.output_item.added") {
		return
	}
	b = eventHead(p.buf[:0], "response.content_part.added", &seq)
	b = p.appendItemRef(b)
	b = append(b, `,"part":`...)
	b = p.appendOutputText(b, false)
	p.buf = append(b, '}')
	if !emit("response.content_part.added") {
		return
	}
	c := &p.choices[0]
	failAt := p.failStep(len(c.ids))
	for st, id := range c.ids {
		if st == failAt {
			b = eventHead(p.buf[:0], "error", &seq)
			p.buf = append(b, `,"code":"internal_error","message":"mock failure: midstream requested by x-mock-fail","param":null}`...)
			_ = emit("error")
			return
		}
		if st > 0 && p.s.wait(&p.timer, p.k.itl) != nil {
			return
		}
		b = eventHead(p.buf[:0], "response.output_text.delta", &seq)
		b = p.appendItemRef(b)
		b = append(b, `,"delta":"`...)
		b = appendJSONStringBody(b, vocab[id])
		p.buf = append(b, `","logprobs":[]}`...)
		if !emit("response.output_text.delta") {
			return
		}
	}
	b = eventHead(p.buf[:0], "response.output_text.done", &seq)
	b = p.appendItemRef(b)
	b = append(b, `,"text":"`...)
	b = c.v.appendText(b, c.ids)
	p.buf = append(b, `","logprobs":[]}`...)
	if !emit("response.output_text.done") {
		return
	}
	b = eventHead(p.buf[:0], "response.content_part.done", &seq)
	b = p.appendItemRef(b)
	b = append(b, `,"part":`...)
	b = p.appendOutputText(b, true)
	p.buf = append(b, '}')
	if !emit("response.content_part.done") {
		return
	}
	b = eventHead(p.buf[:0], "response.output_item.done", &seq)
	b = append(b, `,"output_index":0,"item":`...)
	b = p.appendMessageItem(b, true)
	p.buf = append(b, '}')
	if !emit("response.output_item.done") {
		return
	}
	b = eventHead(p.buf[:0], "response.completed", &seq)
	b = append(b, `,"response":`...)
	b = p.appendResponseObj(b, true)
	p.buf = append(b, '}')
	_ = emit("response.completed")
}
