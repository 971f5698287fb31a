// The Assembler's non-streamed path (parseBody) and the building of the
// results: choices sorted, messages and the stream's equivalent JSON body.

package capture

import (
	"slices"
	"strconv"
	"strings"

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

// buildBody builds the non-streaming equivalent of a chat or completions
// stream, in vLLM's shape, into a.bodyStr, and each choice's message into
// c.msgStr (for chat, the message as it stands in the body: a substring of
// it). The body is written twice by writeBody: once to measure it, once into
// a strings.Builder grown to that size, so it is built once, in memory of
// its own that nothing writes again, and is the row's response_body without
// a copy.
func (a *Assembler) buildBody() {
	chat := a.kind != openai.Completions
	if chat {
		for i := range a.n {
			slices.SortStableFunc(a.choices[i].tools, func(x, y toolState) int {
				return int(int64(x.index) - int64(y.index))
			})
		}
	}
	w := bodyWriter{count: true}
	a.writeBody(&w, chat)
	w.sb.Grow(w.n)
	w.count = false
	a.writeBody(&w, chat)
	a.bodyStr = w.sb.String()
	for i := range a.n {
		c := &a.choices[i]
		if chat {
			c.msgStr = a.bodyStr[c.msgAt:c.msgEnd]
		} else {
			c.msgStr = `{"text":"` + string(c.content) + `"}`
		}
		c.view = jsonscan.Bytes(c.msgStr)
	}
}

// writeBody writes the body buildBody builds to w; in w's writing pass it
// records where each chat message starts and ends in it.
func (a *Assembler) writeBody(w *bodyWriter, chat bool) {
	w.str(`{"id":`)
	w.rawOr(a.id, `""`)
	if chat {
		w.str(`,"object":"chat.completion","created":`)
	} else {
		w.str(`,"object":"text_completion","created":`)
	}
	w.rawOr(a.created, "0")
	w.str(`,"model":`)
	w.rawOr(a.model, `""`)
	w.str(`,"choices":[`)
	for i := range a.n {
		c := &a.choices[i]
		if i > 0 {
			w.char(',')
		}
		w.str(`{"index":`)
		w.uint(uint64(c.index))
		if chat {
			w.str(`,"message":`)
			at := w.len()
			writeMessage(w, c)
			if !w.count {
				c.msgAt, c.msgEnd = at, w.len()
			}
		} else {
			w.str(`,"text":"`)
			w.raw(c.content)
			w.char('"')
		}
		w.str(`,"logprobs":`)
		switch {
		case !c.hasLP:
			w.str("null")
		case chat:
			w.str(`{"content":[`)
			w.raw(c.lpChat)
			w.str("]}")
		default:
			w.str(`{"tokens":[`)
			w.raw(c.lpTokens)
			w.str(`],"token_logprobs":[`)
			w.raw(c.lpTokLP)
			w.str(`],"text_offset":[`)
			w.raw(c.lpOffset)
			w.str(`],"top_logprobs":[`)
			w.raw(c.lpTop)
			w.str("]}")
		}
		w.str(`,"finish_reason":`)
		w.rawOr(c.finish, "null")
		w.str(`,"stop_reason":`)
		w.rawOr(c.stopReason, "null")
		if c.hasPrompt {
			w.str(`,"prompt_token_ids":`)
			w.ids(c.promptIDs)
		}
		if c.hasTokenIDs {
			w.str(`,"token_ids":`)
			w.ids(c.tokenIDs)
		}
		w.char('}')
	}
	w.char(']')
	if len(a.usage) > 0 {
		w.str(`,"usage":`)
		w.raw(a.usage)
	}
	if len(a.timings) > 0 {
		w.str(`,"timings":`)
		w.raw(a.timings)
	}
	if a.hasPmt {
		w.str(`,"prompt_token_ids":`)
		w.ids(a.prompt)
	}
	w.char('}')
}

// writeMessage writes the assistant message of a streamed chat choice (its
// tools sorted by index).
func writeMessage(w *bodyWriter, c *choiceState) {
	w.str(`{"role":"assistant","content":`)
	if c.hasContent && (len(c.content) > 0 || len(c.tools) == 0) {
		w.char('"')
		w.raw(c.content)
		w.char('"')
	} else {
		w.str("null")
	}
	if c.hasReason {
		w.str(`,"`)
		w.str(c.reasoningKey)
		w.str(`":"`)
		w.raw(c.reasoning)
		w.char('"')
	}
	w.str(`,"tool_calls":[`)
	for i := range c.tools {
		t := &c.tools[i]
		if i > 0 {
			w.char(',')
		}
		w.char('{')
		if t.hasID {
			w.str(`"id":"`)
			w.raw(t.id)
			w.str(`",`)
		}
		w.str(`"type":"`)
		if t.hasType {
			w.raw(t.typ)
		} else {
			w.str("function")
		}
		w.str(`","function":{"name":"`)
		w.raw(t.name)
		w.str(`","arguments":"`)
		w.raw(t.args)
		w.str(`"}}`)
	}
	w.str("]}")
}

// bodyWriter is where writeBody writes: with count set it only adds up the
// length (n) of what it is given; otherwise it appends it to sb.
type bodyWriter struct {
	count bool
	n     int
	sb    strings.Builder
}

func (w *bodyWriter) str(s string) {
	if w.count {
		w.n += len(s)
	} else {
		w.sb.WriteString(s)
	}
}

func (w *bodyWriter) raw(b []byte) {
	if w.count {
		w.n += len(b)
	} else {
		w.sb.Write(b)
	}
}

func (w *bodyWriter) char(c byte) {
	if w.count {
		w.n++
	} else {
		w.sb.WriteByte(c)
	}
}

// rawOr writes raw, or def when raw is empty.
func (w *bodyWriter) rawOr(raw []byte, def string) {
	if len(raw) == 0 {
		w.str(def)
	} else {
		w.raw(raw)
	}
}

// uint writes v in decimal.
func (w *bodyWriter) uint(v uint64) {
	if w.count {
		w.n += decLen(v)
		return
	}
	var d [20]byte
	w.sb.Write(strconv.AppendUint(d[:0], v, 10))
}

// ids writes ids as a JSON array (arrays.AppendUint32s).
func (w *bodyWriter) ids(ids []uint32) {
	if w.count {
		w.n += 2 + max(len(ids)-1, 0)
		for _, v := range ids {
			w.n += decLen(uint64(v))
		}
		return
	}
	// In blocks, through a buffer on the stack: no scratch is kept between
	// bodies. (One kept by each Assembler, pooled, as many as calls in
	// flight plus those queued for the store, held 16 MB of a 120 MB heap at
	// 4,096 open streams: bench/RESULTS.md §18.)
	const block = 64 // ids: at most 2 + 11*64 bytes
	var buf [2 + 11*block]byte
	w.sb.WriteByte('[')
	for i := 0; i < len(ids); i += block {
		b := arrays.AppendUint32s(buf[:0], ids[i:min(i+block, len(ids))])
		if i > 0 {
			w.sb.WriteByte(',')
		}
		w.sb.Write(b[1 : len(b)-1])
	}
	w.sb.WriteByte(']')
}

// len is the length written so far.
func (w *bodyWriter) len() int {
	if w.count {
		return w.n
	}
	return w.sb.Len()
}

// decLen is the number of decimal digits of v.
func decLen(v uint64) int {
	n := 1
	for v >= 10 {
		v /= 10
		n++
	}
	return n
}
