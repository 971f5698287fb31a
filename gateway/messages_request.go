package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"unicode/utf8"
)

// An Anthropic Messages request (POST /v1/messages) is answered by the
// engine's chat completions route: vLLM 0.32, SGLang and llama.cpp each serve
// a /v1/messages of their own, but each builds a chat request from a fixed
// set of fields and returns no token ids or logprobs there (docs/engines.md,
// "Anthropic Messages"). The gateway therefore does that translation itself,
// following vLLM's (vllm/entrypoints/anthropic/serving.py,
// to_chat_completion_request), and asks the engine's chat route, where ids
// are injected as for any chat call.
//
// What the translation cannot express is refused with a 400 naming the
// field (messagesError), never dropped.

// messagesError is a request the translation refuses: Field names the JSON
// path ("messages[2].content[0].type"), Msg says why and what to send.
type messagesError struct {
	Field, Msg string
}

func (e *messagesError) Error() string { return e.Field + ": " + e.Msg }

func badField(field, format string, args ...any) error {
	return &messagesError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Anthropic's request fields that are forwarded, and those accepted but not
// forwarded because they change nothing the engine computes.
var (
	messagesIgnored = map[string]bool{"metadata": true, "service_tier": true}
	messagesFields  = map[string]bool{
		"model": true, "messages": true, "max_tokens": true, "system": true, "stop_sequences": true,
		"stream": true, "temperature": true, "top_p": true, "top_k": true, "tools": true,
		"tool_choice": true, "thinking": true,
	}
)

type anthBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Source    json.RawMessage `json:"source"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   *bool           `json:"is_error"`
	Thinking  *string         `json:"thinking"`
}

type anthSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
	URL       string `json:"url"`
}

type chatMessage struct {
	Role       string         `json:"role"`
	Content    any            `json:"content,omitempty"`
	Reasoning  string         `json:"reasoning,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID *string        `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatPart struct {
	Type     string        `json:"type"`
	Text     *string       `json:"text,omitempty"`
	ImageURL *chatImageURL `json:"image_url,omitempty"`
}

type chatImageURL struct {
	URL string `json:"url"`
}

type chatTool struct {
	Type     string       `json:"type"`
	Function chatToolFunc `json:"function"`
}

type chatToolFunc struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	Strict      *bool           `json:"strict,omitempty"`
}

// chatRequest is the chat completion sent for a Messages request; the field
// order is the stored request_body's.
type chatRequest struct {
	Model               json.RawMessage `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           int64           `json:"max_tokens"`
	Stop                []string        `json:"stop,omitempty"`
	Stream              bool            `json:"stream,omitempty"`
	StreamOptions       *chatStreamOpts `json:"stream_options,omitempty"`
	Temperature         json.RawMessage `json:"temperature,omitempty"`
	TopP                json.RawMessage `json:"top_p,omitempty"`
	TopK                json.RawMessage `json:"top_k,omitempty"`
	Tools               []chatTool      `json:"tools,omitempty"`
	ToolChoice          any             `json:"tool_choice,omitempty"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls,omitempty"`
	ChatTemplateKwargs  map[string]bool `json:"chat_template_kwargs,omitempty"`
	ThinkingTokenBudget int64           `json:"thinking_token_budget,omitempty"`
}

type chatStreamOpts struct {
	IncludeUsage bool `json:"include_usage"`
}

