package mock

// What vLLM's hermes tool parser streams for a tool call (vLLM flavour).
//
// Hermes2ProToolParser.extract_tool_calls_streaming (vllm/tool_parsers/
// hermes_tool_parser.py, vLLM 0.32.0) re-parses the whole text after each
// sampled token and sends only what is new:
//   - the name, once `"name": "…"` is complete: one DeltaToolCall {id, type,
//     index, function: {name}} (no arguments member);
//   - the arguments as raw text diffs of what follows `"arguments":`, up to
//     (not including) the `}` that closes the outer object;
//   - nothing for the other tokens (`<tool_call>{"name":`, `}</tool_call>`, the
//     end-of-turn token): the serving layer then sends a chunk with an empty
//     delta only when the client asked for logprobs or return_token_ids, and
//     the finish chunk always (chat_completion/serving.py, the `delta_message
//     is None` branch).
// A delta with tool calls also says "content": null (DeltaMessage(content=…,
// tool_calls=…) with content None, serialised with exclude_unset).

// planHermes sets c.hermes and fills c.nameAt and c.argDiff for the tool call in c.ids, whose text
// is `<tool_call>{"name":NAME,"arguments":ARGS}</tool_call>` (buildChat).
func planHermes(c *planChoice) {
	// Where the name's closing quote and the arguments lie in the call's text.
	nameEnd := len(`<tool_call>{"name":`) + len(appendJSONString(nil, b2s(c.name)))
	argsStart := nameEnd + len(`,"arguments":`)
	argsEnd := argsStart + len(c.args)
	c.hermes, c.nameAt = true, -1
	c.argDiff = c.argDiff[:0]
	off, sent := 0, argsStart
	for k, id := range c.ids {
		off += len(c.v.text(id))
		if c.nameAt < 0 && off >= nameEnd {
			c.nameAt = k
		}
		diff := ""
		if upto := min(off, argsEnd); upto > sent {
			diff = b2s(c.args[sent-argsStart : upto-argsStart])
			sent = upto
		}
		c.argDiff = append(c.argDiff, diff)
	}
}

// appendHermesDelta appends the delta of stream step st of tool-call choice c
// and reports whether it is empty ({}).
func appendHermesDelta(dst []byte, c *planChoice, st int) ([]byte, bool) {
	name, args := st == c.nameAt, c.argDiff[st]
	if !name && args == "" {
		return append(dst, "{}"...), true
	}
	dst = append(dst, `{"content":null,"tool_calls":[`...)
	if name {
		dst = append(dst, `{"id":`...)
		dst = appendCallID(dst, c)
		dst = append(dst, `,"type":"function","index":0,"function":{"name":`...)
		dst = appendJSONString(dst, b2s(c.name))
		dst = append(dst, "}}"...)
		if args != "" {
			dst = append(dst, ',')
		}
	}
	if args != "" {
		dst = append(dst, `{"index":0,"function":{"arguments":`...)
		dst = appendJSONString(dst, args)
		dst = append(dst, "}}"...)
	}
	return append(dst, "]}"...), false
}

// appendPyJSON appends compact JSON as Python's json.dumps writes it (", " and
// ": " between members): vLLM's hermes parser loads a whole answer's tool
// call and dumps its arguments again (extract_tool_calls,
// vllm/tool_parsers/hermes_tool_parser.py, 0.32.0).
func appendPyJSON(dst []byte, compact []byte) []byte {
	inStr, esc := false, false
	for _, ch := range compact {
		dst = append(dst, ch)
		switch {
		case inStr && esc:
			esc = false
		case inStr && ch == '\\':
			esc = true
		case ch == '"':
			inStr = !inStr
		case !inStr && (ch == ',' || ch == ':'):
			dst = append(dst, ' ')
		}
	}
	return dst
}
