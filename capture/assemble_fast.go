// The Assembler's fast path for the regular chunks of chat and completions
// streams: one strict pass over a chunk validates it and stages the raw
// positions of the values the assembler reads; the staged values are then
// applied with the effects addChunk's general path has on the same chunk.
// Whatever the pass does not recognise falls back to the general path, which
// decides validity and meaning.

package capture

import (
	"bytes"
	"math"
	"strconv"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// span is the raw value data[s:e] of a staged member; e == 0 when absent.
type span struct{ s, e int }

func (p span) ok() bool { return p.e > 0 }

// first returns the value's first byte (0 when absent); it types the value
// as rawValue does.
func (p span) first(data []byte) byte {
	if p.e == 0 {
		return 0
	}
	return data[p.s]
}

// lpEntry is one staged element of a chat choice's logprobs.content.
type lpEntry struct {
	raw     span // the whole entry
	logprob span // its first "logprob" member
}

// fastChoice holds the staged members of one element of "choices".
type fastChoice struct {
	index, delta, text, logprobs, finish, stop, tokenIDs, promptIDs span
	// From the delta (when delta is an object and not delegated).
	content, reasoning span
	reasoningLong      bool // the reasoning member is "reasoning_content"
	// delegate: the delta (tool_calls) or the logprobs object (completions
	// form) is applied by mergeDelta or mergeLogprobs themselves.
	delegateDelta, delegateLP bool
	lpContent                 bool // logprobs.content is an array: entries [e0:e1]
	e0, e1                    int
}

// fastState is the staging area of one chunk (reused, so that a warm
// Assembler stages without allocating).
type fastState struct {
	choices []fastChoice
	entries []lpEntry
}

// trim empties f, dropping buffers that grew very large.
func (f *fastState) trim() {
	f.choices = f.choices[:0]
	if cap(f.choices) > MaxChoices {
		f.choices = nil
	}
	f.entries = f.entries[:0]
	if cap(f.entries) > maxRetain/32 {
		f.entries = nil
	}
}

// footprint is roughly the bytes f's buffers hold.
func (f *fastState) footprint() int { return 256*cap(f.choices) + 32*cap(f.entries) }

// The top-level members the fast path stages (fastChunk's top), by name.
const (
	tID = iota
	tObject
	tCreated
	tModel
	tUsage
	tTimings
	tPrompt
	nTop
)

var topKeys = [nTop]string{"id", "object", "created", "model", "usage", "timings", "prompt_token_ids"}

// fastChunk tries the fast path on data, a trimmed chunk of a chat or
// completions stream; when sameHead, data starts with a.head, whose members
// are skipped as the general path skips them. It reports whether it took
// the chunk, and then addChunk's result; when it did not, it changed
// nothing.
func (a *Assembler) fastChunk(data []byte, sameHead bool) (took, mayLogprobs bool) {
	f := &a.fast
	f.choices = f.choices[:0]
	f.entries = f.entries[:0]
	var top [nTop]span
	headKeys, headEnd, choicesSeen := false, 0, false
	hasU := bytes.IndexByte(data, '\\') >= 0 && bytes.Contains(data, escapeU)
	member := func(key string, v int) (int, bool) {
		if headKeys && !choicesSeen {
			switch key {
			case "id", "object", "created", "model":
			case "choices":
				headEnd = jsonscan.Offset(jsonscan.String(data), key) - 1
			default:
				headKeys = false
			}
		}
		switch key {
		case "choices":
			if choicesSeen || data[v] != '[' {
				return v, false
			}
			choicesSeen = true
			return fastArray(data, v, a.fastChoice)
		case "error":
			return v, false
		}
		for k := range topKeys {
			if key == topKeys[k] {
				return stage(&top[k], data, v)
			}
		}
		return jsonscan.ValidValue(data, v)
	}
	var end int
	var ok bool
	if sameHead {
		// Members after the head's last comma.
		end, ok = fastMembers(data, jsonscan.SkipWS(data, len(a.head)), member)
	} else if data[0] == '{' {
		headKeys = !hasU
		end, ok = fastObject(data, 0, member)
	}
	if !ok || end != len(data) { // data is trimmed: the object must end it
		return false, false
	}
	id, object, created, model := top[tID], top[tObject], top[tCreated], top[tModel]
	usage, timings, prompt := top[tUsage], top[tTimings], top[tPrompt]
	if object.first(data) == '"' {
		// {"object":"error",...} is an error (the general path reads it).
		if o := data[object.s:object.e]; string(o) == `"error"` || bytes.IndexByte(o, '\\') >= 0 {
			return false, false
		}
	}

	// Valid, and every member understood: apply.
	if id.first(data) == '"' && len(a.id) == 0 {
		a.id = append(a.id, data[id.s:id.e]...)
	}
	if c := created.first(data); created.ok() && isNumberStart(c) && len(a.created) == 0 {
		a.created = append(a.created, data[created.s:created.e]...)
	}
	if model.first(data) == '"' && len(a.model) == 0 {
		a.model = append(a.model, data[model.s:model.e]...)
	}
	if usage.first(data) == '{' {
		a.usage = append(a.usage[:0], data[usage.s:usage.e]...)
	}
	if timings.first(data) == '{' {
		a.timings = append(a.timings[:0], data[timings.s:timings.e]...)
	}
	if !a.hasPmt && prompt.first(data) == '[' {
		a.prompt, a.hasPmt = appendIDs(a.prompt, rawValue(jsonscan.String(data[prompt.s:prompt.e]))), true
	}
	if !sameHead {
		a.head = a.head[:0]
		if headKeys && headEnd > 1 && choicesSeen {
			a.head = append(a.head, data[:headEnd]...)
		}
	}
	mayLogprobs = hasU
	for k := range f.choices {
		if a.applyFastChoice(data, &f.choices[k]) {
			mayLogprobs = true
		}
	}
	return true, mayLogprobs
}

// isNumberStart reports whether a valid JSON value starting with c is a
// number (rawValue's typing).
func isNumberStart(c byte) bool { return c == '-' || c >= '0' && c <= '9' }

// fastKey reads the key opening at data[i] (its quote) and returns the index
// of its closing quote; false when there is none there or the key holds an
// escape or a control character (a key the fast path does not take).
func fastKey(data []byte, i int) (int, bool) {
	if i >= len(data) || data[i] != '"' {
		return i, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return j, true
		case c < ' ' || c == '\\':
			return j, false
		}
	}
	return len(data), false
}