// messagesToChat translates an Anthropic Messages request body into the
// chat completions body sent to the engine, and reports whether it streams.
// The body has been validated as one JSON object.
func messagesToChat(body []byte) (chat []byte, stream bool, err error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, false, badField("body", "not a JSON object: %v", err)
	}
	for k := range top {
		if !messagesFields[k] && !messagesIgnored[k] {
			return nil, false, badField(strconv.Quote(k), "not supported by this gateway's translation to the engine's chat completions; remove it")
		}
	}
	var out chatRequest
	var model string
	if err := json.Unmarshal(top["model"], &model); err != nil || model == "" {
		return nil, false, badField("model", "must be a non-empty string")
	}
	out.Model = top["model"]
	raw, ok := top["max_tokens"]
	if !ok {
		return nil, false, badField("max_tokens", "is required (a positive integer)")
	}
	if err := json.Unmarshal(raw, &out.MaxTokens); err != nil || out.MaxTokens < 1 {
		return nil, false, badField("max_tokens", "must be a positive integer, got %s", clip(raw))
	}
	if raw, ok := top["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &stream); err != nil {
			return nil, false, badField("stream", "must be true or false")
		}
	}
	if stream {
		out.Stream, out.StreamOptions = true, &chatStreamOpts{IncludeUsage: true}
	}
	for _, f := range []struct {
		name string
		dst  *json.RawMessage
		max  float64
		int  bool
	}{{"temperature", &out.Temperature, 2, false}, {"top_p", &out.TopP, 1, false}, {"top_k", &out.TopK, math.MaxInt32, true}} {
		raw, ok := top[f.name]
		if !ok || string(raw) == "null" {
			continue
		}
		v, err := strconv.ParseFloat(string(raw), 64)
		if err != nil || v < 0 || v > f.max || (f.int && v != math.Trunc(v)) {
			kind := "a number"
			if f.int {
				kind = "a non-negative integer"
			}
			return nil, false, badField(f.name, "must be %s from 0 to %g, got %s", kind, f.max, clip(raw))
		}
		*f.dst = raw
	}
	if raw, ok := top["stop_sequences"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &out.Stop); err != nil {
			return nil, false, badField("stop_sequences", "must be an array of strings")
		}
	}
	if raw, ok := top["system"]; ok && string(raw) != "null" {
		sys, err := systemText(raw)
		if err != nil {
			return nil, false, err
		}
		if sys != "" {
			out.Messages = append(out.Messages, chatMessage{Role: "system", Content: sys})
		}
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(top["messages"], &msgs); err != nil || len(msgs) == 0 {
		return nil, false, badField("messages", "must be a non-empty array of messages")
	}
	for i, m := range msgs {
		if out.Messages, err = appendMessage(out.Messages, m, i, i == len(msgs)-1); err != nil {
			return nil, false, err
		}
	}
	if len(out.Messages) == 0 { // e.g. user messages of empty text blocks only
		return nil, false, badField("messages", "have nothing to send: every message's content is empty")
	}
	if out.Tools, err = chatTools(top["tools"]); err != nil {
		return nil, false, err
	}
	if err := toolChoice(&out, top["tool_choice"]); err != nil {
		return nil, false, err
	}
	if err := thinking(&out, top["thinking"]); err != nil {
		return nil, false, err
	}
	if chat, err = marshalJSON(&out); err != nil {
		return nil, false, fmt.Errorf("encoding the chat request: %w", err)
	}
	return chat, stream, nil
}

// systemText is the system prompt: a string, or text blocks joined as vLLM
// joins them (no separator).
func systemText(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []anthBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", badField("system", "must be a string or an array of text blocks")
	}
	var b []byte
	for i, bl := range blocks {
		if bl.Type != "text" || bl.Text == nil {
			return "", badField(fmt.Sprintf("system[%d]", i), "only text blocks (with \"text\") are supported in system, got type %q", bl.Type)
		}
		b = append(b, *bl.Text...)
	}
	return string(b), nil
}

// appendMessage appends the chat messages of Anthropic message i: tool
// results become "tool" messages ahead of the user's own content (as in vLLM).
// An empty array of content blocks is refused, as Anthropic's API does,
// except in the last message when it is the assistant's (a prefill).
func appendMessage(dst []chatMessage, raw json.RawMessage, i int, last bool) ([]chatMessage, error) {
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	at := fmt.Sprintf("messages[%d]", i)
	if err := json.Unmarshal(raw, &m); err != nil {
		return dst, badField(at, "must be an object with role and content")
	}
	if m.Role != "user" && m.Role != "assistant" {
		return dst, badField(at+".role", `must be "user" or "assistant", got %q`, m.Role)
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return append(dst, chatMessage{Role: m.Role, Content: s}), nil
	}
	var blocks []anthBlock
	if err := json.Unmarshal(m.Content, &blocks); err != nil {
		return dst, badField(at+".content", "must be a string or an array of content blocks")
	}
	if len(blocks) == 0 && (m.Role == "user" || !last) {
		return dst, badField(at+".content", "must not be empty (only the final assistant message may be)")
	}
	out := chatMessage{Role: m.Role}
	var parts []chatPart
	var reasoning []byte
	for j, b := range blocks {
		bat := fmt.Sprintf("%s.content[%d]", at, j)
		switch {
		case b.Type == "text":
			if b.Text == nil {
				return dst, badField(bat+".text", "is required in a text block")
			}
			if *b.Text != "" {
				parts = append(parts, chatPart{Type: "text", Text: b.Text})
			}
		case b.Type == "image" && m.Role == "user":
			url, err := imageURL(b.Source, bat+".source")
			if err != nil {
				return dst, err
			}
			parts = append(parts, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: url}})
		case b.Type == "thinking" && m.Role == "assistant":
			if b.Thinking == nil {
				return dst, badField(bat+".thinking", "is required in a thinking block")
			}
			reasoning = append(reasoning, *b.Thinking...)
		case b.Type == "tool_use" && m.Role == "assistant":
			if b.ID == "" || b.Name == "" {
				return dst, badField(bat, "a tool_use block needs a non-empty id and name")
			}
			args, err := pyJSON(b.Input, bat+".input")
			if err != nil {
				return dst, err
			}
			out.ToolCalls = append(out.ToolCalls, chatToolCall{ID: b.ID, Type: "function", Function: chatFunction{Name: b.Name, Arguments: args}})
		case b.Type == "tool_result" && m.Role == "user":
			if b.ToolUseID == "" {
				return dst, badField(bat+".tool_use_id", "is required in a tool_result block")
			}
			var err error
			if dst, err = appendToolResult(dst, b, bat); err != nil {
				return dst, err
			}
		default:
			return dst, badField(bat+".type", "block type %q is not supported in a %s message by this gateway's translation (supported: user text, image, tool_result; assistant text, thinking, tool_use)", b.Type, m.Role)
		}
	}
	out.Reasoning = string(reasoning)
	switch {
	case len(parts) == 1 && parts[0].Type == "text":
		out.Content = *parts[0].Text
	case len(parts) > 0:
		out.Content = parts
	case len(out.ToolCalls) == 0 && out.Reasoning == "":
		if m.Role == "user" {
			return dst, nil // only tool results (vLLM adds no empty user message)
		}
	}
	return append(dst, out), nil
}

