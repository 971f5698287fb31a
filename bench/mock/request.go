package mock

import (
	"math"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// fields are the request fields the mock understands, read in one pass over the body.
// Results reference the request body: use them only while handling the request.
type fields struct {
	model                                    string
	messages, tools, toolChoice, prompt      gjson.Result
	input, instructions, streamOptions       gjson.Result
	logprobs, tokens, encodingFormat         gjson.Result
	stop                                     gjson.Result
	content, parseSpecial, withPieces        gjson.Result // llama.cpp /tokenize
	kwargs                                   gjson.Result // chat_template_kwargs (real-template mode)
	n, maxTokens, maxCompletion, maxOutput   int
	topLogprobs                              int
	stream, returnIDs, asTokenIDs, tokenStrs bool
	addGenPrompt                             bool
	seed                                     int64
	seedSet, tempSet                         bool
	temperature                              float64
	err                                      string
}

const unset = -1

// parseFields reads body; on failure it returns a vLLM-style 400 message in f.err.
func parseFields(body []byte, f *fields) {
	*f = fields{n: 1, maxTokens: unset, maxCompletion: unset, maxOutput: unset, topLogprobs: unset, addGenPrompt: true}
	js := b2s(body)
	if jsonscan.Validate(body) != nil { // gjson.Valid recurses without a depth limit
		f.err = "JSON decode error: the request body is not valid JSON (or nested more than 512 levels deep)"
		return
	}
	root := gjson.Parse(js)
	if !root.IsObject() {
		f.err = "Input should be a valid dictionary or object to extract fields from"
		return
	}
	root.ForEach(func(key, v gjson.Result) bool {
		switch key.Str {
		case "model":
			if v.Type == gjson.String {
				f.model = v.Str
			} else if v.Type != gjson.Null {
				f.err = "model: Input should be a valid string"
			}
		case "messages":
			f.messages = v
		case "tools":
			f.tools = v
		case "tool_choice":
			f.toolChoice = v
		case "prompt":
			f.prompt = v
		case "input":
			f.input = v
		case "instructions":
			f.instructions = v
		case "stream_options":
			f.streamOptions = v
		case "logprobs":
			f.logprobs = v
		case "stop":
			f.stop = v
		case "tokens":
			f.tokens = v
		case "encoding_format":
			f.encodingFormat = v
		case "content":
			f.content = v
		case "parse_special":
			f.parseSpecial = v
		case "with_pieces":
			f.withPieces = v
		case "chat_template_kwargs":
			f.kwargs = v
		case "n":
			intField(v, "n", &f.n, &f.err)
		case "max_tokens":
			intField(v, "max_tokens", &f.maxTokens, &f.err)
		case "max_completion_tokens":
			intField(v, "max_completion_tokens", &f.maxCompletion, &f.err)
		case "max_output_tokens":
			intField(v, "max_output_tokens", &f.maxOutput, &f.err)
		case "top_logprobs":
			intField(v, "top_logprobs", &f.topLogprobs, &f.err)
		case "stream":
			boolField(v, "stream", &f.stream, &f.err)
		case "return_token_ids":
			boolField(v, "return_token_ids", &f.returnIDs, &f.err)
		case "return_tokens_as_token_ids":
			boolField(v, "return_tokens_as_token_ids", &f.asTokenIDs, &f.err)
		case "return_token_strs":
			boolField(v, "return_token_strs", &f.tokenStrs, &f.err)
		case "add_generation_prompt":
			f.addGenPrompt = true
			boolField(v, "add_generation_prompt", &f.addGenPrompt, &f.err)
		case "seed":
			if v.Type == gjson.Number && v.Num == math.Trunc(v.Num) {
				f.seed, f.seedSet = v.Int(), true
			} else if v.Type != gjson.Null {
				f.err = "seed: Input should be a valid integer"
			}
		case "temperature":
			if v.Type == gjson.Number {
				f.temperature, f.tempSet = v.Num, true
			} else if v.Type != gjson.Null {
				f.err = "temperature: Input should be a valid number"
			}
		}
		return f.err == ""
	})
}

func intField(v gjson.Result, name string, dst *int, errMsg *string) {
	switch {
	case v.Type == gjson.Null:
	case v.Type == gjson.Number && v.Num == math.Trunc(v.Num) && math.Abs(v.Num) < 1<<53:
		*dst = int(v.Num)
	default:
		*errMsg = name + ": Input should be a valid integer"
	}
}

func boolField(v gjson.Result, name string, dst *bool, errMsg *string) {
	switch v.Type {
	case gjson.Null:
	case gjson.True:
		*dst = true
	case gjson.False:
		*dst = false
	default:
		*errMsg = name + ": Input should be a valid boolean"
	}
}

// streamOptionsSet reports whether stream_options is truthy in Python's sense
// (vLLM rejects it on non-streaming requests only then).
func (f *fields) streamOptionsSet() bool {
	v := f.streamOptions
	switch v.Type {
	case gjson.Null:
		return false
	case gjson.False:
		return false
	case gjson.String:
		return v.Str != ""
	case gjson.Number:
		return v.Num != 0
	}
	if v.IsObject() || v.IsArray() {
		empty := true
		v.ForEach(func(_, _ gjson.Result) bool { empty = false; return false })
		return !empty
	}
	return v.Exists()
}

func (f *fields) includeUsage() bool {
	return f.streamOptions.IsObject() && f.streamOptions.Get("include_usage").Type == gjson.True
}

// continuousUsage reports whether stream_options asks for usage on every
// chunk: continuous_usage_stats counts only with include_usage
// (should_include_usage, vllm/entrypoints/serve/utils/api_utils.py, 0.32.0).
func (f *fields) continuousUsage() bool {
	return f.includeUsage() && f.streamOptions.Get("continuous_usage_stats").Type == gjson.True
}

// seedHash mixes the fields that change generated text into h.
func (f *fields) seedHash(h *hasher, cfgSeed uint64) {
	h.u64(cfgSeed)
	if f.seedSet {
		h.u64(1)
		h.u64(uint64(f.seed))
	} else {
		h.u64(0)
	}
	if f.tempSet {
		h.u64(1)
		h.u64(math.Float64bits(f.temperature))
	} else {
		h.u64(0)
	}
}

// limit returns the request's output-token limit (max_completion_tokens wins), or unset.
func (f *fields) limit() int {
	if f.maxCompletion != unset {
		return f.maxCompletion
	}
	return f.maxTokens
}

// tokenIDList appends the ids of a JSON array of token ids to dst; ok is false when v is
// not an array of integers in the vocabulary (below size).
func tokenIDList(dst []uint32, v gjson.Result, size int) ([]uint32, bool) {
	if !v.IsArray() {
		return dst, false
	}
	ok := true
	v.ForEach(func(_, t gjson.Result) bool {
		if t.Type != gjson.Number || t.Num != math.Trunc(t.Num) || t.Num < 0 || t.Num >= float64(size) {
			ok = false
			return false
		}
		dst = append(dst, uint32(t.Num))
		return true
	})
	return dst, ok
}
