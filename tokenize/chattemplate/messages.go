package chattemplate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// PrepareMessages returns the JSON messages array as vLLM hands it to a chat
// template ("string" content format):
//   - a null or missing content becomes "";
//   - a content list of text parts ({"type": "text"|"input_text"|"output_text",
//     "text": ...}) becomes their texts joined with "\n" (other part types
//     are an error: images and audio cannot be re-rendered);
//   - the "arguments" of each assistant tool call, a JSON string in the
//     OpenAI format, becomes the object it holds (templates expect objects);
//     arguments that are not valid JSON stay a string; absent, null or
//     empty arguments become {}, as vLLM renders them;
//   - an assistant message with "reasoning" but no "reasoning_content" (the
//     field's newer name in vLLM responses) gets reasoning_content, which
//     templates such as Qwen3's read.
//
// Other fields are kept as they are, in their order.
func PrepareMessages(messages []byte) ([]byte, error) {
	arr := gjson.ParseBytes(messages)
	if !arr.IsArray() {
		return nil, errors.New("chattemplate: messages is not a JSON array")
	}
	var b strings.Builder
	b.WriteByte('[')
	var err error
	arr.ForEach(func(key, m gjson.Result) bool {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		var out string
		if out, err = prepareMessage(m); err != nil {
			err = fmt.Errorf("chattemplate: message %d: %w", key.Int(), err)
			return false
		}
		b.WriteString(out)
		return true
	})
	if err != nil {
		return nil, err
	}
	b.WriteByte(']')
	return []byte(b.String()), nil
}

func prepareMessage(m gjson.Result) (string, error) {
	if !m.IsObject() {
		return "", errors.New("not a JSON object")
	}
	out := m.Raw
	var err error
	c := m.Get("content")
	switch {
	case !c.Exists() || c.Type == gjson.Null:
		out, err = sjson.Set(out, "content", "")
	case c.IsArray():
		var texts []string
		c.ForEach(func(_, p gjson.Result) bool {
			switch t := p.Get("type").String(); t {
			case "text", "input_text", "output_text":
				texts = append(texts, p.Get("text").String())
			default:
				err = fmt.Errorf("content part of type %q cannot be rendered as text", t)
				return false
			}
			return true
		})
		if err == nil {
			out, err = sjson.Set(out, "content", strings.Join(texts, "\n"))
		}
	}
	if err != nil {
		return "", err
	}
	if m.Get("role").String() != "assistant" {
		return out, nil
	}
	if r := m.Get("reasoning"); r.Exists() && !m.Get("reasoning_content").Exists() {
		if out, err = sjson.SetRaw(out, "reasoning_content", r.Raw); err != nil {
			return "", err
		}
	}
	calls := m.Get("tool_calls")
	if !calls.IsArray() {
		return out, nil
	}
	i := 0
	calls.ForEach(func(_, tc gjson.Result) bool {
		args := tc.Get("function.arguments")
		if tc.Get("function").IsObject() && (args.Type == gjson.Null || args.Type == gjson.String && strings.TrimSpace(args.Str) == "") {
			// vLLM renders absent, null and empty arguments as {}
			// (vllm/renderers/chat_utils.py, 0.32); written raw, "" would
			// leave no value at all.
			if out, err = sjson.SetRaw(out, fmt.Sprintf("tool_calls.%d.function.arguments", i), "{}"); err != nil {
				return false
			}
		} else if args.Type == gjson.String && jsonscan.Validate(jsonscan.Bytes(args.Str)) == nil {
			if out, err = sjson.SetRaw(out, fmt.Sprintf("tool_calls.%d.function.arguments", i), args.Str); err != nil {
				return false
			}
		}
		i++
		return true
	})
	return out, err
}