// fastObject walks the object opening at data[i] (see fastMembers) and
// returns the index after it.
func fastObject(data []byte, i int, member func(key string, v int) (int, bool)) (int, bool) {
	i = jsonscan.SkipWS(data, i+1)
	if i < len(data) && data[i] == '}' {
		return i + 1, true
	}
	return fastMembers(data, i, member)
}

// fastMembers walks an object's members from the key at data[i] to the
// object's end, and returns the index after it. For each member it calls
// member with the key and the index of its value; member validates the
// value and returns the index after it, or false to give up.
func fastMembers(data []byte, i int, member func(key string, v int) (int, bool)) (int, bool) {
	for {
		ke, ok := fastKey(data, i)
		if !ok {
			return i, false
		}
		key := jsonscan.String(data[i+1 : ke])
		i = jsonscan.SkipWS(data, ke+1)
		if i >= len(data) || data[i] != ':' {
			return i, false
		}
		i = jsonscan.SkipWS(data, i+1)
		if i >= len(data) {
			return i, false
		}
		if i, ok = member(key, i); !ok {
			return i, false
		}
		var more bool
		if i, more, ok = fastNext(data, i, '}'); !ok || !more {
			return i, ok
		}
	}
}

// fastArray walks the array opening at data[i], whose elements must be
// objects: elem validates the one opening at its argument and returns the
// index after it, or false to give up. It returns the index after the array.
func fastArray(data []byte, i int, elem func(data []byte, i int) (int, bool)) (int, bool) {
	i = jsonscan.SkipWS(data, i+1)
	if i < len(data) && data[i] == ']' {
		return i + 1, true
	}
	for {
		if i >= len(data) || data[i] != '{' {
			return i, false
		}
		var ok, more bool
		if i, ok = elem(data, i); !ok {
			return i, false
		}
		if i, more, ok = fastNext(data, i, ']'); !ok || !more {
			return i, ok
		}
	}
}

// fastNext reads what follows a member or element at data[i]: the comma
// (then it returns the index after it and more) or closer.
func fastNext(data []byte, i int, closer byte) (next int, more, ok bool) {
	i = jsonscan.SkipWS(data, i)
	if i >= len(data) {
		return i, false, false
	}
	switch data[i] {
	case ',':
		return jsonscan.SkipWS(data, i+1), true, true
	case closer:
		return i + 1, false, true
	}
	return i, false, false
}

// stage sets *dst to the valid value at data[i], unless dst is set already
// (a duplicate key).
func stage(dst *span, data []byte, i int) (int, bool) {
	if dst.ok() {
		return i, false
	}
	e, ok := jsonscan.ValidValue(data, i)
	if ok {
		*dst = span{i, e}
	}
	return e, ok
}

