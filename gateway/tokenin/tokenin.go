// Package tokenin keeps what token-in mode (serve --token-in, issue 31) needs
// between the calls of one attempt, and decides each call's prompt ids:
//
//   - Store holds, per (rollout, attempt), the previous call's messages (in
//     a canonical form, compared as messages, not bytes), the assistant
//     message the gateway returned, and the prompt and response token ids;
//     bounded by entries and bytes, least recently used evicted (counted).
//   - Check says whether a call's messages extend the previous call's
//     messages plus the returned assistant message (Extends) or why not.
//   - Join builds an extending call's prompt: the previous prompt ids, the
//     previous response ids (end-of-turn token included), then the ids the
//     engine's own template renders after that end-of-turn token; JoinCut
//     does the same for an answer cut by max_tokens or a stop string, with
//     the closing the template renders after the sampled ids in between.
//
// The engine calls themselves (render, generate, derender) are package
// gateway's (tokenin.go there); this package holds no I/O.
package tokenin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// Outcomes recorded in the token_in column (export.Call.TokenIn) and counted
// in rollgate_token_in_calls_total. A reason follows "whole:" or
// "passthrough:".
const (
	// Extended: the prompt is the previous prompt + response ids + the new
	// messages' rendered ids.
	Extended = "extended"
	// First: the attempt's first call (or the first the store knows of),
	// rendered whole by the engine.
	First = "first"
	// WholePrefix prefixes a call rendered whole although a previous call of
	// the attempt is known; the reason follows.
	WholePrefix = "whole:"
	// PassthroughPrefix prefixes a call sent the ordinary way (the engine
	// renders the text itself); the reason follows.
	PassthroughPrefix = "passthrough:"
)

// Reasons a call is rendered whole or passed through.
const (
	ReasonEdited      = "edited"       // an earlier message differs from the previous call's
	ReasonAssistant   = "assistant"    // the assistant message differs from the one returned
	ReasonShorter     = "no_new"       // no message after the returned assistant message
	ReasonTemplate    = "template"     // tools, template or its arguments changed
	ReasonNotEnded    = "not_ended"    // the previous answer was cut and its turn does not re-render to the sampled ids (JoinCut)
	ReasonJoin        = "join"         // the template's join after the turn could not be located
	ReasonNoAttempt   = "no_attempt"   // the call names no rollout and attempt
	ReasonRender      = "render"       // the engine could not render the messages
	ReasonDerender    = "derender"     // the engine could not turn the ids into a message
	ReasonKind        = "kind"         // the replica's engine kind has no token-in endpoints
	ReasonBadMessages = "bad_messages" // messages is not an array of objects
)

// Prev is what the store keeps of an attempt's last token-in call.
type Prev struct {
	// Messages are the call's messages, canonical (Canonical), without the
	// answer.
	Messages []string
	// RenderKey is the canonical JSON of the request fields besides
	// messages that change the rendered prompt (RenderKey).
	RenderKey string
	// Prompt is the ids the engine was sent.
	Prompt []uint32
	// Choices are the call's answers, one per choice (n > 1: the next call
	// extends the one the agent sends back).
	Choices []Choice
}

// Choice is one answer of a call.
type Choice struct {
	// Answer is the assistant message returned, canonical (CanonicalAnswer).
	Answer string
	// Response is the ids the engine sampled.
	Response []uint32
	// Ended is true when the answer ended on an end-of-turn token (finish
	// reason stop with no stop string): only then can the next call join it.
	Ended bool
}

func (p *Prev) size() int64 {
	n := int64(len(p.RenderKey)) + 4*int64(len(p.Prompt)) + 128
	for _, c := range p.Choices {
		n += int64(len(c.Answer)) + 4*int64(len(c.Response)) + 64
	}
	for _, m := range p.Messages {
		n += int64(len(m)) + 16
	}
	return n
}

// Check compares a call (its canonical messages and render key) with the
// attempt's previous call: the index of the choice whose answer the
// messages extend the previous messages with (followed by at least one new
// message) and "", else the reason. For a choice that did not end on an
// end-of-turn token the index comes with ReasonNotEnded (JoinCut can still
// join it); every other reason comes with -1.
func Check(prev *Prev, msgs []string, renderKey string) (int, string) {
	n := len(prev.Messages)
	switch {
	case renderKey != prev.RenderKey:
		return -1, ReasonTemplate
	case len(msgs) < n+1:
		if len(msgs) > 0 && slices.Equal(msgs, prev.Messages[:len(msgs)]) {
			return -1, ReasonShorter
		}
		return -1, ReasonEdited
	case !slices.Equal(msgs[:n], prev.Messages):
		return -1, ReasonEdited
	}
	answer := AnswerOf(msgs[n])
	i := slices.IndexFunc(prev.Choices, func(c Choice) bool { return c.Answer == answer })
	switch {
	case i < 0:
		return -1, ReasonAssistant
	case len(msgs) == n+1:
		return -1, ReasonShorter
	case !prev.Choices[i].Ended:
		// The answer was cut (max_tokens, a stop string): the caller may
		// still join it with JoinCut.
		return i, ReasonNotEnded
	}
	return i, ""
}

