package gateway_test

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/tokenize"
)

// TestSGLangPerChoiceIDs runs the gateway in front of the mock's SGLang
// flavour (kind sglang): ids come per choice (choices[].prompt_token_ids,
// choices[].token_ids), the client's copy equals a direct call's, and every
// row holds its choice's exact ids, verified. Streaming chat, which SGLang
// refuses with return_token_ids, gets nothing injected and still answers;
// its rows say no ids were available rather than holding wrong ones.
func TestSGLangPerChoiceIDs(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnvWith(t, s, mock.Config{Flavor: mock.FlavorSGLang}, func(c *gateway.Config) {
		c.Backends[0].Replicas[0].Kind = "sglang"
	})
	for _, tc := range []struct {
		name, path, body string
		n                int
		stream           bool
	}{
		{"chat", "/v1/chat/completions", chatBody, 1, false},
		{"chat-n3", "/v1/chat/completions", withStream(chatBody, `"n":3`), 3, false},
		{"completions", "/v1/completions", `{"model":"mock-model","prompt":"Once upon a time","max_tokens":9}`, 1, false},
		{"completions-list-n2", "/v1/completions", `{"model":"mock-model","prompt":["a b c","d e"],"max_tokens":5,"n":2}`, 4, false},
		{"completions-stream", "/v1/completions", `{"model":"mock-model","prompt":["a b c","d e"],"max_tokens":5,"n":2,"stream":true}`, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := do(t, "POST", e.mockURL+strings.TrimPrefix(tc.path, "/v1"), tc.body)
			got := do(t, "POST", e.url+tc.path, tc.body)
			if got.status != 200 || direct.status != 200 {
				t.Fatalf("status: gateway %d (%s), direct %d (%s)", got.status, got.body, direct.status, direct.body)
			}
			if sent := string(e.mock.LastRequest()); !strings.Contains(sent, `"return_token_ids":true`) {
				t.Fatalf("return_token_ids not injected: %s", sent)
			}
			if string(got.body) != string(direct.body) {
				t.Fatalf("client copy differs from a direct call\n gateway: %s\n direct:  %s", got.body, direct.body)
			}
			rows := e.waitCalls(got.header.Get("x-request-id"), tc.n)
			wantPrompt, wantChoices := directPerChoice(t, e, strings.TrimPrefix(tc.path, "/v1"), tc.body)
			if len(wantChoices) != tc.n {
				t.Fatalf("direct call gave %d choices, want %d", len(wantChoices), tc.n)
			}
			for i, r := range rows {
				if r.ChoiceIndex != uint32(i) || r.Stream != tc.stream {
					t.Fatalf("row %d: choice_index %d stream %v", i, r.ChoiceIndex, r.Stream)
				}
				if len(r.ResponseTokenIDs) == 0 || !equalIDs(r.ResponseTokenIDs, wantChoices[i]) {
					t.Fatalf("choice %d: stored ids %v, engine %v", i, r.ResponseTokenIDs, wantChoices[i])
				}
				if len(r.PromptTokenIDs) == 0 || !equalIDs(r.PromptTokenIDs, wantPrompt[i]) {
					t.Fatalf("choice %d: stored prompt ids %v, engine %v", i, r.PromptTokenIDs, wantPrompt[i])
				}
				if r.TokenSource != export.TokenSourceEngine || r.TokenCheck != "" {
					t.Fatalf("choice %d: token_source %q check %q, want engine", i, r.TokenSource, r.TokenCheck)
				}
			}
		})
	}
	t.Run("chat-stream", func(t *testing.T) {
		body := withStream(chatBody, `"stream":true`)
		direct := do(t, "POST", e.mockURL+"/chat/completions", body)
		got := do(t, "POST", e.url+"/v1/chat/completions", body)
		if got.status != 200 || string(got.body) != string(direct.body) {
			t.Fatalf("gateway %d: %s\ndirect: %s", got.status, got.body, direct.body)
		}
		if sent := string(e.mock.LastRequest()); strings.Contains(sent, "return_token_ids") {
			t.Fatalf("return_token_ids injected into an SGLang streaming chat (it would be refused): %s", sent)
		}
		r := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
		if len(r.ResponseTokenIDs) != 0 || r.TokenSource == export.TokenSourceEngine || r.Error != "" || r.CompletionTokens == 0 {
			t.Fatalf("row: token_source %q ids %v error %q completion_tokens %d", r.TokenSource, r.ResponseTokenIDs, r.Error, r.CompletionTokens)
		}
	})
}

