// The Assembler's non-streamed path (parseBody) and the building of the
// results: choices sorted, messages and the stream's equivalent JSON body.

package capture

import (
	"slices"
	"strconv"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export/arrays"
	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// parseBody reads a whole (valid) JSON response: a non-streaming body, or the
// final object of a Responses stream. Slices of the result point into body.
func (a *Assembler) parseBody(body []byte) {
	top := gjson.Parse(jsonscan.String(body))
	if !top.IsObject() {
		a.setErr("response body is not a JSON object")
		return
	}
	var choices, output, status, incomplete gjson.Result
	a.ends.eachMember(top.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "id":
			if v.Type == gjson.String {
				a.id = append(a.id[:0], v.Raw...)
			}
		case "object":
			a.guessKind(v)
			if decodeStr(v) == "error" {
				// Older vLLM and SGLang: {"object":"error","message":...}
				a.errorValue(top)
			}
		case "model":
			if v.Type == gjson.String {
				a.model = append(a.model[:0], v.Raw...)
			}
		case "created":
			if v.Type == gjson.Number {
				a.created = append(a.created[:0], v.Raw...)
			}
		case "choices":
			choices = v
		case "output":
			output = v
		case "status":
			status = v
		case "incomplete_details":
			incomplete = v
		case "usage":
			if v.IsObject() {
				a.usage = append(a.usage[:0], v.Raw...)
			}
		case "prompt_token_ids":
			if !a.hasPmt && v.IsArray() {
				a.prompt, a.hasPmt = appendIDs(a.prompt, v), true
			}
		case "error":
			a.errorValue(v)
		}
		return true
	})
	if a.kind == openai.Unknown && output.Exists() {
		a.kind = openai.Responses
	}
	switch a.kind {
	case openai.Embeddings:
		return
	case openai.Responses:
		if !output.Exists() && !status.Exists() {
			return
		}
		c := a.choice(0)
		if c == nil {
			return
		}
		if output.Exists() {
			c.view = jsonscan.Bytes(output.Raw) // points into body
		}
		if r := incomplete.Get("reason"); r.Type == gjson.String {
			c.finish = append(c.finish[:0], r.Raw...)
		} else if status.Type == gjson.String {
			c.finish = append(c.finish[:0], status.Raw...)
		}
		return
	}
	if !choices.IsArray() {
		return
	}
	a.ends.eachElem(choices.Raw, func(ch gjson.Result) bool {
		if !ch.IsObject() {
			return true
		}
		f := a.readChoice(ch)
		c := a.choice(clampU32(f.index))
		if c == nil {
			return true
		}
		switch {
		case f.message.IsObject():
			c.view = jsonscan.Bytes(f.message.Raw) // points into body
		case f.text.Type == gjson.String:
			c.message = append(c.message[:0], `{"text":`...)
			c.message = append(c.message, f.text.Raw...)
			c.message = append(c.message, '}')
			c.view = c.message
		}
		a.commonChoice(c, &f, false)
		return true
	})
}

// sortChoices orders the used choices by index (they usually already are).
func (a *Assembler) sortChoices() {
	cs := a.choices[:a.n]
	if slices.IsSortedFunc(cs, cmpChoice) {
		return
	}
	slices.SortStableFunc(cs, cmpChoice)
	a.last = -1
	if a.n > 8 {
		clear(a.byIndex)
		for i := range cs {
			a.byIndex[cs[i].index] = int32(i)
		}
	}
}

func cmpChoice(x, y choiceState) int {
	switch {
	case x.index < y.index:
		return -1
	case x.index > y.index:
		return 1
	}
	return 0
}

