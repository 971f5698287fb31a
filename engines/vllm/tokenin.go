package vllm

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/export/arrays"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

// vLLM 0.32's token-in endpoints (registered with --enable-scale-out;
// vllm/entrypoints/scale_out/factories.py):
//   - render: vllm/entrypoints/scale_out/render/api_router.py, a
//     ChatCompletionRequest in, a GenerateRequest out (token_ids and the
//     resolved sampling_params, structured output for tool choices
//     included; token_in_token_out/protocol.py);
//   - generate: token_in_token_out/api_router.py, that GenerateRequest in,
//     a GenerateTokensResponse out (choices[].token_ids with the
//     end-of-turn token, finish_reason, stop_reason, logprobs by token id);
//   - derender: derender/api_router.py, a DerenderChatRequest
//     (generate_response, prompt_token_ids, chat_request) in, a
//     ChatCompletionResponse out, built by vLLM's own tool and reasoning
//     parsers (renderers/online_derenderer.py).
//   - abort: POST /inference/v1/abort_requests {"request_ids":[id]}
//     (token_in_token_out/api_router.py).
//
// Render and derender are under the OpenAI base URL, generate and abort at
// the origin.
var tokenInPaths = engines.TokenInPaths{
	Render:   "/chat/completions/render",
	Derender: "/chat/completions/derender",
	Generate: "/inference/v1/generate",
	Abort:    "/inference/v1/abort_requests",
}

// TokenInPaths are vLLM's render, derender, generate and abort_requests.
func (Engine) TokenInPaths() engines.TokenInPaths { return tokenInPaths }

// AbortBody is {"request_ids":[id]}.
func (Engine) AbortBody(id string) []byte {
	b, _ := json.Marshal(id) // a string always encodes
	return append(append([]byte(`{"request_ids":[`), b...), "]}"...)
}

// Streamed, vLLM 0.32.0:
//   - generate streams (token_in_token_out/serving.py,
//     serve_tokens_stream_generator): one SSE event per engine step with
//     choices[0].token_ids (the step's new ids; the end-of-turn token rides
//     on the finish chunk), logprobs by token id, finish_reason and
//     stop_reason on the last; a usage chunk with no choices when
//     stream_options.include_usage; an error event on a generation error;
//     then data: [DONE].
//   - derender streams through stream_state (derender/api_router.py,
//     derender/serving.py derender_chat_stream_response,
//     renderers/online_derenderer.py derender_chat_stream): one POST per
//     generate chunk, {stream: true, generate_chunk, stream_state,
//     prompt_tokens, prompt_token_ids, chat_request} in, {chunk,
//     stream_state} out, the chunk a ChatCompletionStreamResponse built by
//     vLLM's own tool and reasoning parsers. With a parser configured the
//     state carries every output id so far and vLLM replays them through a
//     fresh parser on each call (quadratic in the output length), and the
//     chunk has no logprobs (_derender_chat_stream_parsed).

// errTokenIn marks an answer of vLLM's token-in endpoints that cannot be
// used.
var errTokenIn = errors.New("token-in")

// requestIDPrefix is vLLM's prefix of a generate request's external id
// (serving.py serve_tokens: "generate-tokens-" + the GenerateRequest's
// request_id; the gateway never forwards X-Request-Id).
const requestIDPrefix = "generate-tokens-"

// EngineRequestID is "generate-tokens-" + id.
func (Engine) EngineRequestID(id string) string { return requestIDPrefix + id }

// RenderAnswer reads render's GenerateRequest: its token_ids, with the
// chat request's output limit kept (keepMaxTokens).
func (Engine) RenderAnswer(answer, chatReq []byte) ([]byte, []uint32, error) {
	ids, err := fallback.IDList(gjson.GetBytes(answer, "token_ids"), "token_ids")
	if err != nil || len(ids) == 0 {
		return nil, nil, fmt.Errorf("%w: render answered no token_ids", errTokenIn)
	}
	out, err := keepMaxTokens(answer, chatReq)
	if err != nil {
		return nil, nil, err
	}
	return out, ids, nil
}

