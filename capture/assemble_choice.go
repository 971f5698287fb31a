// The Assembler's per-choice state and the merging of one streamed chunk's
// choices into it (deltas, tool calls, logprobs, Responses API events).

package capture

import (
	"math"
	"strings"

	"github.com/tidwall/gjson"
)

// toolState accumulates one tool call of a streamed chat choice. Strings are
// kept JSON-escaped (without quotes): the interiors of valid JSON strings
// concatenate into a valid JSON string interior.
type toolState struct {
	index   uint32
	id      []byte
	typ     []byte
	name    []byte
	args    []byte
	hasID   bool
	hasType bool
	hasName bool
}

// choiceState accumulates one choice.
type choiceState struct {
	index uint32

	content      []byte // escaped interior (chat content or completions text)
	reasoning    []byte // escaped interior
	reasoningKey string // "reasoning_content" or "reasoning"
	hasContent   bool
	hasReason    bool
	tools        []toolState

	tokenIDs    []uint32
	promptIDs   []uint32
	hasTokenIDs bool
	hasPrompt   bool

	logprobs []float32
	hasLP    bool
	lpChat   []byte // comma-separated raw logprobs.content[] entries
	lpTokens []byte // completions: raw elements of the four arrays
	lpTokLP  []byte
	lpOffset []byte
	lpTop    []byte

	finish     []byte // raw JSON string token
	stopReason []byte // raw JSON token, non-null
	message    []byte // non-stream completions: built message JSON (owned buffer)
	view       []byte // what ChoiceResult.Message shows: message, msgStr, or a slice of the body
	msgStr     string // stream: the message (buildBody), "" otherwise
	msgAt      int    // stream, chat: where the message starts in the body...
	msgEnd     int    // ...and ends
}

func (c *choiceState) reset(index uint32) {
	c.index = index
	c.content = trimBuf(c.content)
	c.reasoning = trimBuf(c.reasoning)
	c.reasoningKey = ""
	c.hasContent, c.hasReason = false, false
	c.tools = c.tools[:0]
	c.tokenIDs = trimU32(c.tokenIDs)
	c.promptIDs = trimU32(c.promptIDs)
	c.hasTokenIDs, c.hasPrompt = false, false
	c.logprobs = c.logprobs[:0]
	if cap(c.logprobs) > maxRetain/4 {
		c.logprobs = nil
	}
	c.hasLP = false
	c.lpChat = trimBuf(c.lpChat)
	c.lpTokens = trimBuf(c.lpTokens)
	c.lpTokLP = trimBuf(c.lpTokLP)
	c.lpOffset = trimBuf(c.lpOffset)
	c.lpTop = trimBuf(c.lpTop)
	c.finish = c.finish[:0]
	c.stopReason = c.stopReason[:0]
	c.message = trimBuf(c.message)
	c.view, c.msgStr = nil, ""
}

// choice returns the state of the choice with this index, creating it; nil
// when MaxChoices is reached.
func (a *Assembler) choice(index uint32) *choiceState {
	if a.last >= 0 && a.choices[a.last].index == index {
		return &a.choices[a.last]
	}
	if a.n <= 8 { // few choices: a linear scan beats the map
		for i := range a.n {
			if a.choices[i].index == index {
				a.last = int32(i)
				return &a.choices[i]
			}
		}
	} else if i, ok := a.byIndex[index]; ok {
		a.last = i
		return &a.choices[i]
	}
	if a.n >= MaxChoices {
		a.dropped++
		return nil
	}
	if a.n == len(a.choices) {
		a.choices = append(a.choices, choiceState{})
	}
	c := &a.choices[a.n]
	c.reset(index)
	a.last = int32(a.n)
	a.n++
	if a.n > 8 {
		if a.byIndex == nil {
			a.byIndex = make(map[uint32]int32)
		}
		if len(a.byIndex) == 0 { // switching from scan to map: index all
			for i := range a.n {
				a.byIndex[a.choices[i].index] = int32(i)
			}
		} else {
			a.byIndex[index] = a.last
		}
	}
	return c
}

// choiceFields are the fields of one element of "choices".
type choiceFields struct {
	index, delta, message, text, logprobs, finish, stop, tokenIDs, promptIDs gjson.Result
	// anyLogprobs: some "logprobs" member (not only the last) is an object.
	anyLogprobs bool
}