// buildMessage writes the message of a streamed choice into c.message.
func (a *Assembler) buildMessage(c *choiceState) {
	m := c.message[:0]
	if a.kind == openai.Completions {
		m = append(m, `{"text":"`...)
		m = append(m, c.content...)
		m = append(m, `"}`...)
		c.message, c.view = m, m
		return
	}
	m = append(m, `{"role":"assistant","content":`...)
	if c.hasContent && (len(c.content) > 0 || len(c.tools) == 0) {
		m = append(m, '"')
		m = append(m, c.content...)
		m = append(m, '"')
	} else {
		m = append(m, "null"...)
	}
	if c.hasReason {
		m = append(m, `,"`...)
		m = append(m, c.reasoningKey...)
		m = append(m, `":"`...)
		m = append(m, c.reasoning...)
		m = append(m, '"')
	}
	m = append(m, `,"tool_calls":[`...)
	slices.SortStableFunc(c.tools, func(x, y toolState) int {
		return int(int64(x.index) - int64(y.index))
	})
	for i := range c.tools {
		t := &c.tools[i]
		if i > 0 {
			m = append(m, ',')
		}
		m = append(m, '{')
		if t.hasID {
			m = append(m, `"id":"`...)
			m = append(m, t.id...)
			m = append(m, `",`...)
		}
		m = append(m, `"type":"`...)
		if t.hasType {
			m = append(m, t.typ...)
		} else {
			m = append(m, "function"...)
		}
		m = append(m, `","function":{"name":"`...)
		m = append(m, t.name...)
		m = append(m, `","arguments":"`...)
		m = append(m, t.args...)
		m = append(m, `"}}`...)
	}
	m = append(m, "]}"...)
	c.message, c.view = m, m
}

// buildBody writes the non-streaming equivalent of a chat or completions
// stream into a.body, in vLLM's shape.
func (a *Assembler) buildBody() {
	chat := a.kind != openai.Completions
	b := a.body[:0]
	b = append(b, `{"id":`...)
	b = appendRawOr(b, a.id, `""`)
	if chat {
		b = append(b, `,"object":"chat.completion","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = appendRawOr(b, a.created, "0")
	b = append(b, `,"model":`...)
	b = appendRawOr(b, a.model, `""`)
	b = append(b, `,"choices":[`...)
	for i := range a.n {
		c := &a.choices[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendUint(b, uint64(c.index), 10)
		if chat {
			b = append(b, `,"message":`...)
			b = append(b, c.message...)
		} else {
			b = append(b, `,"text":"`...)
			b = append(b, c.content...)
			b = append(b, '"')
		}
		b = append(b, `,"logprobs":`...)
		switch {
		case !c.hasLP:
			b = append(b, "null"...)
		case chat:
			b = append(b, `{"content":[`...)
			b = append(b, c.lpChat...)
			b = append(b, "]}"...)
		default:
			b = append(b, `{"tokens":[`...)
			b = append(b, c.lpTokens...)
			b = append(b, `],"token_logprobs":[`...)
			b = append(b, c.lpTokLP...)
			b = append(b, `],"text_offset":[`...)
			b = append(b, c.lpOffset...)
			b = append(b, `],"top_logprobs":[`...)
			b = append(b, c.lpTop...)
			b = append(b, "]}"...)
		}
		b = append(b, `,"finish_reason":`...)
		b = appendRawOr(b, c.finish, "null")
		b = append(b, `,"stop_reason":`...)
		b = appendRawOr(b, c.stopReason, "null")
		if c.hasPrompt {
			b = append(b, `,"prompt_token_ids":`...)
			b = arrays.AppendUint32s(b, c.promptIDs)
		}
		if c.hasTokenIDs {
			b = append(b, `,"token_ids":`...)
			b = arrays.AppendUint32s(b, c.tokenIDs)
		}
		b = append(b, '}')
	}
	b = append(b, ']')
	if len(a.usage) > 0 {
		b = append(b, `,"usage":`...)
		b = append(b, a.usage...)
	}
	if len(a.timings) > 0 {
		b = append(b, `,"timings":`...)
		b = append(b, a.timings...)
	}
	if a.hasPmt {
		b = append(b, `,"prompt_token_ids":`...)
		b = arrays.AppendUint32s(b, a.prompt)
	}
	b = append(b, '}')
	a.body = b
}

// appendRawOr appends raw, or def when raw is empty.
func appendRawOr(dst, raw []byte, def string) []byte {
	if len(raw) == 0 {
		return append(dst, def...)
	}
	return append(dst, raw...)
}