// stageObject is stage for a value whose members member stages when it is
// an object.
func stageObject(dst *span, data []byte, i int, member func(key string, v int) (int, bool)) (int, bool) {
	if dst.ok() {
		return i, false
	}
	e, ok := 0, false
	if data[i] == '{' {
		e, ok = fastObject(data, i, member)
	} else {
		e, ok = jsonscan.ValidValue(data, i)
	}
	*dst = span{i, e}
	return e, ok
}

// fastChoice stages the choice object opening at data[i].
func (a *Assembler) fastChoice(data []byte, i int) (int, bool) {
	f := &a.fast
	f.choices = append(f.choices, fastChoice{})
	c := &f.choices[len(f.choices)-1]
	return fastObject(data, i, func(key string, v int) (int, bool) {
		switch key {
		case "index":
			return stage(&c.index, data, v)
		case "delta":
			return stageObject(&c.delta, data, v, func(key string, v int) (int, bool) { return fastDelta(data, key, v, c) })
		case "text":
			return stage(&c.text, data, v)
		case "logprobs":
			return stageObject(&c.logprobs, data, v, func(key string, v int) (int, bool) { return a.fastLogprobs(data, key, v, c) })
		case "finish_reason":
			return stage(&c.finish, data, v)
		case "stop_reason":
			return stage(&c.stop, data, v)
		case "token_ids":
			return stage(&c.tokenIDs, data, v)
		case "prompt_token_ids":
			return stage(&c.promptIDs, data, v)
		case "message":
			return v, false // a whole message as one event: the general path
		}
		return jsonscan.ValidValue(data, v)
	})
}

// fastDelta stages one member of a delta object into c: content and one
// reasoning member; a delta with tool calls is delegated to mergeDelta.
func fastDelta(data []byte, key string, v int, c *fastChoice) (int, bool) {
	switch key {
	case "content":
		return stage(&c.content, data, v)
	case "reasoning_content", "reasoning":
		c.reasoningLong = len(key) > len("reasoning")
		return stage(&c.reasoning, data, v)
	case "tool_calls":
		if data[v] == '[' {
			c.delegateDelta = true
		}
	}
	return jsonscan.ValidValue(data, v)
}

// fastLogprobs stages one member of a logprobs object into c: the entries
// of a chat "content" array; the completions form is delegated to
// mergeLogprobs.
func (a *Assembler) fastLogprobs(data []byte, key string, v int, c *fastChoice) (int, bool) {
	switch key {
	case "content":
		if c.lpContent || c.delegateLP {
			return v, false // a second "content": both count
		}
		if data[v] != '[' {
			break
		}
		c.lpContent = true
		c.e0 = len(a.fast.entries)
		e, ok := fastArray(data, v, a.fastEntry)
		c.e1 = len(a.fast.entries)
		return e, ok
	case "token_logprobs", "tokens", "text_offset", "top_logprobs":
		if c.lpContent {
			return v, false
		}
		c.delegateLP = true
	}
	return jsonscan.ValidValue(data, v)
}

// fastEntry stages the logprobs.content entry opening at data[i].
func (a *Assembler) fastEntry(data []byte, i int) (int, bool) {
	var lp span
	end, ok := fastObject(data, i, func(key string, v int) (int, bool) {
		e, ok := jsonscan.ValidValue(data, v)
		if key == "logprob" && !lp.ok() {
			lp = span{v, e} // the first, as gjson's Get finds it
		}
		return e, ok
	})
	if ok {
		a.fast.entries = append(a.fast.entries, lpEntry{raw: span{i, end}, logprob: lp})
	}
	return end, ok
}