func (a *Assembler) readChoice(ch gjson.Result) (f choiceFields) {
	a.ends.eachMember(ch.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "index":
			f.index = v
		case "delta":
			f.delta = v
		case "message":
			f.message = v
		case "text":
			f.text = v
		case "logprobs":
			f.logprobs = v
			f.anyLogprobs = f.anyLogprobs || v.IsObject()
		case "finish_reason":
			f.finish = v
		case "stop_reason":
			f.stop = v
		case "token_ids":
			f.tokenIDs = v
		case "prompt_token_ids":
			f.promptIDs = v
		}
		return true
	})
	return f
}

// streamChoice merges one element of a chunk's "choices" into its state. It
// reports whether the element has a "logprobs" object (see addChunk).
func (a *Assembler) streamChoice(ch gjson.Result) (hasLogprobs bool) {
	f := a.readChoice(ch)
	c := a.choice(clampU32(f.index))
	if c == nil {
		return f.anyLogprobs
	}
	if f.delta.IsObject() {
		a.mergeDelta(c, f.delta)
	} else if f.message.IsObject() {
		// A whole non-streaming object sent as one event (best_of, beam search).
		a.mergeDelta(c, f.message)
	}
	if f.text.Type == gjson.String {
		c.content = appendInterior(c.content, f.text.Raw)
		c.hasContent = true
	}
	a.commonChoice(c, &f, true)
	return f.anyLogprobs
}

// commonChoice handles the fields streamed and non-streamed choices share.
func (a *Assembler) commonChoice(c *choiceState, f *choiceFields, stream bool) {
	if f.logprobs.IsObject() {
		a.mergeLogprobs(c, f.logprobs, stream)
	}
	if f.finish.Type == gjson.String {
		c.finish = append(c.finish[:0], f.finish.Raw...)
	}
	if f.stop.Exists() && f.stop.Type != gjson.Null {
		c.stopReason = append(c.stopReason[:0], f.stop.Raw...)
	}
	if f.tokenIDs.IsArray() {
		c.tokenIDs = appendIDs(c.tokenIDs, f.tokenIDs)
		c.hasTokenIDs = true
	}
	if !c.hasPrompt && f.promptIDs.IsArray() {
		c.promptIDs = appendIDs(c.promptIDs, f.promptIDs)
		c.hasPrompt = true
	}
}

// mergeDelta merges a chat delta (or a whole message) into c.
func (a *Assembler) mergeDelta(c *choiceState, d gjson.Result) {
	a.ends.eachMember(d.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "content":
			if v.Type == gjson.String {
				c.content = appendInterior(c.content, v.Raw)
				c.hasContent = true
			}
		case "reasoning_content", "reasoning":
			if v.Type == gjson.String {
				c.reasoning = appendInterior(c.reasoning, v.Raw)
				c.hasReason = true
				if c.reasoningKey == "" {
					c.reasoningKey = "reasoning"
					if len(k) > len("reasoning") {
						c.reasoningKey = "reasoning_content"
					}
				}
			}
		case "tool_calls":
			if v.IsArray() {
				pos := uint32(0)
				a.ends.eachElem(v.Raw, func(tc gjson.Result) bool {
					if tc.IsObject() {
						a.mergeTool(c, tc, pos)
					}
					pos++
					return true
				})
			}
		}
		return true
	})
}