// maxJoinTail is how far from the end of the rendered closed history the
// previous answer's end-of-turn token may sit: the template's join after an
// assistant turn is a few tokens at most ("\n" in ChatML, nothing in
// Llama 3).
const maxJoinTail = 8

// Join builds an extending call's prompt into dst: prev.Prompt, the
// response ids of choice, then the ids that follow the answer's end-of-turn token in
// full. closed is the engine's rendering of the history up to and including
// the answer without a generation prompt; full is its rendering of the
// whole call. The end-of-turn token is the answer's last id; it is found as
// the same occurrence (by count) in closed and in full, and the ids after it
// in closed must start the ids after it in full, so the join between the
// turns is exactly what the template renders. ok is false when it cannot be
// located: the caller then renders whole (ReasonJoin), never a guessed
// prompt.
func Join(dst []uint32, prev *Prev, choice int, closed, full []uint32) (_ []uint32, ok bool) {
	if choice < 0 || choice >= len(prev.Choices) || len(prev.Choices[choice].Response) == 0 || len(closed) == 0 {
		return dst, false
	}
	response := prev.Choices[choice].Response
	eot := response[len(response)-1]
	j := lastIndex(closed, eot)
	if j < 0 || len(closed)-1-j > maxJoinTail {
		return dst, false
	}
	rest, ok := joinAfter(prev.Prompt, closed, j, full)
	if !ok {
		return dst, false
	}
	dst = append(dst, prev.Prompt...)
	dst = append(dst, response...)
	return append(dst, rest...), true
}

// JoinCut is Join for an answer that did not end on an end-of-turn token
// (cut by max_tokens or a stop string): the template closes the turn after
// the answer, so the prompt is prev.Prompt, the sampled ids, the closing
// ids the template renders after them, then the new messages' ids. The
// closing is derived from closed only when it is exact: near its end,
// closed must hold exactly the sampled ids (the answer's text re-renders
// to the sampled tokens), right after the opening prev.Prompt ends with
// (its last maxOpening ids: the assistant turn's generation prompt); the
// closing is then the ids after them up to the first one that joins full
// as Join's end-of-turn token does. Earlier turns may render differently
// from prev.Prompt (Qwen3 drops earlier thinking), as in Join. ok is false
// otherwise (the caller renders whole, ReasonNotEnded).
func JoinCut(dst []uint32, prev *Prev, choice int, closed, full []uint32) (_ []uint32, ok bool) {
	if choice < 0 || choice >= len(prev.Choices) || len(prev.Choices[choice].Response) == 0 {
		return dst, false
	}
	response := prev.Choices[choice].Response
	k := min(len(prev.Prompt), maxOpening)
	opening := prev.Prompt[len(prev.Prompt)-k:]
	for s := len(closed) - len(response) - 1; s >= k && len(closed)-len(response)-s <= maxJoinTail; s-- {
		e := s + len(response)
		if !slices.Equal(closed[s:e], response) || !slices.Equal(closed[s-k:s], opening) {
			continue
		}
		for j := e; j < len(closed) && j-e < maxJoinTail; j++ {
			if rest, ok := joinAfter(prev.Prompt, closed, j, full); ok {
				dst = append(dst, prev.Prompt...)
				dst = append(dst, response...)
				dst = append(dst, closed[e:j+1]...)
				return append(dst, rest...), true
			}
		}
		return dst, false
	}
	return dst, false
}

// maxOpening is how many of the previous prompt's last ids (the assistant
// turn's opening) JoinCut requires right before the answer in closed.
const maxOpening = 4

