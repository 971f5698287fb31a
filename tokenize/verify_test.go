package tokenize

import (
	"slices"
	"testing"

	"github.com/rollgate/rollgate/export"
)

func ids(n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(i + 100)
	}
	return s
}

// out is a choice with n generated ids and no logprobs.
func out(n int) Choice { return Choice{TokenIDs: ids(n), HasTokenIDs: true, Logprobs: -1} }

func TestVerify(t *testing.T) {
	const chat, cmpl = "/v1/chat/completions", "/v1/completions"
	f := func(name string, c Call, source, check string) {
		t.Helper()
		v := Verify(&c)
		if v.Source != source || v.Check() != check {
			t.Fatalf("%s: Verify = {%s %q}, want {%s %q}", name, v.Source, v.Check(), source, check)
		}
		if v.OK() != (source == export.TokenSourceEngine) {
			t.Fatalf("%s: OK() = %v", name, v.OK())
		}
		if (check == "") != (v.Failed == nil) {
			t.Fatalf("%s: Failed = %#v", name, v.Failed)
		}
	}
	withPrompt := func(ch Choice, n int) Choice { ch.PromptTokenIDs = ids(n); return ch }
	withLP := func(ch Choice, n int) Choice { ch.Logprobs = n; return ch }

	// No ids at all (OpenAI, old vLLM): none, whatever the usage.
	f("no ids", Call{Endpoint: chat, Choices: []Choice{{Logprobs: -1}}, PromptTokens: 5, CompletionTokens: 2, HasUsage: true},
		export.TokenSourceNone, "")
	f("no ids no usage", Call{Endpoint: chat, Choices: []Choice{{Logprobs: 3}}}, export.TokenSourceNone, "")
	f("no choices", Call{Endpoint: chat}, export.TokenSourceNone, "")

	// vLLM chat: top-level prompt ids.
	f("chat ok", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{out(2)}, PromptTokens: 5, CompletionTokens: 2, HasUsage: true},
		export.TokenSourceEngine, "")
	f("chat zero tokens generated", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{out(0)}, PromptTokens: 5, HasUsage: true},
		export.TokenSourceEngine, "")
	f("chat n=2 ok", Call{Endpoint: chat, N: 2, PromptTokenIDs: ids(5), Choices: []Choice{out(2), out(3)}, PromptTokens: 5, CompletionTokens: 5, HasUsage: true},
		export.TokenSourceEngine, "")
	f("chat prompt count", Call{Endpoint: chat, PromptTokenIDs: ids(4), Choices: []Choice{out(2)}, PromptTokens: 5, CompletionTokens: 2, HasUsage: true},
		SourceMismatch, "prompt_count")
	f("chat completion count (dropped chunk)", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{out(2), out(2)}, N: 2, PromptTokens: 5, CompletionTokens: 5, HasUsage: true},
		SourceMismatch, "completion_count")
	f("chat both counts", Call{Endpoint: chat, PromptTokenIDs: ids(6), Choices: []Choice{out(1)}, PromptTokens: 5, CompletionTokens: 2, HasUsage: true},
		SourceMismatch, "prompt_count,completion_count")
	f("chat prompt missing", Call{Endpoint: chat, Choices: []Choice{out(2)}, PromptTokens: 5, CompletionTokens: 2, HasUsage: true},
		SourceMismatch, "prompt_missing")
	f("chat completion missing", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{{Logprobs: -1}}, PromptTokens: 5, CompletionTokens: 2, HasUsage: true},
		SourceMismatch, "completion_missing")
	f("chat one of two choices missing ids", Call{Endpoint: chat, N: 2, PromptTokenIDs: ids(5), Choices: []Choice{out(2), {Logprobs: -1}}, PromptTokens: 5, CompletionTokens: 4, HasUsage: true},
		SourceMismatch, "completion_missing")
	f("chat no choices", Call{Endpoint: chat, PromptTokenIDs: ids(5), PromptTokens: 5, HasUsage: true},
		SourceMismatch, "completion_missing")
	f("chat usage missing", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{out(2)}},
		SourceMismatch, "usage_missing")
	f("chat usage missing and prompt missing", Call{Endpoint: chat, Choices: []Choice{out(2)}},
		SourceMismatch, "prompt_missing,usage_missing")

	// SGLang chat: per-choice prompt ids, the same prompt for every choice.
	f("sglang chat n=3 ok", Call{Endpoint: chat, N: 3, Choices: []Choice{withPrompt(out(1), 7), withPrompt(out(2), 7), withPrompt(out(3), 7)},
		PromptTokens: 7, CompletionTokens: 6, HasUsage: true}, export.TokenSourceEngine, "")
	f("sglang chat n unknown ok", Call{Endpoint: chat, Choices: []Choice{withPrompt(out(1), 7), withPrompt(out(2), 7)},
		PromptTokens: 7, CompletionTokens: 3, HasUsage: true}, export.TokenSourceEngine, "")
	f("sglang chat prompt count", Call{Endpoint: chat, Choices: []Choice{withPrompt(out(1), 6)}, PromptTokens: 7, CompletionTokens: 1, HasUsage: true},
		SourceMismatch, "prompt_count")
	f("sglang chat prompt on a later choice only", Call{Endpoint: chat, Choices: []Choice{out(1), withPrompt(out(1), 7)}, PromptTokens: 7, CompletionTokens: 2, HasUsage: true},
		SourceMismatch, "prompt_missing")

	// Completions: per-choice prompt ids; several prompts count once each.
	f("cmpl ok", Call{Endpoint: cmpl, Choices: []Choice{withPrompt(out(4), 3)}, PromptTokens: 3, CompletionTokens: 4, HasUsage: true},
		export.TokenSourceEngine, "")
	f("cmpl 2 prompts n=2 ok", Call{Endpoint: cmpl, N: 2, Choices: []Choice{
		withPrompt(out(1), 3), withPrompt(out(2), 3), withPrompt(out(3), 5), withPrompt(out(4), 5)},
		PromptTokens: 8, CompletionTokens: 10, HasUsage: true}, export.TokenSourceEngine, "")
	f("cmpl 2 prompts n=1 ok", Call{Endpoint: cmpl, Choices: []Choice{withPrompt(out(1), 3), withPrompt(out(2), 5)},
		PromptTokens: 8, CompletionTokens: 3, HasUsage: true}, export.TokenSourceEngine, "")
	f("cmpl 2 prompts n wrongly 1", Call{Endpoint: cmpl, N: 1, Choices: []Choice{
		withPrompt(out(1), 3), withPrompt(out(2), 3), withPrompt(out(3), 5), withPrompt(out(4), 5)},
		PromptTokens: 8, CompletionTokens: 10, HasUsage: true}, SourceMismatch, "prompt_count")
	f("cmpl prompt missing on second prompt", Call{Endpoint: cmpl, N: 2, Choices: []Choice{
		withPrompt(out(1), 3), withPrompt(out(2), 3), out(3), withPrompt(out(4), 5)},
		PromptTokens: 8, CompletionTokens: 10, HasUsage: true}, SourceMismatch, "prompt_missing")
	f("cmpl prompt ids only", Call{Endpoint: cmpl, Choices: []Choice{{PromptTokenIDs: ids(3), Logprobs: -1}}, PromptTokens: 3, CompletionTokens: 1, HasUsage: true},
		SourceMismatch, "completion_missing")
	f("cmpl completion count", Call{Endpoint: cmpl, Choices: []Choice{withPrompt(out(4), 3)}, PromptTokens: 3, CompletionTokens: 5, HasUsage: true},
		SourceMismatch, "completion_count")

	// Logprobs: as many as ids per choice.
	f("logprobs ok", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{withLP(out(3), 3), withLP(out(0), 0)}, PromptTokens: 5, CompletionTokens: 3, HasUsage: true},
		export.TokenSourceEngine, "")
	f("logprobs count", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{withLP(out(3), 2)}, PromptTokens: 5, CompletionTokens: 3, HasUsage: true},
		SourceMismatch, "logprobs_count")
	f("logprobs count without usage", Call{Endpoint: chat, PromptTokenIDs: ids(5), Choices: []Choice{withLP(out(3), 4)}},
		SourceMismatch, "logprobs_count,usage_missing")
	f("every check", Call{Endpoint: cmpl, N: 1, Choices: []Choice{withLP(out(3), 1), {Logprobs: -1}}},
		SourceMismatch, "prompt_missing,completion_missing,logprobs_count,usage_missing")
}