// mergeTool merges one tool_calls delta; pos is its position in the array,
// used when it has no "index".
func (a *Assembler) mergeTool(c *choiceState, tc gjson.Result, pos uint32) {
	var idx, id, typ, fn gjson.Result
	a.ends.eachMember(tc.Raw, func(k string, v gjson.Result) bool {
		switch k {
		case "index":
			idx = v
		case "id":
			id = v
		case "type":
			typ = v
		case "function":
			fn = v
		}
		return true
	})
	index := pos
	if idx.Type == gjson.Number {
		index = clampU32(idx)
	}
	var t *toolState
	for i := range c.tools {
		if c.tools[i].index == index {
			t = &c.tools[i]
			break
		}
	}
	if t == nil {
		if len(c.tools) >= MaxToolCalls {
			a.droppedT++
			return
		}
		if len(c.tools) < cap(c.tools) {
			c.tools = c.tools[:len(c.tools)+1]
		} else {
			c.tools = append(c.tools, toolState{})
		}
		t = &c.tools[len(c.tools)-1]
		t.index = index
		t.id, t.typ, t.name, t.args = t.id[:0], t.typ[:0], t.name[:0], t.args[:0]
		t.hasID, t.hasType, t.hasName = false, false, false
	}
	if !t.hasID && id.Type == gjson.String {
		t.id, t.hasID = appendInterior(t.id, id.Raw), true
	}
	if !t.hasType && typ.Type == gjson.String {
		t.typ, t.hasType = appendInterior(t.typ, typ.Raw), true
	}
	if fn.IsObject() {
		a.ends.eachMember(fn.Raw, func(k string, v gjson.Result) bool {
			if v.Type != gjson.String {
				return true
			}
			switch k {
			case "name":
				if !t.hasName {
					t.name, t.hasName = appendInterior(t.name, v.Raw), true
				}
			case "arguments":
				t.args = appendInterior(t.args, v.Raw)
			}
			return true
		})
	}
}

// mergeLogprobs reads a choice's logprobs object (chat or completions form).
// When keep is true the raw entries are kept to rebuild the body.
func (a *Assembler) mergeLogprobs(c *choiceState, lp gjson.Result, keep bool) {
	a.ends.eachMember(lp.Raw, func(k string, v gjson.Result) bool {
		if !v.IsArray() {
			return true
		}
		switch k {
		case "content": // chat
			c.hasLP = true
			a.ends.eachElem(v.Raw, func(e gjson.Result) bool {
				l := a.logprobOf(e)
				if l.Type == gjson.Number {
					c.logprobs = append(c.logprobs, float32(numOf(l)))
				} else {
					c.logprobs = append(c.logprobs, float32(math.NaN()))
				}
				if keep {
					c.lpChat = appendElem(c.lpChat, e.Raw)
				}
				return true
			})
		case "token_logprobs": // completions
			c.hasLP = true
			a.ends.eachElem(v.Raw, func(e gjson.Result) bool {
				if e.Type == gjson.Number {
					c.logprobs = append(c.logprobs, float32(numOf(e)))
				} else {
					c.logprobs = append(c.logprobs, float32(math.NaN()))
				}
				if keep {
					c.lpTokLP = appendElem(c.lpTokLP, e.Raw)
				}
				return true
			})
		case "tokens":
			if keep {
				c.lpTokens = appendElems(c.lpTokens, v.Raw)
			}
		case "text_offset":
			if keep {
				c.lpOffset = appendElems(c.lpOffset, v.Raw)
			}
		case "top_logprobs":
			if keep {
				c.lpTop = appendElems(c.lpTop, v.Raw)
			}
		}
		return true
	})
}

// logprobOf returns the "logprob" member of a chat logprobs.content entry,
// as e.Get("logprob") does. While a stream chunk is indexed (containerEnds)
// it walks the entry's members instead of having gjson scan it again; an
// entry with an escape anywhere goes to gjson, which unescapes keys.
func (a *Assembler) logprobOf(e gjson.Result) gjson.Result {
	if !a.ends.Indexed() || !e.IsObject() || strings.IndexByte(e.Raw, '\\') >= 0 {
		return e.Get("logprob")
	}
	var l gjson.Result
	a.ends.eachMember(e.Raw, func(k string, v gjson.Result) bool {
		if k == "logprob" {
			l = v
			return false
		}
		return true
	})
	return l
}

// responsesEvent handles one event of a Responses API stream.
func (a *Assembler) responsesEvent(top gjson.Result) {
	typ := top.Get("type")
	switch typ.Str {
	case "response.completed", "response.incomplete", "response.failed":
		r := top.Get("response")
		if r.IsObject() {
			a.respBody = append(a.respBody[:0], r.Raw...)
		}
	case "error":
		msg := top.Get("message")
		if msg.Type == gjson.String && msg.Str != "" {
			a.setErr(msg.Str)
		} else {
			a.setErr("backend error: " + truncate(top.Raw))
		}
	default:
		if e := top.Get("error"); e.Exists() {
			a.errorValue(e)
		}
	}
}
