package mock

import (
	"bufio"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// SGLang flavour (FlavorSGLang): pydantic models dumped with their null fields, ids are
// 32 hex digits without a prefix, return_token_ids puts prompt_token_ids and token_ids on
// every choice (keys omitted when not asked), a choice that ended on EOS names it in
// matched_stop, and usage carries prompt_tokens_details and reasoning_tokens.
//
// Chat, non-streaming:
//
//	{"id":"<hex>","object":"chat.completion","created":C,"model":"m","choices":[{"index":0,
//	 "message":{"role":"assistant","content":"Hi","reasoning_content":null,"tool_calls":null},
//	 "logprobs":null,"finish_reason":"stop","matched_stop":258,"prompt_token_ids":[...],
//	 "token_ids":[...]}],"usage":{...},"metadata":null}
//
// Streamed chat with return_token_ids is a 400 (sglangStreamIDsError); without it the
// chunks carry full deltas {"role","content","reasoning_content","tool_calls"} and
// "matched_stop", then the usage chunk (choices []) if asked, then [DONE]. Completions
// stream ids per chunk (prompt_token_ids on a choice's first chunk).

// sglangStreamIDsError is SGLang's answer to a streamed chat request with return_token_ids.
const sglangStreamIDsError = "return_token_ids is not supported with streaming on /v1/chat/completions. Please set stream=false when using return_token_ids=true."

// appendSGLangMatchedStop appends the matched_stop of c: the EOS id when it stopped, else null.
func appendSGLangMatchedStop(dst []byte, c *planChoice) []byte {
	if c.finish == "stop" {
		return strconv.AppendInt(dst, sglangMatchedStop, 10)
	}
	return append(dst, "null"...)
}

// appendSGLangCallID appends "call_<24 hex>".
func appendSGLangCallID(dst []byte, c *planChoice) []byte {
	dst = append(dst, `"call_`...)
	dst = appendHex(dst, c.callID)
	dst = appendHex(dst, mix64(c.callID))[:len(dst)+8]
	return append(dst, '"')
}

func (p *plan) appendSGLangChatFull(dst []byte) []byte {
	dst = p.appendPrefix(dst, "", "chat.completion")
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"message":{"role":"assistant","content":`...)
		if c.tool {
			dst = append(dst, `null,"reasoning_content":null,"tool_calls":[{"id":`...)
			dst = appendSGLangCallID(dst, c)
			dst = append(dst, `,"index":0,"type":"function","function":{"name":`...)
			dst = appendJSONString(dst, b2s(c.name))
			dst = append(dst, `,"arguments":`...)
			dst = appendJSONString(dst, b2s(c.args))
			dst = append(dst, "}}]},"...)
		} else {
			dst = append(dst, '"')
			dst = c.v.appendText(dst, c.ids)
			dst = append(dst, `","reasoning_content":null,"tool_calls":null},`...)
		}
		dst = append(dst, `"logprobs":`...)
		dst = p.appendChatLogprobs(dst, c, 0, len(c.ids))
		dst = append(dst, `,"finish_reason":"`...)
		dst = append(dst, c.finish...)
		dst = append(dst, `","matched_stop":`...)
		dst = appendSGLangMatchedStop(dst, c)
		if p.returnIDs {
			dst = append(dst, `,"prompt_token_ids":`...)
			dst = appendIDs(dst, p.prompts)
			dst = append(dst, `,"token_ids":`...)
			dst = appendIDs(dst, c.ids)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return append(dst, `,"metadata":null}`...)
}

func (p *plan) streamSGLangChat(w *bufio.Writer) { p.streamWith(w, &sglangChatWire) }

var sglangChatWire = wire{
	role:   (*plan).appendSGLangChatRole,
	chunk:  (*plan).appendSGLangChatChunk,
	finish: (*plan).appendSGLangChatFinish,
	usage:  (*plan).appendSGLangChatUsage,
}

func (p *plan) appendSGLangChatRole(dst []byte, i int) []byte {
	dst = p.appendPrefix(dst, "", "chat.completion.chunk")
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	return append(dst, `,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`...)
}

func (p *plan) appendSGLangChatChunk(dst []byte, i int, c *planChoice, st int) []byte {
	dst = p.appendPrefix(dst, "", "chat.completion.chunk")
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	from, to := c.stepRange(st)
	switch {
	case !c.tool:
		dst = append(dst, `,"delta":{"role":null,"content":"`...)
		dst = appendJSONStringBody(dst, vocab[c.ids[st]])
		dst = append(dst, `","reasoning_content":null,"tool_calls":null}`...)
	case st == 0:
		dst = append(dst, `,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":`...)
		dst = appendSGLangCallID(dst, c)
		dst = append(dst, `,"index":0,"type":"function","function":{"name":`...)
		dst = appendJSONString(dst, b2s(c.name))
		dst = append(dst, `,"arguments":""}}]}`...)
	default:
		dst = append(dst, `,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":null,"index":0,"type":"function","function":{"name":null,"arguments":"`...)
		dst = appendJSONStringBody(dst, vocab[c.ids[from]])
		dst = append(dst, `"}}]}`...)
	}
	dst = append(dst, `,"logprobs":`...)
	dst = p.appendChatLogprobs(dst, c, from, to)
	return append(dst, `,"finish_reason":null,"matched_stop":null}],"usage":null}`...)
}

func (p *plan) appendSGLangChatFinish(dst []byte, i int, c *planChoice) []byte {
	dst = p.appendPrefix(dst, "", "chat.completion.chunk")
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	from, to := c.finishRange()
	dst = append(dst, `,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":`...)
	dst = p.appendChatLogprobs(dst, c, from, to)
	dst = append(dst, `,"finish_reason":"`...)
	dst = append(dst, c.finish...)
	dst = append(dst, `","matched_stop":`...)
	dst = appendSGLangMatchedStop(dst, c)
	return append(dst, `}],"usage":null}`...)
}

func (p *plan) appendSGLangChatUsage(dst []byte) []byte {
	return p.appendSGLangUsage(dst, "chat.completion.chunk")
}

func (p *plan) appendSGLangCompletionUsage(dst []byte) []byte {
	return p.appendSGLangUsage(dst, "text_completion")
}

// appendSGLangUsage appends the final usage chunk (choices []) of a stream of object obj.
func (p *plan) appendSGLangUsage(dst []byte, obj string) []byte {
	dst = p.appendPrefix(dst, "", obj)
	dst = append(dst, `],"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return append(dst, '}')
}

func (p *plan) appendSGLangCompletionFull(dst []byte) []byte {
	dst = p.appendPrefix(dst, "", "text_completion")
	for i := range p.choices {
		c := &p.choices[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = p.appendCompletionChoiceHead(dst, i, c)
		dst = append(dst, `","matched_stop":`...)
		dst = appendSGLangMatchedStop(dst, c)
		if p.returnIDs {
			dst = append(dst, `,"token_ids":`...)
			dst = appendIDs(dst, c.ids)
			dst = append(dst, `,"prompt_token_ids":`...)
			dst = appendIDs(dst, p.prompt(c.prompt))
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"usage":`...)
	dst = p.appendFlavorUsage(dst)
	return append(dst, `,"metadata":null}`...)
}

func (p *plan) streamSGLangCompletion(w *bufio.Writer) { p.streamWith(w, &sglangCompletionWire) }

var sglangCompletionWire = wire{
	chunk:  (*plan).appendSGLangCompletionChunk,
	finish: (*plan).appendSGLangCompletionFinish,
	usage:  (*plan).appendSGLangCompletionUsage,
}

func (p *plan) appendSGLangCompletionChunk(dst []byte, i int, c *planChoice, st int) []byte {
	dst = p.appendPrefix(dst, "", "text_completion")
	dst = p.appendCompletionStepHead(dst, i, c, st)
	dst = append(dst, `,"finish_reason":null,"matched_stop":null`...)
	if p.returnIDs && !p.dropIDs(st+1) {
		dst = append(dst, `,"token_ids":`...)
		dst = appendIDs(dst, c.ids[st:st+1])
	}
	if p.returnIDs && st == 0 {
		dst = append(dst, `,"prompt_token_ids":`...)
		dst = appendIDs(dst, p.prompt(c.prompt))
	}
	return append(dst, `}],"usage":null}`...)
}

func (p *plan) appendSGLangCompletionFinish(dst []byte, i int, c *planChoice) []byte {
	dst = p.appendPrefix(dst, "", "text_completion")
	dst = append(dst, `{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"text":"","logprobs":null,"finish_reason":"`...)
	dst = append(dst, c.finish...)
	dst = append(dst, `","matched_stop":`...)
	dst = appendSGLangMatchedStop(dst, c)
	return append(dst, `}],"usage":null}`...)
}

// sglangTokenize serves SGLang's POST /tokenize: exactly one of "prompt" (a string or a
// list of strings) and "messages" (rendered as the chat route does) ->
// {"tokens":[...],"count":N,"max_model_len":M}; a list of prompts gives lists.
func (s *Server) sglangTokenize(ctx *fasthttp.RequestCtx, f *fields, p *plan) {
	hasPrompt := f.prompt.Exists() && f.prompt.Type != gjson.Null
	hasMessages := f.messages.Exists() && f.messages.Type != gjson.Null
	msg := f.err
	switch {
	case msg != "":
	case hasPrompt == hasMessages:
		msg = "Exactly one of 'prompt' or 'messages' must be provided."
	case hasMessages && !f.messages.IsArray():
		msg = "messages: Input should be a valid list"
	case hasMessages:
		p.text = appendRenderChat(p.text[:0], f.messages.Raw, f.tools.Raw, f.addGenPrompt)
		p.prompts = appendEncode(p.prompts, b2s(p.text))
		p.endPrompt()
	case f.prompt.Type == gjson.String:
		p.prompts = appendEncode(p.prompts, f.prompt.Str)
		p.endPrompt()
	case f.prompt.IsArray():
		f.prompt.ForEach(func(_, e gjson.Result) bool {
			if e.Type != gjson.String {
				msg = "prompt: Input should be a valid string or a list of strings"
				return false
			}
			p.prompts = appendEncode(p.prompts, e.Str)
			p.endPrompt()
			return true
		})
	default:
		msg = "prompt: Input should be a valid string or a list of strings"
	}
	if msg != "" {
		s.writeError(ctx, fasthttp.StatusBadRequest, msg)
		return
	}
	list := f.prompt.IsArray()
	b := append(p.buf[:0], `{"tokens":`...)
	if list {
		b = append(b, '[')
		for i := 0; i < p.numPrompts(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendIDs(b, p.prompt(i))
		}
		b = append(b, `],"count":[`...)
		for i := 0; i < p.numPrompts(); i++ {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(len(p.prompt(i))), 10)
		}
		b = append(b, ']')
	} else {
		b = appendIDs(b, p.prompts)
		b = append(b, `,"count":`...)
		b = strconv.AppendInt(b, int64(len(p.prompts)), 10)
	}
	b = append(b, `,"max_model_len":`...)
	b = strconv.AppendInt(b, int64(s.cfg.MaxModelLen), 10)
	p.buf = append(b, '}')
	writeJSON(ctx, p.buf)
}