// joinAfter returns the ids of full after the turn that closed[j] (the
// answer's end-of-turn token) ends: the same occurrence (by count) of that
// id in full, provided the ids after it in closed start the ids after it in
// full. A template that writes the generation prompt although none was
// asked for (Llama 3's writes it always) renders after the turn exactly the
// ids that follow prompt's last occurrence of the token: those are no join,
// and nothing is required after the token then.
func joinAfter(prompt, closed []uint32, j int, full []uint32) ([]uint32, bool) {
	eot := closed[j]
	count := 0
	for _, id := range closed[:j+1] {
		if id == eot {
			count++
		}
	}
	k := -1
	for i, id := range full {
		if id == eot {
			count--
			if count == 0 {
				k = i
				break
			}
		}
	}
	if k < 0 {
		return nil, false
	}
	tail, rest := closed[j+1:], full[k+1:]
	if last := lastIndex(prompt, eot); len(tail) > 0 && last >= 0 && slices.Equal(prompt[last+1:], tail) {
		tail = nil
	}
	if len(rest) <= len(tail) || !slices.Equal(rest[:len(tail)], tail) {
		return nil, false
	}
	return rest, true
}

// lastIndex is the index of the last id in ids, or -1.
func lastIndex(ids []uint32, id uint32) int {
	for i := len(ids) - 1; i >= 0; i-- {
		if ids[i] == id {
			return i
		}
	}
	return -1
}

// Canonical returns the canonical form of each message of a chat request's
// "messages" array: the message's JSON with null members dropped, a null
// content as "", and tool calls' arguments compared as JSON; keys sorted
// (encoding/json sorts map keys), numbers kept as written.
func Canonical(messages []byte) ([]string, error) {
	var raw []json.RawMessage
	if err := json.Unmarshal(messages, &raw); err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	out := make([]string, 0, len(raw))
	for i, m := range raw {
		c, err := canonicalMessage(m, false)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// AnswerOf is the canonical form of an assistant message for comparing it
// with the answer the gateway returned (CanonicalAnswer): role, content and
// tool calls (id, name, arguments) only, since clients drop or keep the
// engine's other members (refusal, annotations, reasoning) as they like,
// and the previous answer's ids stand for all of them.
func AnswerOf(canonical string) string {
	c, err := canonicalMessage([]byte(canonical), true)
	if err != nil {
		return "\x00invalid"
	}
	return c
}

// CanonicalAnswer is AnswerOf for the raw JSON of the returned message.
func CanonicalAnswer(message []byte) (string, error) {
	return canonicalMessage(message, true)
}

func canonicalMessage(m []byte, answer bool) (string, error) {
	d := json.NewDecoder(bytes.NewReader(m))
	d.UseNumber()
	var obj map[string]any
	if err := d.Decode(&obj); err != nil || obj == nil {
		return "", fmt.Errorf("not a JSON object")
	}
	for k, v := range obj {
		if v == nil && k != "content" {
			delete(obj, k)
		}
	}
	if c, ok := obj["content"]; !ok || c == nil {
		obj["content"] = ""
	}
	if tc, ok := obj["tool_calls"].([]any); ok {
		if len(tc) == 0 {
			delete(obj, "tool_calls")
		}
		for _, t := range tc {
			call, ok := t.(map[string]any)
			if !ok {
				continue
			}
			fn, ok := call["function"].(map[string]any)
			if !ok {
				continue
			}
			if s, ok := fn["arguments"].(string); ok {
				dd := json.NewDecoder(bytes.NewReader([]byte(s)))
				dd.UseNumber()
				var v any
				if dd.Decode(&v) == nil && !dd.More() {
					fn["arguments"] = v
				}
			}
			if answer {
				call["function"] = map[string]any{"name": fn["name"], "arguments": fn["arguments"]}
				for k := range call {
					if k != "id" && k != "function" {
						delete(call, k)
					}
				}
			}
		}
	}
	if answer {
		for k := range obj {
			if k != "role" && k != "content" && k != "tool_calls" {
				delete(obj, k)
			}
		}
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// renderFields are the chat request's members besides messages that change
// the rendered prompt (vLLM's ChatCompletionRequest: tools, the template
// and its arguments, documents) and the model (another model, another
// tokenizer).
var renderFields = []string{"model", "tools", "chat_template", "chat_template_kwargs", "documents", "continue_final_message", "add_generation_prompt"}

// RenderKey is the canonical JSON of the request's renderFields.
func RenderKey(body []byte) string {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var obj map[string]any
	if d.Decode(&obj) != nil {
		return "\x00invalid"
	}
	key := make(map[string]any, len(renderFields))
	for _, f := range renderFields {
		if v, ok := obj[f]; ok && v != nil {
			key[f] = v
		}
	}
	b, _ := json.Marshal(key)
	return string(b)
}