// appendToolResult appends a tool_result as a "tool" message (its text
// parts joined by newlines) and its images as a user message after it.
func appendToolResult(dst []chatMessage, b anthBlock, at string) ([]chatMessage, error) {
	id := b.ToolUseID
	text := ""
	var images []chatPart
	if len(b.Content) > 0 && string(b.Content) != "null" {
		if json.Unmarshal(b.Content, &text) != nil {
			var items []anthBlock
			if err := json.Unmarshal(b.Content, &items); err != nil {
				return dst, badField(at+".content", "must be a string or an array of text and image blocks")
			}
			var texts []byte
			for k, it := range items {
				iat := fmt.Sprintf("%s.content[%d]", at, k)
				switch it.Type {
				case "text":
					if it.Text == nil {
						return dst, badField(iat+".text", "is required in a text block")
					}
					if k > 0 && len(texts) > 0 {
						texts = append(texts, '\n')
					}
					texts = append(texts, *it.Text...)
				case "image":
					url, err := imageURL(it.Source, iat+".source")
					if err != nil {
						return dst, err
					}
					images = append(images, chatPart{Type: "image_url", ImageURL: &chatImageURL{URL: url}})
				default:
					return dst, badField(iat+".type", "only text and image blocks are supported in a tool_result, got %q", it.Type)
				}
			}
			text = string(texts)
		}
	}
	if b.IsError != nil && *b.IsError {
		return dst, badField(at+".is_error", "a chat completion has no way to mark a tool result as an error; send the error as the result's text without is_error")
	}
	dst = append(dst, chatMessage{Role: "tool", ToolCallID: &id, Content: text})
	if len(images) > 0 {
		dst = append(dst, chatMessage{Role: "user", Content: images})
	}
	return dst, nil
}

// imageURL is an image block's source as a chat image_url: a data URL for
// base64, the URL itself for a url source.
func imageURL(raw json.RawMessage, at string) (string, error) {
	var src anthSource
	if err := json.Unmarshal(raw, &src); err != nil || len(raw) == 0 {
		return "", badField(at, "must be an object (base64 or url source)")
	}
	switch {
	case src.Type == "base64" && src.MediaType != "" && src.Data != "":
		return "data:" + src.MediaType + ";base64," + src.Data, nil
	case src.Type == "url" && src.URL != "":
		return src.URL, nil
	}
	return "", badField(at, `must be {"type":"base64","media_type":…,"data":…} or {"type":"url","url":…}`)
}