// directPerChoice asks the engine directly (not streamed) for ids and
// returns each choice's prompt and output ids (SGLang puts both on every choice).
func directPerChoice(t *testing.T, e *env, path, body string) (prompts, outputs [][]uint32) {
	t.Helper()
	body = strings.Replace(body, `"stream":true`, `"stream":false`, 1)
	r := do(t, "POST", e.mockURL+path, withStream(body, `"return_token_ids":true`))
	if r.status != 200 {
		t.Fatalf("direct call: %d %s", r.status, r.body)
	}
	for i, c := range gjson.GetBytes(r.body, "choices").Array() {
		if c.Get("index").Int() != int64(i) {
			t.Fatalf("direct choices out of order: %s", r.body)
		}
		prompts = append(prompts, uint32s(c.Get("prompt_token_ids")))
		outputs = append(outputs, uint32s(c.Get("token_ids")))
	}
	return prompts, outputs
}

// TestLlamaCppIDsFromLogprobs runs the gateway in front of the mock's
// llama.cpp flavour (kind llamacpp), which never returns token ids: the
// gateway asks chat calls for logprobs (each entry carries the sampled id),
// removes them from the client's copy (byte-identical to a direct call), and
// capture completes the prompt ids with the engine's own /apply-template and
// /tokenize: rows hold the engine's exact ids, marked tokenize. A client that
// asked for logprobs itself gets them untouched and the same ids are stored.
func TestLlamaCppIDsFromLogprobs(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnvWith(t, s, mock.Config{Flavor: mock.FlavorLlamaCpp}, func(c *gateway.Config) {
		c.Backends[0].Replicas[0].Kind = "llamacpp"
	})
	// What the engine itself says the ids are: logprob ids of the output, and
	// /apply-template + /tokenize of the messages for the prompt.
	engineIDs := func(body string) (prompt, output []uint32) {
		t.Helper()
		r := do(t, "POST", e.mockURL+"/chat/completions", withStream(body, `"logprobs":true`))
		for _, lp := range gjson.GetBytes(r.body, "choices.0.logprobs.content").Array() {
			output = append(output, uint32(lp.Get("id").Uint()))
		}
		tmpl := do(t, "POST", strings.TrimSuffix(e.mockURL, "/v1")+"/apply-template", `{"messages":`+gjson.Get(body, "messages").Raw+`}`)
		tok := do(t, "POST", strings.TrimSuffix(e.mockURL, "/v1")+"/tokenize",
			`{"content":`+gjson.GetBytes(tmpl.body, "prompt").Raw+`,"add_special":true,"parse_special":true}`)
		return uint32s(gjson.GetBytes(tok.body, "tokens")), output
	}
	for _, tc := range []struct {
		name, body string
		stream     bool
	}{
		{"chat", chatBody, false},
		{"chat-stream", withStream(chatBody, `"stream":true`), true},
		{"chat-stream-usage", withStream(chatBody, `"stream":true,"stream_options":{"include_usage":true}`), true},
		{"client-asked-logprobs", withStream(chatBody, `"logprobs":true`), false},
		{"client-asked-logprobs-stream", withStream(chatBody, `"logprobs":true,"stream":true`), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct := do(t, "POST", e.mockURL+"/chat/completions", tc.body)
			got := do(t, "POST", e.url+"/v1/chat/completions", tc.body)
			if got.status != 200 || direct.status != 200 {
				t.Fatalf("status: gateway %d (%s), direct %d (%s)", got.status, got.body, direct.status, direct.body)
			}
			// (What was sent is proven by the row: without the injected
			// logprobs there would be no output ids to store. The mock's last
			// request may already be capture's /tokenize call.)
			if string(got.body) != string(direct.body) {
				t.Fatalf("client copy differs from a direct call\n gateway: %s\n direct:  %s", got.body, direct.body)
			}
			row := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
			wantPrompt, wantOutput := engineIDs(chatBody)
			if len(wantPrompt) == 0 || len(wantOutput) == 0 {
				t.Fatalf("the engine gave no ids: prompt %v output %v", wantPrompt, wantOutput)
			}
			if row.TokenSource != export.TokenSourceTokenize || row.TokenCheck != "" ||
				!equalIDs(row.PromptTokenIDs, wantPrompt) || !equalIDs(row.ResponseTokenIDs, wantOutput) {
				t.Fatalf("row: source %q check %q prompt %v (want %v) output %v (want %v)", row.TokenSource, row.TokenCheck,
					row.PromptTokenIDs, wantPrompt, row.ResponseTokenIDs, wantOutput)
			}
			if len(row.ResponseLogprobs) != len(wantOutput) || row.Stream != tc.stream ||
				row.PromptTokenSource != export.TokenSourceTokenize || row.ResponseTokenSource != export.TokenSourceTokenize {
				t.Fatalf("row: %d logprobs for %d ids, stream %v, sides %q/%q", len(row.ResponseLogprobs), len(wantOutput), row.Stream,
					row.PromptTokenSource, row.ResponseTokenSource)
			}
		})
	}
	// /v1/completions: "logprobs":1 is injected (their entries carry the
	// ids too) and nulled in the client's copy, where llama.cpp writes
	// "logprobs":null when not asked.
	cmpl := `{"model":"mock-model","prompt":"hello the world","max_tokens":6}`
	root := strings.TrimSuffix(e.mockURL, "/v1")
	tok := do(t, "POST", root+"/tokenize", `{"content":"hello the world","add_special":true,"parse_special":true}`)
	wantPrompt := uint32s(gjson.GetBytes(tok.body, "tokens"))
	var wantOutput []uint32
	for _, lp := range gjson.GetBytes(do(t, "POST", e.mockURL+"/completions", withStream(cmpl, `"logprobs":1`)).body, "choices.0.logprobs.content").Array() {
		wantOutput = append(wantOutput, uint32(lp.Get("id").Uint()))
	}
	for _, body := range []string{cmpl, withStream(cmpl, `"stream":true`)} {
		direct := do(t, "POST", e.mockURL+"/completions", body)
		got := do(t, "POST", e.url+"/v1/completions", body)
		if got.status != 200 || string(got.body) != string(direct.body) {
			t.Fatalf("completions %s: %d\n gateway: %s\n direct:  %s", body, got.status, got.body, direct.body)
		}
		row := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
		if row.TokenSource != export.TokenSourceTokenize || row.TokenCheck != "" || len(wantOutput) != 6 ||
			!equalIDs(row.PromptTokenIDs, wantPrompt) || !equalIDs(row.ResponseTokenIDs, wantOutput) {
			t.Fatalf("completions row %s: %q %q prompt %v (want %v) output %v (want %v)", body, row.TokenSource, row.TokenCheck,
				row.PromptTokenIDs, wantPrompt, row.ResponseTokenIDs, wantOutput)
		}
	}
}