// keepMaxTokens puts the chat request's output limit (max_completion_tokens,
// else max_tokens) into a render answer whose sampling_params left it out.
// vLLM 0.32 serialises SamplingParams with msgspec's omit_defaults
// (vllm/sampling_params.py), so a client's max_tokens of 16, the default,
// vanishes from render's answer, and generate then lets the answer run to
// the context's end (token_in_token_out/serving.py applies its server-side
// default to a max_tokens not provided).
func keepMaxTokens(rendered, chatReq []byte) ([]byte, error) {
	if gjson.GetBytes(rendered, "sampling_params.max_tokens").Exists() {
		return rendered, nil
	}
	limit := gjson.GetBytes(chatReq, "max_completion_tokens")
	if limit.Type != gjson.Number {
		limit = gjson.GetBytes(chatReq, "max_tokens")
	}
	if limit.Type != gjson.Number {
		return rendered, nil
	}
	out, err := sjson.SetRawBytes(rendered, "sampling_params.max_tokens", []byte(limit.Raw))
	if err != nil {
		return nil, fmt.Errorf("%w: setting the request's max_tokens on render's answer: %w", errTokenIn, err)
	}
	return out, nil
}

// GenerateBody sets token_ids, and stream, stream_options and request_id
// as o says.
func (Engine) GenerateBody(genReq []byte, prompt []uint32, o engines.GenerateOptions) ([]byte, error) {
	body, err := sjson.SetRawBytes(genReq, "token_ids", arrays.AppendUint32s(make([]byte, 0, 8*len(prompt)), prompt))
	if err == nil && o.Stream {
		body, err = sjson.SetBytes(body, "stream", true)
		if err == nil && o.StreamOptions != nil {
			body, err = sjson.SetRawBytes(body, "stream_options", o.StreamOptions)
		}
	}
	if err == nil && o.RequestID != "" {
		body, err = sjson.SetBytes(body, "request_id", o.RequestID)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: building the generate request: %w", errTokenIn, err)
	}
	return body, nil
}

// ResumeBody sets token_ids to prompt + ids, request_id, and reduces
// sampling_params.max_tokens.
func (Engine) ResumeBody(genBody []byte, prompt, ids []uint32, requestID string) (body []byte, left int, err error) {
	all := arrays.AppendUint32s(make([]byte, 0, 8*(len(prompt)+len(ids))), append(append(make([]uint32, 0, len(prompt)+len(ids)), prompt...), ids...))
	if body, err = sjson.SetRawBytes(genBody, "token_ids", all); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errTokenIn, err)
	}
	left = -1
	if mt := gjson.GetBytes(genBody, "sampling_params.max_tokens"); mt.Type == gjson.Number {
		left = max(int(mt.Int())-len(ids), 0)
		if left == 0 {
			return body, 0, nil
		}
		if body, err = sjson.SetBytes(body, "sampling_params.max_tokens", left); err != nil {
			return nil, 0, fmt.Errorf("%w: %w", errTokenIn, err)
		}
	}
	if body, err = sjson.SetBytes(body, "request_id", requestID); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", errTokenIn, err)
	}
	return body, left, nil
}

// ParseGenerate reads a GenerateTokensResponse.
func (Engine) ParseGenerate(answer []byte) (engines.Generated, error) {
	root := gjson.ParseBytes(answer)
	choices := root.Get("choices").Array()
	g := engines.Generated{
		RequestID: root.Get("request_id").String(), Usage: root.Get("usage"),
		Choices: make([]engines.GenChoice, len(choices)),
	}
	for i, ch := range choices {
		c, err := choice(ch)
		if err != nil {
			return g, err
		}
		g.Choices[i] = c
	}
	return g, nil
}

// ParseGenerateChunk reads one event of a streamed generate answer.
func (Engine) ParseGenerateChunk(data []byte) (engines.GenChunk, error) {
	root := gjson.ParseBytes(data)
	if !root.IsObject() || !gjson.ValidBytes(data) {
		return engines.GenChunk{}, fmt.Errorf("%w: a generate stream event is not a JSON object", errTokenIn)
	}
	if root.Get("error").Exists() {
		return engines.GenChunk{Error: true}, nil
	}
	g := engines.GenChunk{RequestID: root.Get("request_id").String(), Usage: root.Get("usage")}
	choices := root.Get("choices").Array()
	switch {
	case len(choices) == 0:
		return g, nil
	case len(choices) > 1:
		return g, fmt.Errorf("%w: a generate stream chunk with %d choices (n > 1 streams one per chunk)", errTokenIn, len(choices))
	}
	c, err := choice(choices[0])
	if err != nil {
		return g, fmt.Errorf("%w: a generate stream chunk without token_ids", errTokenIn)
	}
	g.HasChoice, g.Choice = true, c
	return g, nil
}

