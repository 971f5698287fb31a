package mock

import "github.com/tidwall/gjson"

// The toy chat template is ChatML-like:
//
//	<|im_start|>system\nTools<tools>{compact tool JSON}...</tools><|im_end|>\n   (only with tools)
//	<|im_start|>{role}\n{text}<|im_end|>\n                                    (per message)
//	<|im_start|>assistant\n                                                 (add_generation_prompt)
//
// {text} is the string content, or the concatenated "text" of content parts; an assistant
// message's tool calls follow as <tool_call>{"name":"f","arguments":ARGS}</tool_call>, where
// ARGS is the arguments string as given. Tool definitions are rendered as compact JSON, one
// after the other, so insignificant whitespace in the request never changes the prompt.

// RenderChat renders a chat prompt from the raw JSON of "messages" (an array) and "tools"
// (an array, or empty/null). Malformed input is rendered as far as it can be read.
func RenderChat(messagesJSON, toolsJSON []byte, addGenerationPrompt bool) string {
	return string(appendRenderChat(nil, b2s(messagesJSON), b2s(toolsJSON), addGenerationPrompt))
}

func appendRenderChat(dst []byte, messages, tools string, addGenerationPrompt bool) []byte {
	if t := gjson.Parse(tools); t.IsArray() {
		dst = append(dst, "<|im_start|>system\nTools<tools>"...)
		t.ForEach(func(_, tool gjson.Result) bool {
			dst = appendCompactJSON(dst, tool.Raw)
			return true
		})
		dst = append(dst, "</tools><|im_end|>\n"...)
	}
	gjson.Parse(messages).ForEach(func(_, m gjson.Result) bool {
		dst = appendMessage(dst, m.Get("role").String(), m.Get("content"), m.Get("tool_calls"))
		return true
	})
	if addGenerationPrompt {
		dst = append(dst, "<|im_start|>assistant\n"...)
	}
	return dst
}

func appendMessage(dst []byte, role string, content, toolCalls gjson.Result) []byte {
	dst = append(dst, "<|im_start|>"...)
	dst = append(dst, role...)
	dst = append(dst, '\n')
	dst = appendContentText(dst, content)
	toolCalls.ForEach(func(_, tc gjson.Result) bool {
		fn := tc.Get("function")
		dst = append(dst, `<tool_call>{"name":`...)
		dst = appendJSONString(dst, fn.Get("name").String())
		dst = append(dst, `,"arguments":`...)
		args := fn.Get("arguments")
		if args.Type == gjson.String {
			dst = append(dst, args.Str...)
		} else {
			dst = appendCompactJSON(dst, args.Raw)
		}
		dst = append(dst, "}</tool_call>"...)
		return true
	})
	return append(dst, "<|im_end|>\n"...)
}

// appendContentText appends a message content: a string, or the text of its parts.
func appendContentText(dst []byte, content gjson.Result) []byte {
	switch {
	case content.Type == gjson.String:
		return append(dst, content.Str...)
	case content.IsArray():
		content.ForEach(func(_, part gjson.Result) bool {
			if t := part.Get("text"); t.Type == gjson.String {
				dst = append(dst, t.Str...)
			}
			return true
		})
	}
	return dst
}