// TestLlamaCppToolsStream: a streamed chat call with tools towards llama.cpp,
// which refuses logprobs for that shape. The gateway injects nothing, so the
// call succeeds exactly as a direct one; capture keeps the prompt ids (from
// /apply-template of the whole body, tools included, then /tokenize) and
// flags the missing output ids: prompt_token_source tokenize,
// response_token_source none, token_source none, token_check
// completion_missing.
func TestLlamaCppToolsStream(t *testing.T) {
	s, _ := openSQLite(t)
	e := newEnvWith(t, s, mock.Config{Flavor: mock.FlavorLlamaCpp}, func(c *gateway.Config) {
		c.Backends[0].Replicas[0].Kind = "llamacpp"
	})
	tools := `[{"type":"function","function":{"name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	body := `{"model":"mock-model","stream":true,"tools":` + tools + `,"messages":[{"role":"user","content":"weather in Paris?"}]}`
	direct := do(t, "POST", e.mockURL+"/chat/completions", body)
	got := do(t, "POST", e.url+"/v1/chat/completions", body)
	if got.status != 200 || direct.status != 200 || string(got.body) != string(direct.body) {
		t.Fatalf("gateway %d, direct %d\n gateway: %s\n direct:  %s", got.status, direct.status, got.body, direct.body)
	}
	if !strings.Contains(string(got.body), `"tool_calls"`) || !strings.Contains(string(got.body), `"timings"`) {
		t.Fatalf("no tool call or no timings in %s", got.body)
	}
	// The engine asked directly with logprobs refuses: what the gateway
	// must not have sent.
	if r := do(t, "POST", e.mockURL+"/chat/completions", withStream(body, `"logprobs":true`)); r.status != 400 {
		t.Fatalf("the mock accepted logprobs with tools + stream: %d", r.status)
	}
	root := strings.TrimSuffix(e.mockURL, "/v1")
	tmpl := do(t, "POST", root+"/apply-template", body)
	tok := do(t, "POST", root+"/tokenize", `{"content":`+gjson.GetBytes(tmpl.body, "prompt").Raw+`,"add_special":true,"parse_special":true}`)
	wantPrompt := uint32s(gjson.GetBytes(tok.body, "tokens"))
	if !strings.Contains(gjson.GetBytes(tmpl.body, "prompt").Str, "get_weather") {
		t.Fatalf("template without the tools: %s", tmpl.body)
	}
	row := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
	if row.TokenSource != export.TokenSourceNone || row.TokenCheck != tokenize.CheckCompletionMissing ||
		row.PromptTokenSource != export.TokenSourceTokenize || row.ResponseTokenSource != export.TokenSourceNone ||
		!equalIDs(row.PromptTokenIDs, wantPrompt) || len(row.ResponseTokenIDs) != 0 || row.PromptTokens != uint32(len(wantPrompt)) {
		t.Fatalf("row: source %q check %q sides %q/%q prompt %v (want %v) output %v usage %d/%d", row.TokenSource, row.TokenCheck,
			row.PromptTokenSource, row.ResponseTokenSource, row.PromptTokenIDs, wantPrompt, row.ResponseTokenIDs, row.PromptTokens, row.CompletionTokens)
	}
}

// TestSplitCharactersIDs: an answer holding a character split over byte tokens.
// vLLM returns every id: the row is verified. llama.cpp leaves the tokens that end
// inside the character out of its logprobs (usage counts them): the output ids come
// up short, so the row keeps its verified prompt ids only (response_token_source
// none, token_check completion_count), and the client still sees the engine's answer.
func TestSplitCharactersIDs(t *testing.T) {
	s, _ := openSQLite(t)
	for _, fl := range []mock.Flavor{mock.FlavorVLLM, mock.FlavorLlamaCpp} {
		e := newEnvWith(t, s, mock.Config{Flavor: fl, SplitChars: 4}, func(c *gateway.Config) {
			c.Backends[0].Replicas[0].Kind = string(fl)
		})
		direct := do(t, "POST", e.mockURL+"/chat/completions", chatBody)
		got := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
		if got.status != 200 || string(got.body) != string(direct.body) || !strings.Contains(string(got.body), "\U0001F600") {
			t.Fatalf("%s: %d\n gateway: %s\n direct:  %s", fl, got.status, got.body, direct.body)
		}
		row := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
		wantPrompt, wantResp, wantPair, wantCheck := export.TokenSourceEngine, export.TokenSourceEngine, export.TokenSourceEngine, ""
		if fl == mock.FlavorLlamaCpp {
			wantPrompt, wantResp, wantPair, wantCheck = export.TokenSourceTokenize, export.TokenSourceNone, export.TokenSourceNone, tokenize.CheckCompletionCount
		}
		if row.PromptTokenSource != wantPrompt || row.ResponseTokenSource != wantResp || row.TokenSource != wantPair || row.TokenCheck != wantCheck ||
			len(row.PromptTokenIDs) == 0 || (wantResp == export.TokenSourceNone) != (len(row.ResponseTokenIDs) == 0) {
			t.Fatalf("%s row: %q %q %q %q, %d prompt ids, %d response ids", fl, row.PromptTokenSource, row.ResponseTokenSource,
				row.TokenSource, row.TokenCheck, len(row.PromptTokenIDs), len(row.ResponseTokenIDs))
		}
	}
}