// choice reads one generate choice; an index that is no number is -1.
func choice(ch gjson.Result) (engines.GenChoice, error) {
	idx := -1
	if i := ch.Get("index"); i.Type == gjson.Number && i.Num >= 0 && i.Num == float64(int(i.Num)) {
		idx = int(i.Num)
	}
	ids, err := fallback.IDList(ch.Get("token_ids"), "token_ids")
	if err != nil {
		return engines.GenChoice{}, fmt.Errorf("%w: %w", errTokenIn, err)
	}
	stop := ch.Get("stop_reason")
	finish := ch.Get("finish_reason").Str
	return engines.GenChoice{
		Index: idx, IDs: ids, Finish: finish, StopReason: stop,
		Logprobs: ch.Get("logprobs.content"),
		// Finish reason stop with no stop string: stop_reason null for
		// the end-of-sequence token, the id of a stop token.
		EndedOnTurn: finish == "stop" && (stop.Type == gjson.Null || stop.Type == gjson.Number),
	}, nil
}

// JoinGenerate sets choices.0's token_ids and logprobs.content, the usage
// and the finish reason (clearing stop_reason).
func (Engine) JoinGenerate(answer []byte, ids []uint32, lps, usage []byte, finish string) ([]byte, error) {
	ch := gjson.GetBytes(answer, "choices.0")
	own, _ := fallback.IDList(ch.Get("token_ids"), "token_ids")
	all := arrays.AppendUint32s(nil, append(append(make([]uint32, 0, len(ids)+len(own)), ids...), own...))
	out, err := sjson.SetRawBytes(answer, "choices.0.token_ids", all)
	if err == nil && ch.Get("logprobs.content").IsArray() {
		entries := append([]byte(nil), lps...)
		for _, e := range ch.Get("logprobs.content").Array() {
			if len(entries) > 0 {
				entries = append(entries, ',')
			}
			entries = append(entries, e.Raw...)
		}
		out, err = sjson.SetRawBytes(out, "choices.0.logprobs.content", append(append([]byte{'['}, entries...), ']'))
	}
	if err == nil && usage != nil {
		out, err = sjson.SetRawBytes(out, "usage", usage)
	}
	if err == nil && finish != "" {
		if out, err = sjson.SetBytes(out, "choices.0.finish_reason", finish); err == nil {
			out, err = sjson.SetBytes(out, "choices.0.stop_reason", nil)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: joining the resumed answer: %w", errTokenIn, err)
	}
	return out, nil
}

// LengthChunk is a GenerateTokensResponse chunk finishing choice 0 by
// length.
func (Engine) LengthChunk() []byte {
	return []byte(`{"request_id":"","choices":[{"index":0,"token_ids":[],"finish_reason":"length","stop_reason":null,"logprobs":null}]}`)
}

// DerenderBody is a DerenderChatRequest: generate_response (without a
// final stop token: vLLM 0.32's derender decodes every id, and with a tool
// parser keeps special tokens, so the end-of-turn token's text would end
// the content; the ordinary path's text never has it), prompt_tokens,
// prompt_token_ids and chat_request.
func (Engine) DerenderBody(answer []byte, prompt []uint32, chatReq []byte) ([]byte, error) {
	trimmed := answer
	for i, ch := range gjson.GetBytes(answer, "choices").Array() {
		stop := ch.Get("stop_reason")
		ids := ch.Get("token_ids").Array()
		if ch.Get("finish_reason").Str != "stop" || !(stop.Type == gjson.Null || stop.Type == gjson.Number) || len(ids) < 2 {
			continue
		}
		// A stop token id is the stop_reason (vLLM's v1 engine); the
		// end-of-sequence token gives null. Only a last id that is the
		// stop token is left out.
		if stop.Type == gjson.Number && ids[len(ids)-1].Uint() != stop.Uint() {
			continue
		}
		var err error
		if trimmed, err = sjson.DeleteBytes(trimmed, "choices."+strconv.Itoa(i)+".token_ids."+strconv.Itoa(len(ids)-1)); err != nil {
			return nil, fmt.Errorf("%w: %w", errTokenIn, err)
		}
	}
	buf := make([]byte, 0, len(answer)+len(chatReq)+8*len(prompt)+128)
	buf = append(buf, `{"generate_response":`...)
	buf = append(buf, trimmed...)
	buf = append(buf, `,"prompt_tokens":`...)
	buf = strconv.AppendInt(buf, int64(len(prompt)), 10)
	buf = append(buf, `,"prompt_token_ids":`...)
	buf = arrays.AppendUint32s(buf, prompt)
	buf = append(buf, `,"chat_request":`...)
	buf = append(buf, chatReq...)
	return append(buf, '}'), nil
}

// DerenderAnswer sets on derender's ChatCompletionResponse what it leaves
// out or differs in: prompt_token_ids (derender leaves it null), the
// choices' token_ids and the usage (the generate answer's), and, as vLLM's
// chat serving does (vllm/entrypoints/openai/chat_completion/serving.py:
// "tool_calls" for auto or required tool calls, "stop" for named ones),
// the finish reason of a choice with tool calls.
func (Engine) DerenderAnswer(der, answer []byte, prompt []uint32, chatReq []byte) ([]byte, error) {
	if !gjson.ValidBytes(der) {
		return nil, fmt.Errorf("%w: derender answered no JSON: %.300s", errTokenIn, der)
	}
	out, err := sjson.SetRawBytes(der, "prompt_token_ids", arrays.AppendUint32s(make([]byte, 0, 8*len(prompt)), prompt))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errTokenIn, err)
	}
	if u := gjson.GetBytes(answer, "usage"); u.IsObject() {
		if out, err = sjson.SetRawBytes(out, "usage", []byte(u.Raw)); err != nil {
			return nil, fmt.Errorf("%w: %w", errTokenIn, err)
		}
	}
	for i, ch := range gjson.GetBytes(answer, "choices").Array() {
		if out, err = sjson.SetRawBytes(out, "choices."+strconv.Itoa(i)+".token_ids", []byte(ch.Get("token_ids").Raw)); err != nil {
			return nil, fmt.Errorf("%w: %w", errTokenIn, err)
		}
	}
	named := gjson.GetBytes(chatReq, "tool_choice").IsObject()
	for i, ch := range gjson.GetBytes(out, "choices").Array() {
		if !named && ch.Get("finish_reason").Str == "stop" && len(ch.Get("message.tool_calls").Array()) > 0 {
			if out, err = sjson.SetBytes(out, "choices."+strconv.Itoa(i)+".finish_reason", "tool_calls"); err != nil {
				return nil, fmt.Errorf("%w: %w", errTokenIn, err)
			}
		}
	}
	return out, nil
}

