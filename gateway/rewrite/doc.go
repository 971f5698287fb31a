// Package rewrite edits OpenAI-compatible request bodies on their way to an
// inference engine (injecting the fields that make the engine return exact
// token ids, logprobs and usage) and strips those injected fields from the
// engine's responses, so that the agent receives byte for byte what the engine
// would have sent for its original request.
//
// Everything here works on raw bytes: a single scan of the body, edits spliced
// into a caller-provided buffer, no allocations on the hot path.
package rewrite

import (
	"fmt"
	"strings"
)

// Kind is the kind of upstream a request is sent to. It decides which fields
// may be injected.
type Kind uint8

// Upstream kinds.
const (
	// KindVLLM is a vLLM OpenAI-compatible server (>= 0.10.2 returns token ids).
	KindVLLM Kind = iota
	// KindSGLang is an SGLang OpenAI-compatible server (per-choice token ids).
	KindSGLang
	// KindOpenAI is api.openai.com or any other hosted API: it rejects unknown
	// fields, so nothing is ever injected.
	KindOpenAI
	// KindLlamaCpp is llama.cpp's server: it never returns token ids, but
	// each chat logprobs entry carries the sampled token's "id", so chat
	// calls are asked for logprobs (removed again from the client's copy).
	// Its responses leave out the keys of fields not asked for.
	KindLlamaCpp
)

// ParseKind parses "vllm", "sglang", "llamacpp" (or "llama.cpp") or
// "openai" (case-insensitive).
func ParseKind(s string) (Kind, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "vllm":
		return KindVLLM, nil
	case "sglang":
		return KindSGLang, nil
	case "openai":
		return KindOpenAI, nil
	case "llamacpp", "llama.cpp":
		return KindLlamaCpp, nil
	}
	return 0, fmt.Errorf("unknown backend kind %q: want one of vllm, sglang, llamacpp, openai", s)
}

// String returns the name ParseKind accepts.
func (k Kind) String() string {
	switch k {
	case KindVLLM:
		return "vllm"
	case KindSGLang:
		return "sglang"
	case KindOpenAI:
		return "openai"
	case KindLlamaCpp:
		return "llamacpp"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Endpoint is the OpenAI route a request targets.
type Endpoint uint8

// Endpoints. Only Chat and Completions are ever rewritten.
const (
	Other Endpoint = iota
	Chat
	Completions
	Responses
	Embeddings
)

// String returns the route of the endpoint under /v1 ("/v1/chat/completions"),
// or "other".
func (e Endpoint) String() string {
	switch e {
	case Chat:
		return "/v1/chat/completions"
	case Completions:
		return "/v1/completions"
	case Responses:
		return "/v1/responses"
	case Embeddings:
		return "/v1/embeddings"
	}
	return "other"
}

// EndpointOf maps a request path to its Endpoint by suffix, so prefixed forms
// such as /rollout/r1/attempt/a1/v1/chat/completions are recognised too.
func EndpointOf(path string) Endpoint {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return Chat
	case strings.HasSuffix(path, "/completions"):
		return Completions
	case strings.HasSuffix(path, "/responses"):
		return Responses
	case strings.HasSuffix(path, "/embeddings"):
		return Embeddings
	}
	return Other
}
