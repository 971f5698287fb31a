package mock

import (
	"strings"

	"github.com/tidwall/gjson"
)

// Stop strings (the request's "stop": a string or a list of strings), for the vLLM and
// llama.cpp flavours (SGLang's handling was not read: its flavour ignores "stop").
//
// Both engines stop at the token whose text completes a stop string, count every
// sampled token in usage and leave the stop string and what follows out of the text
// (docs/engines.md):
//   - vLLM (v1 detokenizer) keeps all those tokens in token_ids and logprobs and reports
//     the string as stop_reason. Its streams hold back len(longest stop)-1 characters
//     until the finish (holdBack), as the mock does.
//   - llama.cpp (server-context.cpp process_token, send_final_response) trims a
//     non-streamed answer's logprobs by as many tokens as the stop string tokenizes to,
//     and in a stream sends a token's text only when it is not a possible start of a
//     stop string: text held back and then removed by the match is never sent, so
//     those tokens make no chat delta and their logprobs ride on no chunk. A completion
//     stream still sends one chunk per token (text "" for those).

// readStops reads "stop" into p.stops (empty strings are dropped, as llama.cpp does).
func (p *plan) readStops(v gjson.Result) {
	p.stops = p.stops[:0]
	switch {
	case v.Type == gjson.String:
		if v.Str != "" {
			p.stops = append(p.stops, v.Str)
		}
	case v.IsArray():
		v.ForEach(func(_, s gjson.Result) bool {
			if s.Type == gjson.String && s.Str != "" {
				p.stops = append(p.stops, s.Str)
			}
			return true
		})
	}
}

// applyStop cuts a text choice at the first token that completes a stop string.
func (p *plan) applyStop(c *planChoice) {
	if len(p.stops) == 0 || p.s.cfg.Flavor == FlavorSGLang || c.hidden != nil {
		return
	}
	var text strings.Builder
	for k, id := range c.ids {
		text.WriteString(p.s.v.pieces[id])
		s := text.String()
		at, which := -1, ""
		for _, w := range p.stops {
			if i := strings.Index(s, w); i >= 0 && (at < 0 || i < at) {
				at, which = i, w
			}
		}
		if at < 0 {
			continue
		}
		c.ids = c.ids[:k+1]
		c.stopStr, c.textLen, c.finish = which, at, "stop"
		if p.s.cfg.Flavor == FlavorLlamaCpp {
			c.stepText = llamaCppSent(c.stepText[:0], c.ids, p.stops)
		}
		return
	}
}

// holdBack sets the text each stream step of a vLLM text choice sends when the
// request has stop strings, matched or not: the incremental detokenizer holds
// back the last len(longest stop)-1 characters until the output finishes, and
// the last output sends the rest up to the match (stop_buffer_length and
// get_next_output_text, vllm/v1/engine/detokenizer.py, 0.32.0). A step whose
// text is all held back sends "" (no chat delta).
func (p *plan) holdBack(c *planChoice) {
	if len(p.stops) == 0 || p.s.cfg.Flavor != FlavorVLLM || c.tool || c.hidden != nil || len(c.ids) == 0 {
		return
	}
	hold := 0
	for _, w := range p.stops {
		hold = max(hold, len(w)-1)
	}
	var text strings.Builder
	for _, id := range c.ids {
		text.WriteString(c.v.text(id))
	}
	s := text.String()
	end := len(s)
	if c.stopStr != "" {
		end = c.textLen
	}
	c.stepText = c.stepText[:0]
	off, sent := 0, 0
	for k, id := range c.ids {
		off += len(c.v.text(id))
		upto := min(off-hold, end)
		if k == len(c.ids)-1 {
			upto = end
		}
		if upto <= sent {
			c.stepText = append(c.stepText, "")
			continue
		}
		c.stepText = append(c.stepText, s[sent:upto])
		sent = upto
	}
}

// llamaCppSent appends the text llama.cpp sends for each token of ids, given stop
// strings that ids end by matching: a token's unsent text goes out unless the text
// ends with a possible start of a stop string; on the full match the text is cut at
// the match and what is left unsent goes out with that token.
func llamaCppSent(dst []string, ids []uint32, stops []string) []string {
	gen, sent := "", 0
	for _, id := range ids {
		gen += vocab[id]
		unsent := gen[sent:]
		full := -1
		for _, w := range stops {
			if i := strings.Index(unsent, w); i >= 0 && (full < 0 || i < full) {
				full = i
			}
		}
		switch {
		case full >= 0:
			gen = gen[:sent+full]
		case partialStop(unsent, stops):
			dst = append(dst, "")
			continue
		}
		dst = append(dst, gen[sent:])
		sent = len(gen)
	}
	return dst
}

// partialStop reports whether s ends with a proper prefix of one of stops.
func partialStop(s string, stops []string) bool {
	for _, w := range stops {
		for n := min(len(w)-1, len(s)); n > 0; n-- {
			if strings.HasSuffix(s, w[:n]) {
				return true
			}
		}
	}
	return false
}

// stepTextOf is the text choice c sends at stream step st.
func (c *planChoice) stepTextOf(st int) string {
	if c.stepText != nil {
		return c.stepText[st]
	}
	return c.v.text(c.ids[st])
}

// appendChoiceText appends the escaped text of a text choice: its tokens' text, cut
// at a matched stop string.
func appendChoiceText(dst []byte, c *planChoice) []byte {
	if c.stopStr == "" && c.stepText == nil {
		return c.v.appendText(dst, c.ids)
	}
	var s strings.Builder
	for _, id := range c.ids {
		s.WriteString(c.v.text(id))
	}
	if c.stopStr == "" {
		return appendJSONStringBody(dst, s.String())
	}
	return appendJSONStringBody(dst, s.String()[:c.textLen])
}

// logprobEnd is where a non-streamed llama.cpp answer's logprobs end: before the
// tokens of a matched stop string (as many as it tokenizes to).
func (p *plan) logprobEnd(c *planChoice) int {
	if c.stopStr == "" || p.s.cfg.Flavor != FlavorLlamaCpp {
		return len(c.ids)
	}
	var buf [64]uint32
	n := len(appendEncodeSpecial(buf[:0], c.stopStr, false))
	return len(c.ids) - min(n, len(c.ids))
}

// appendStopReason appends vLLM's stop_reason value: the matched stop string or null.
func appendStopReason(dst []byte, c *planChoice) []byte {
	if c.stopStr == "" {
		return append(dst, "null"...)
	}
	return appendJSONString(dst, c.stopStr)
}
