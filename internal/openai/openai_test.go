package openai

import (
	"strings"
	"testing"
)

func TestParseKind(t *testing.T) {
	f := func(s string, want Kind) {
		t.Helper()
		k, err := ParseKind(s)
		if err != nil {
			t.Fatalf("ParseKind(%q): %v", s, err)
		}
		if k != want || k.String() != strings.ToLower(strings.TrimSpace(s)) {
			t.Fatalf("ParseKind(%q) = %v, want %v", s, k, want)
		}
	}
	f("vllm", KindVLLM)
	f("sglang", KindSGLang)
	f("openai", KindOpenAI)
	f("VLLM", KindVLLM)
	f("llamacpp", KindLlamaCpp)
	if k, err := ParseKind("llama.cpp"); err != nil || k != KindLlamaCpp {
		t.Fatalf("ParseKind(llama.cpp) = %v, %v", k, err)
	}
	if _, err := ParseKind("tgi"); err == nil || !strings.Contains(err.Error(), "llamacpp") {
		t.Fatalf("ParseKind(tgi) error = %v, want one naming the kinds", err)
	}
}

// TestEndpointOf holds the cases of the two EndpointOfs it replaces
// (gateway/rewrite's and capture's).
func TestEndpointOf(t *testing.T) {
	f := func(path string, want Endpoint) {
		t.Helper()
		if got := EndpointOf(path); got != want {
			t.Fatalf("EndpointOf(%q) = %v, want %v", path, got, want)
		}
	}
	f("/v1/chat/completions", ChatCompletions)
	f("/rollout/r/attempt/a/v1/chat/completions", ChatCompletions)
	f("/rollout/r1/attempt/a1/v1/chat/completions", ChatCompletions)
	f("/v1/chat/completions/", ChatCompletions)
	f("/v1/completions", Completions)
	f("/v1/completions?x=1", Completions)
	f("/completions", Completions)
	f("/v1/responses", Responses)
	f("/v1/embeddings", Embeddings)
	f("/v1/messages", Messages)
	f("/rollout/r1/attempt/a1/v1/messages?beta=true", Messages)
	f("/v1/models", Unknown)
	f("/v1/chatcompletions", Unknown)
	f("", Unknown)
	if ChatCompletions.String() != "/v1/chat/completions" || Unknown.String() != "" {
		t.Fatal("String")
	}
	for e := ChatCompletions; e <= Messages; e++ {
		if EndpointOf(e.String()) != e {
			t.Fatalf("round trip %v", e)
		}
	}
}

// TestEndpointValues pins the numbers of the endpoints: the capture WAL
// stores them.
func TestEndpointValues(t *testing.T) {
	if Unknown != 0 || ChatCompletions != 1 || Completions != 2 || Responses != 3 || Embeddings != 4 || Messages != 5 {
		t.Fatal("Endpoint values changed: the capture WAL stores them as numbers")
	}
}