// FuzzVerify builds calls from arbitrary bytes: Verify never panics and its
// verdict is consistent.
func FuzzVerify(f *testing.F) {
	f.Add([]byte{5, 1, 2, 3, 4, 5, 6, 7, 8, 9}, "/v1/chat/completions", 2, true, uint32(5), uint32(3))
	f.Add([]byte{0, 200, 1, 0, 0}, "/v1/completions", 0, false, uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, spec []byte, endpoint string, n int, hasUsage bool, pt, ct uint32) {
		c := Call{Endpoint: endpoint, N: n, HasUsage: hasUsage, PromptTokens: pt, CompletionTokens: ct}
		take := func() int {
			if len(spec) == 0 {
				return 0
			}
			v := int(spec[0])
			spec = spec[1:]
			return v
		}
		if p := take(); p > 0 {
			c.PromptTokenIDs = ids(p % 16)
		}
		for len(spec) >= 4 && len(c.Choices) < 64 {
			flags := take()
			ch := Choice{Logprobs: -1, HasTokenIDs: flags&1 != 0}
			if l := take(); ch.HasTokenIDs {
				ch.TokenIDs = ids(l % 16)
			}
			if p := take(); flags&2 != 0 {
				ch.PromptTokenIDs = ids(p % 16)
			}
			if l := take(); flags&4 != 0 {
				ch.Logprobs = l % 16
			}
			c.Choices = append(c.Choices, ch)
		}
		v := Verify(&c)
		switch v.Source {
		case export.TokenSourceNone, export.TokenSourceEngine:
			if v.Failed != nil {
				t.Fatalf("source %s with failures %v", v.Source, v.Failed)
			}
		case SourceMismatch:
			if len(v.Failed) == 0 {
				t.Fatal("mismatch without failures")
			}
		default:
			t.Fatalf("unknown source %q", v.Source)
		}
		if !hasUsage && v.Source == export.TokenSourceEngine {
			t.Fatal("engine without usage")
		}
		if !hasUsage && v.Source == SourceMismatch && !slices.Contains(v.Failed, CheckUsageMissing) {
			t.Fatalf("no usage but failures %v", v.Failed)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	c := Call{Endpoint: "/v1/chat/completions", N: 4, PromptTokenIDs: ids(1000), PromptTokens: 1000, CompletionTokens: 400, HasUsage: true}
	for range 4 {
		c.Choices = append(c.Choices, Choice{TokenIDs: ids(100), HasTokenIDs: true, Logprobs: 100})
	}
	b.ReportAllocs()
	for b.Loop() {
		if v := Verify(&c); !v.OK() {
			b.Fatal(v.Check())
		}
	}
}

// TestSides: each side's provenance from Verify's verdict.
func TestSides(t *testing.T) {
	for _, tc := range []struct {
		name             string
		c                Call
		prompt, response string
	}{
		{"verified", Call{PromptTokenIDs: []uint32{1, 2}, Choices: []Choice{{TokenIDs: []uint32{3}, HasTokenIDs: true, Logprobs: -1}},
			PromptTokens: 2, CompletionTokens: 1, HasUsage: true}, export.TokenSourceEngine, export.TokenSourceEngine},
		{"output short", Call{PromptTokenIDs: []uint32{1, 2}, Choices: []Choice{{TokenIDs: []uint32{3}, HasTokenIDs: true, Logprobs: -1}},
			PromptTokens: 2, CompletionTokens: 2, HasUsage: true}, export.TokenSourceEngine, SourceMismatch},
		{"prompt only", Call{PromptTokenIDs: []uint32{1, 2}, Choices: []Choice{{Logprobs: -1}},
			PromptTokens: 2, CompletionTokens: 2, HasUsage: true}, export.TokenSourceEngine, export.TokenSourceNone},
		{"no usage", Call{PromptTokenIDs: []uint32{1}, Choices: []Choice{{TokenIDs: []uint32{3}, HasTokenIDs: true, Logprobs: -1}}},
			SourceMismatch, SourceMismatch},
		{"nothing", Call{Choices: []Choice{{Logprobs: -1}}, HasUsage: true}, export.TokenSourceNone, export.TokenSourceNone},
	} {
		p, r := Sides(&tc.c, Verify(&tc.c))
		if p != tc.prompt || r != tc.response {
			t.Errorf("%s: %s/%s, want %s/%s", tc.name, p, r, tc.prompt, tc.response)
		}
	}
}