func chatTools(raw json.RawMessage) ([]chatTool, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var tools []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, badField("tools", "must be an array of tools")
	}
	out := make([]chatTool, 0, len(tools))
	for i, t := range tools {
		at := fmt.Sprintf("tools[%d]", i)
		if typ, ok := t["type"]; ok && string(typ) != `"custom"` && string(typ) != "null" {
			return nil, badField(at+".type", "server and client tools of type %s run at Anthropic, not on an engine; declare a custom tool (name, description, input_schema)", clip(typ))
		}
		var name, desc string
		if err := json.Unmarshal(t["name"], &name); err != nil || name == "" {
			return nil, badField(at+".name", "must be a non-empty string")
		}
		if d, ok := t["description"]; ok && string(d) != "null" {
			if err := json.Unmarshal(d, &desc); err != nil {
				return nil, badField(at+".description", "must be a string")
			}
		}
		schema := t["input_schema"]
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(schema, &obj); err != nil || obj == nil {
			return nil, badField(at+".input_schema", "must be a JSON Schema object")
		}
		var strict *bool
		if v, ok := t["strict"]; ok && string(v) != "null" {
			if err := json.Unmarshal(v, &strict); err != nil {
				return nil, badField(at+".strict", "must be true or false")
			}
		}
		for k := range t {
			switch k {
			case "type", "name", "description", "input_schema", "cache_control", "strict":
			default:
				return nil, badField(at+"."+k, "not supported by this gateway's translation; remove it")
			}
		}
		out = append(out, chatTool{Type: "function", Function: chatToolFunc{Name: name, Description: desc, Parameters: schema, Strict: strict}})
	}
	return out, nil
}

func toolChoice(out *chatRequest, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		if len(out.Tools) > 0 {
			out.ToolChoice = "auto"
		}
		return nil
	}
	var tc struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse *bool  `json:"disable_parallel_tool_use"`
	}
	if err := json.Unmarshal(raw, &tc); err != nil {
		return badField("tool_choice", "must be an object with a type")
	}
	switch tc.Type {
	case "auto":
		out.ToolChoice = "auto"
	case "any":
		out.ToolChoice = "required"
	case "none":
		out.ToolChoice = "none"
	case "tool":
		if tc.Name == "" {
			return badField("tool_choice.name", `is required when type is "tool"`)
		}
		out.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
	default:
		return badField("tool_choice.type", `must be "auto", "any", "tool" or "none", got %q`, tc.Type)
	}
	if tc.DisableParallelToolUse != nil {
		p := !*tc.DisableParallelToolUse
		out.ParallelToolCalls = &p
	}
	return nil
}

// thinking maps the thinking setting onto the chat template's
// enable_thinking switch and, for a budget, vLLM's thinking_token_budget.
func thinking(out *chatRequest, raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var th struct {
		Type         string `json:"type"`
		BudgetTokens *int64 `json:"budget_tokens"`
	}
	if err := json.Unmarshal(raw, &th); err != nil {
		return badField("thinking", "must be an object with a type")
	}
	switch th.Type {
	case "enabled":
		if th.BudgetTokens == nil || *th.BudgetTokens < 1024 || *th.BudgetTokens >= out.MaxTokens {
			return badField("thinking.budget_tokens", "must be an integer of at least 1024 and less than max_tokens (%d)", out.MaxTokens)
		}
		out.ThinkingTokenBudget = *th.BudgetTokens
		out.ChatTemplateKwargs = map[string]bool{"enable_thinking": true}
	case "adaptive":
		out.ChatTemplateKwargs = map[string]bool{"enable_thinking": true}
	case "disabled":
		out.ChatTemplateKwargs = map[string]bool{"enable_thinking": false}
	default:
		return badField("thinking.type", `must be "enabled", "adaptive" or "disabled", got %q`, th.Type)
	}
	return nil
}

// pyJSON formats a tool_use input as vLLM does (Python's json.dumps:
// ", " and ": " separators, non-ASCII escaped), so the engine renders the
// same prompt as its own Messages route would. A missing input is {}.
func pyJSON(raw json.RawMessage, at string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "{}", nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", badField(at, "must be a JSON object")
	}
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		return "", badField(at, "must be a JSON object: %v", err)
	}
	src := c.Bytes()
	out := make([]byte, 0, len(src)+len(src)/4)
	in := false
	for i := 0; i < len(src); {
		ch := src[i]
		switch {
		case in && ch == '\\':
			out = append(out, src[i], src[i+1])
			i += 2
			continue
		case ch == '"':
			in = !in
		case in && ch >= utf8.RuneSelf:
			r, n := utf8.DecodeRune(src[i:])
			if r >= 0x10000 {
				r1, r2 := utf16Pair(r)
				out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
			} else {
				out = fmt.Appendf(out, `\u%04x`, r)
			}
			i += n
			continue
		case !in && (ch == ',' || ch == ':'):
			out = append(out, ch, ' ')
			i++
			continue
		}
		out = append(out, ch)
		i++
	}
	return string(out), nil
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// clip is a client value quoted in an error, cut to 64 bytes.
func clip(raw []byte) string {
	if len(raw) > 64 {
		return string(raw[:64]) + "…"
	}
	return string(raw)
}