// DerenderStreamTail is the end of every streaming derender request: the
// model (the chunks name it as the chat path does: derender takes the
// request's model, else the served name), the prompt (its ids settle the
// parsers' initial reasoning state) and the chat request.
func (Engine) DerenderStreamTail(prompt []uint32, chatReq []byte) []byte {
	t := make([]byte, 0, 8*len(prompt)+len(chatReq)+64)
	if m := gjson.GetBytes(chatReq, "model"); m.Type == gjson.String {
		b, _ := json.Marshal(m.Str) // a string always encodes
		t = append(append(t, `,"model":`...), b...)
	}
	t = append(t, `,"prompt_tokens":`...)
	t = strconv.AppendInt(t, int64(len(prompt)), 10)
	t = append(t, `,"prompt_token_ids":`...)
	t = arrays.AppendUint32s(t, prompt)
	t = append(t, `,"chat_request":`...)
	t = append(t, chatReq...)
	return append(t, '}')
}

// DerenderStreamBody is {"stream":true,"generate_chunk",
// "stream_state",...tail}. A parked chunk goes with finish_reason null; a
// finish chunk's end-of-turn token is left out, as for whole answers
// (DerenderBody).
func (Engine) DerenderStreamBody(dst, chunk []byte, ch engines.GenChoice, parked bool, state, tail []byte) ([]byte, error) {
	var err error
	if parked {
		if chunk, err = sjson.SetBytes(chunk, "choices.0.finish_reason", nil); err != nil {
			return nil, fmt.Errorf("%w: %w", errTokenIn, err)
		}
	} else if ch.Finish != "" && ch.EndedOnTurn && len(ch.IDs) > 0 {
		if ch.StopReason.Type == gjson.Null || ch.StopReason.Uint() == uint64(ch.IDs[len(ch.IDs)-1]) {
			if chunk, err = sjson.SetRawBytes(chunk, "choices.0.token_ids", arrays.AppendUint32s(nil, ch.IDs[:len(ch.IDs)-1])); err != nil {
				return nil, fmt.Errorf("%w: %w", errTokenIn, err)
			}
		}
	}
	dst = append(dst, `{"stream":true,"generate_chunk":`...)
	dst = append(dst, chunk...)
	dst = append(dst, `,"stream_state":`...)
	if state == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, state...)
	}
	return append(dst, tail...), nil
}

// DerenderStreamAnswer reads {chunk, stream_state}.
func (Engine) DerenderStreamAnswer(out []byte) (chunk, state gjson.Result, err error) {
	der := gjson.ParseBytes(out)
	chunk, state = der.Get("chunk"), der.Get("stream_state")
	if !gjson.ValidBytes(out) || !chunk.IsObject() || !state.IsObject() {
		return gjson.Result{}, gjson.Result{}, fmt.Errorf("%w: derender answered no chunk and stream_state: %.300s", errTokenIn, out)
	}
	return chunk, state, nil
}
