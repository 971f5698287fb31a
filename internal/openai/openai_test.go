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

// TestRegisterKind: a kind added by an engine package parses and prints by
// its name, registering it again gives the same kind, and the built-in
// kinds keep their values and names.
func TestRegisterKind(t *testing.T) {
	k := RegisterKind("Test-Engine")
	if k < firstExtraKind || k.String() != "test-engine" {
		t.Fatalf("RegisterKind = %d %q", k, k)
	}
	if again := RegisterKind("test-engine"); again != k {
		t.Fatalf("registered again: %d, want %d", again, k)
	}
	if got, err := ParseKind(" TEST-ENGINE "); err != nil || got != k {
		t.Fatalf("ParseKind = %v, %v", got, err)
	}
	if _, err := ParseKind("nope"); err == nil || !strings.Contains(err.Error(), "vllm, sglang, llamacpp, openai, test-engine") {
		t.Fatalf("unknown kind: %v", err)
	}
	for s, want := range map[string]Kind{"vllm": KindVLLM, "sglang": KindSGLang, "openai": KindOpenAI, "llama.cpp": KindLlamaCpp} {
		if got, err := ParseKind(s); err != nil || got != want {
			t.Fatalf("ParseKind(%q) = %v, %v", s, got, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("registering a built-in kind's name did not panic")
		}
	}()
	RegisterKind("vllm")
}
