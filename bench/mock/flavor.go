package mock

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"
)

// Flavor selects which engine's OpenAI-compatible server the mock imitates, following
// docs/engines.md. Text, token ids, usage and the knobs are the same in
// every flavour; only the wire shapes and the routes differ.
type Flavor string

// Flavours of the mock.
const (
	// FlavorVLLM is vLLM >= 0.10.2 (the default): return_token_ids gives top-level
	// prompt_token_ids (chat) and per-choice token_ids; /version, /tokenize, /detokenize,
	// /sleep and friends; /v1/models owned_by "vllm".
	FlavorVLLM Flavor = "vllm"
	// FlavorSGLang is SGLang: return_token_ids gives per-choice prompt_token_ids and
	// token_ids on chat and completions (streamed chat with it is a 400); flat errors
	// {"object":"error",...}; /tokenize answers {"tokens","count","max_model_len"},
	// /detokenize {"text"}; no /version; /v1/models owned_by "sglang".
	FlavorSGLang Flavor = "sglang"
	// FlavorLlamaCpp is the llama.cpp server: no token_ids anywhere (return_token_ids is
	// ignored); chat logprobs entries carry the token "id"; /tokenize {"content"} ->
	// {"tokens"}, /detokenize -> {"content"}, /apply-template -> {"prompt"}, GET /props;
	// errors {"error":{"code","message","type"}}; /v1/models owned_by "llamacpp".
	FlavorLlamaCpp Flavor = "llamacpp"
)

// Flavors lists the valid flavours, the default first.
var Flavors = []Flavor{FlavorVLLM, FlavorSGLang, FlavorLlamaCpp}

// ParseFlavor returns the flavour named s ("" means vllm), or an error naming the choices.
func ParseFlavor(s string) (Flavor, error) {
	if s == "" {
		return FlavorVLLM, nil
	}
	for _, f := range Flavors {
		if string(f) == s {
			return f, nil
		}
	}
	return "", fmt.Errorf("mock: unknown flavor %q: want vllm, sglang or llamacpp", s)
}

// llamaCppBuildInfo is the system_fingerprint of llama.cpp answers (its build number and commit).
const llamaCppBuildInfo = "b6000-0000000"

// sglangMatchedStop is the matched_stop of an SGLang choice that ended on EOS (<|im_end|>).
const sglangMatchedStop = TokenIMEnd

// vllmOnlyPath reports whether path is served by vLLM only.
func vllmOnlyPath(path string) bool {
	switch path {
	case PathVersion, PathSleep, PathWakeUp, PathIsSleeping, PathResetPrefixCache:
		return true
	}
	return false
}

// llamaCppOnlyPath reports whether path is served by llama.cpp only.
func llamaCppOnlyPath(path string) bool {
	return path == PathApplyTemplate || path == PathProps
}

// routed reports whether the flavour serves path at all.
func (s *Server) routed(path string) bool {
	switch s.cfg.Flavor {
	case FlavorSGLang:
		return !vllmOnlyPath(path) && !llamaCppOnlyPath(path)
	case FlavorLlamaCpp:
		return !vllmOnlyPath(path)
	}
	return !llamaCppOnlyPath(path)
}

// appendSGLangError appends SGLang's flat ErrorResponse.
func appendSGLangError(dst []byte, status int, msg string) []byte {
	dst = append(dst, `{"object":"error","message":`...)
	dst = appendJSONString(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, errorType(status))
	dst = append(dst, `,"param":null,"code":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	return append(dst, '}')
}

// llamaCppErrorType maps a status to llama.cpp's error type, e.g. 400 -> "invalid_request_error".
func llamaCppErrorType(status int) string {
	switch status {
	case 400:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 501:
		return "not_supported_error"
	case 503:
		return "unavailable_error"
	}
	return "server_error"
}

// appendLlamaCppError appends llama.cpp's error body.
func appendLlamaCppError(dst []byte, status int, msg string) []byte {
	dst = append(dst, `{"error":{"code":`...)
	dst = strconv.AppendInt(dst, int64(status), 10)
	dst = append(dst, `,"message":`...)
	dst = appendJSONString(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, llamaCppErrorType(status))
	return append(dst, "}}"...)
}

// appendFlavorUsage appends the usage object of the flavour.
func (p *plan) appendFlavorUsage(dst []byte) []byte {
	prompt, completion := p.promptTokens(), p.completionTokens()
	switch p.s.cfg.Flavor {
	case FlavorSGLang: // vLLM's three counts, then two more keys
		dst = appendUsage(dst, prompt, completion)
		return append(dst[:len(dst)-1], `,"prompt_tokens_details":null,"reasoning_tokens":0}`...)
	case FlavorLlamaCpp:
		dst = append(dst, `{"completion_tokens":`...)
		dst = strconv.AppendInt(dst, int64(completion), 10)
		dst = append(dst, `,"prompt_tokens":`...)
		dst = strconv.AppendInt(dst, int64(prompt), 10)
		dst = append(dst, `,"total_tokens":`...)
		dst = strconv.AppendInt(dst, int64(prompt+completion), 10)
		return append(dst, `,"prompt_tokens_details":{"cached_tokens":0}}`...)
	}
	return appendUsage(dst, prompt, completion)
}

// appendFlavorModels appends the /v1/models body of the flavour.
func (s *Server) appendFlavorModels(dst []byte) []byte {
	if s.cfg.Flavor == FlavorVLLM {
		return s.appendModels(dst)
	}
	dst = append(dst, `{"object":"list","data":[`...)
	for i, m := range append([]string{s.cfg.Model}, s.cfg.ExtraModels...) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = appendJSONString(dst, m)
		dst = append(dst, `,"object":"model","created":`...)
		dst = strconv.AppendInt(dst, s.cfg.Created, 10)
		if s.cfg.Flavor == FlavorSGLang {
			dst = append(dst, `,"owned_by":"sglang","root":`...)
			dst = appendJSONString(dst, m)
			dst = append(dst, `,"parent":null,"max_model_len":`...)
			dst = strconv.AppendInt(dst, int64(s.cfg.MaxModelLen), 10)
			dst = append(dst, '}')
			continue
		}
		dst = append(dst, `,"owned_by":"llamacpp","meta":{"vocab_type":2,"n_vocab":`...)
		dst = strconv.AppendInt(dst, int64(len(vocab)), 10)
		dst = append(dst, `,"n_ctx_train":`...)
		dst = strconv.AppendInt(dst, int64(s.cfg.MaxModelLen), 10)
		dst = append(dst, `,"n_embd":`...)
		dst = strconv.AppendInt(dst, int64(s.cfg.EmbeddingDim), 10)
		dst = append(dst, `,"n_params":0,"size":0}}`...)
	}
	return append(dst, "]}"...)
}

// writeHealth answers GET /health: an empty 200 (vLLM, SGLang) or {"status":"ok"} (llama.cpp).
func (s *Server) writeHealth(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	if s.cfg.Flavor == FlavorLlamaCpp {
		writeJSON(ctx, []byte(`{"status":"ok"}`))
	}
}

// flavorFlagHelp is the help of the -flavor flag.
var flavorFlagHelp = "engine to imitate: " + strings.Join([]string{string(FlavorVLLM), string(FlavorSGLang), string(FlavorLlamaCpp)}, ", ") +
	" (wire shapes and routes: docs/engines.md)"
