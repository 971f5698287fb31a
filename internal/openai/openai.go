// Package openai names the parts of the OpenAI-compatible surface that the
// gateway serves, the capture pipeline reads and the tokenizer fallback
// calls: the endpoints a request can target, and the kinds of inference
// engine behind a replica. It holds names only (no I/O, no JSON), so every
// package on the request path can share it: gateway, capture and tokenize
// import it; it imports nothing of rollgate's.
package openai

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
)

// Endpoint is the OpenAI-compatible route a request targets. It decides
// which fields the gateway may inject and how the capture pipeline reads the
// response.
//
// The values are written to the capture WAL as one byte: never reorder them,
// only append.
type Endpoint uint8

// Endpoints. Only ChatCompletions and Completions are ever rewritten.
const (
	// Unknown is any other route. The capture pipeline then guesses from
	// the "object" field of the response ("chat.completion[.chunk]",
	// "text_completion", "response").
	Unknown         Endpoint = iota
	ChatCompletions          // POST /v1/chat/completions
	Completions              // POST /v1/completions
	Responses                // POST /v1/responses
	Embeddings               // POST /v1/embeddings (usage only)
	// Messages is POST /v1/messages (Anthropic's Messages API). The gateway
	// translates it to a chat completion for the engine, so its rows hold
	// a chat exchange (ChatShaped); only the endpoint column says Messages.
	Messages
)

// String returns the canonical route ("/v1/chat/completions", ...), the value
// of the stored endpoint column; "" for Unknown (callers store the request's
// path instead).
func (e Endpoint) String() string {
	switch e {
	case ChatCompletions:
		return "/v1/chat/completions"
	case Completions:
		return "/v1/completions"
	case Responses:
		return "/v1/responses"
	case Embeddings:
		return "/v1/embeddings"
	case Messages:
		return "/v1/messages"
	}
	return ""
}

// ChatShaped reports whether a stored endpoint column names a call whose
// request and response bodies are a chat completion's (messages in, one
// message per choice out): "/v1/chat/completions" and "/v1/messages" (whose
// rows hold the chat exchange the gateway had with the engine).
func ChatShaped(endpoint string) bool {
	return strings.HasSuffix(endpoint, "/chat/completions") || strings.HasSuffix(endpoint, "/messages")
}

// EndpointOf maps a request path to its Endpoint by its suffix, so that any
// prefix works ("/v1/chat/completions",
// "/rollout/r1/attempt/a1/v1/chat/completions", "/chat/completions").
// Everything from the first '?' on (a query string) is ignored, then one
// trailing slash. A path naming no endpoint gives Unknown.
//
// The gateway's router matches its routes exactly instead; EndpointOf is for
// paths recorded elsewhere (tests, tools reading stored calls).
func EndpointOf(path string) Endpoint {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return ChatCompletions
	case strings.HasSuffix(path, "/completions"):
		return Completions
	case strings.HasSuffix(path, "/responses"):
		return Responses
	case strings.HasSuffix(path, "/embeddings"):
		return Embeddings
	case strings.HasSuffix(path, "/messages"):
		return Messages
	}
	return Unknown
}

// Kind is the kind of inference engine (or hosted API) a replica is. It
// decides which fields may be injected into requests and how missing token
// ids are obtained. The zero value is KindVLLM.
type Kind uint8

// Engine kinds (as configured or detected, see docs/engines.md).
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
// "openai" (case-insensitive, surrounding spaces ignored).
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
	extra := extraKinds.Load()
	if extra != nil {
		for i, name := range *extra {
			if strings.EqualFold(strings.TrimSpace(s), name) {
				return firstExtraKind + Kind(i), nil
			}
		}
	}
	want := "vllm, sglang, llamacpp, openai"
	if extra != nil {
		want += ", " + strings.Join(*extra, ", ")
	}
	return 0, fmt.Errorf("unknown backend kind %q: want one of %s", s, want)
}

// firstExtraKind is the Kind of the first kind added by RegisterKind.
const firstExtraKind Kind = 16

// extraKinds are the names of the kinds added by RegisterKind, in order.
var (
	extraKinds   atomic.Pointer[[]string]
	extraKindsMu sync.Mutex
)

// RegisterKind adds an engine kind named name (lower case, as users write
// it) beside the built-in ones and returns its Kind; ParseKind accepts the
// name from then on and String prints it. Registering a name again returns
// the same Kind. It panics when name is empty, names a built-in kind, or
// more than 239 kinds are added. Engine packages call it from init (see
// package engines).
func RegisterKind(name string) Kind {
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" {
		panic("openai: RegisterKind with an empty name")
	}
	extraKindsMu.Lock()
	defer extraKindsMu.Unlock()
	if k, err := ParseKind(name); err == nil {
		if k < firstExtraKind {
			panic("openai: RegisterKind(" + name + "): a built-in kind")
		}
		return k
	}
	var names []string
	if p := extraKinds.Load(); p != nil {
		names = append(names, *p...)
	}
	if len(names) >= 256-int(firstExtraKind) {
		panic("openai: RegisterKind: too many engine kinds")
	}
	names = append(names, name)
	extraKinds.Store(&names)
	return firstExtraKind + Kind(len(names)-1)
}

// String returns the name ParseKind accepts ("vllm", ...).
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
	if p := extraKinds.Load(); p != nil && k >= firstExtraKind && int(k-firstExtraKind) < len(*p) {
		return (*p)[k-firstExtraKind]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}