// applyFastChoice merges a staged choice as streamChoice merges the same
// element, and returns what streamChoice returns.
func (a *Assembler) applyFastChoice(data []byte, fc *fastChoice) (hasLogprobs bool) {
	str := func(p span) string { return jsonscan.String(data[p.s:p.e]) }
	hasLogprobs = fc.logprobs.first(data) == '{'
	index := uint32(0)
	if fc.index.ok() && isNumberStart(data[fc.index.s]) {
		index = fastIndex(str(fc.index))
	}
	c := a.choice(index)
	if c == nil {
		return hasLogprobs
	}
	if fc.delta.first(data) == '{' {
		if fc.delegateDelta {
			a.mergeDelta(c, rawValue(str(fc.delta)))
		} else {
			if fc.content.first(data) == '"' {
				c.content = appendInterior(c.content, str(fc.content))
				c.hasContent = true
			}
			if fc.reasoning.first(data) == '"' {
				c.reasoning = appendInterior(c.reasoning, str(fc.reasoning))
				c.hasReason = true
				if c.reasoningKey == "" {
					c.reasoningKey = "reasoning"
					if fc.reasoningLong {
						c.reasoningKey = "reasoning_content"
					}
				}
			}
		}
	}
	if fc.text.first(data) == '"' {
		c.content = appendInterior(c.content, str(fc.text))
		c.hasContent = true
	}
	if hasLogprobs {
		if fc.delegateLP {
			a.mergeLogprobs(c, rawValue(str(fc.logprobs)), true)
		} else if fc.lpContent {
			c.hasLP = true
			plain := !a.noLogprobIDs && plainIndex(data, fc.index)
			for _, e := range a.fast.entries[fc.e0:fc.e1] {
				l := float32(math.NaN())
				if e.logprob.ok() && isNumberStart(data[e.logprob.s]) {
					l = float32(parseFloat(str(e.logprob)))
				}
				c.logprobs = append(c.logprobs, l)
				c.lpChat = appendElem(c.lpChat, str(e.raw))
				if plain && !mayCarryID(data[e.raw.s:e.raw.e]) {
					a.noLogprobIDs, plain = true, false
				}
			}
		}
	}
	if fc.finish.first(data) == '"' {
		c.finish = append(c.finish[:0], data[fc.finish.s:fc.finish.e]...)
	}
	if fc.stop.ok() && data[fc.stop.s] != 'n' {
		c.stopReason = append(c.stopReason[:0], data[fc.stop.s:fc.stop.e]...)
	}
	if fc.tokenIDs.first(data) == '[' {
		c.tokenIDs = appendIDs(c.tokenIDs, rawValue(str(fc.tokenIDs)))
		c.hasTokenIDs = true
	}
	if !c.hasPrompt && fc.promptIDs.first(data) == '[' {
		c.promptIDs = appendIDs(c.promptIDs, rawValue(str(fc.promptIDs)))
		c.hasPrompt = true
	}
	return hasLogprobs
}

// fastIndex is clampU32 of a raw JSON number, without parsing a float for
// the small plain integers choices are numbered with.
func fastIndex(raw string) uint32 {
	if len(raw) > 0 && len(raw) <= 9 {
		v := uint32(0)
		for j := 0; j < len(raw); j++ {
			ch := raw[j]
			if ch < '0' || ch > '9' {
				return clampU32(rawValue(raw))
			}
			v = v*10 + uint32(ch-'0')
		}
		return v
	}
	return clampU32(rawValue(raw))
}

// pow10 are the powers of ten a float64 holds exactly.
var pow10 = [...]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10,
	1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22}

// parseFloat is strconv.ParseFloat(raw, 64) of a valid JSON number (what
// numOf returns): a short plain decimal (-1.25, at most 15 digits, no
// exponent) is an exact integer divided by an exact power of ten, which
// IEEE division rounds correctly as ParseFloat does (strconv's own exact
// path); anything else goes to ParseFloat.
func parseFloat(raw string) float64 {
	i, neg := 0, false
	if len(raw) > 0 && raw[0] == '-' {
		i, neg = 1, true
	}
	var m uint64
	digits, frac, dot := 0, 0, false
	for ; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c >= '0' && c <= '9':
			m = m*10 + uint64(c-'0')
			digits++
			if dot {
				frac++
			}
		case c == '.' && !dot:
			dot = true
		default:
			digits = 99 // an exponent: not the plain form
		}
	}
	if digits == 0 || digits > 15 {
		f, _ := strconv.ParseFloat(raw, 64)
		return f
	}
	f := float64(m) / pow10[frac]
	if neg {
		f = -f
	}
	return f
}

// plainIndex reports whether a choice's "index" is a plain decimal integer
// of at most 9 digits: the same choice for the assembler (clampU32) and for
// tokenize/fallback.LogprobIDs (which skips a choice without a usable index).
func plainIndex(data []byte, p span) bool {
	if !p.ok() || p.e-p.s > 9 {
		return false
	}
	for _, c := range data[p.s:p.e] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// mayCarryID reports whether a chat logprobs entry (raw, from a chunk the
// fast path took: its keys are unescaped and unique) might give
// tokenize/fallback.LogprobIDs a token id: an "id" member, or a "token"
// that reads "token_id:NNN". It is false only when neither can be there:
// no "id" anywhere in it, no "token_id:", and no escape that could spell
// them.
func mayCarryID(raw []byte) bool {
	return bytes.Contains(raw, idKey) || bytes.Contains(raw, tokenIDPrefix) || bytes.IndexByte(raw, '\\') >= 0
}

// Byte patterns mayCarryID looks for.
var (
	idKey         = []byte(`"id"`)
	tokenIDPrefix = []byte(`token_id:`)
)
