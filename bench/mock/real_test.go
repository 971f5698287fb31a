package mock

import (
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// realModels are the real vocabularies installed for tests (chattemplatetest.ModelDir).
var realModels = []string{"qwen2_5", "qwen3", "llama3"}

const realTools = `[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`

// TestRealTemplateMode: with --model-dir the prompt is the model's own
// template encoded by its tokenizer (chattemplate, the code the gateway's
// retokenizer is checked with), /tokenize and /detokenize agree with it,
// answers end on the template's end-of-turn token, are the tokenizer's
// encoding of their text, and a stream assembles to the whole answer
// (content, reasoning, tool calls). Qwen3 thinks unless enable_thinking is
// false; Llama 3's tool call is llama3_json.
func TestRealTemplateMode(t *testing.T) {
	eots := map[string]string{"qwen2_5": "<|im_end|>", "qwen3": "<|im_end|>", "llama3": "<|eot_id|>"}
	for _, model := range realModels {
		dir := chattemplatetest.ModelDir(t, model)
		rt, err := chattemplate.LoadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		_, base := startT(t, Config{ScaleOut: true, ModelDir: dir})
		for _, kwargs := range []string{"", `{"enable_thinking":false}`} {
			for _, tools := range []bool{false, true} {
				msgs := `[{"role":"system","content":"Be brief."},{"role":"user","content":"Weather in Paris?"}]`
				body := `{"model":"m","messages":` + msgs + `,"return_token_ids":true,"max_tokens":200`
				if kwargs != "" {
					body += `,"chat_template_kwargs":` + kwargs
				}
				if tools {
					body += `,"tools":` + realTools + `,"tool_choice":"required"`
				}
				name := model + " kwargs=" + kwargs
				if tools {
					name += " tools"
				}
				whole := mustOK(t, post(t, base+"/chat/completions", body+`}`))
				prompt, err := rt.Template.Render(chattemplate.Input{Messages: []byte(msgs), Tools: []byte(gjson.Get(body+`}`, "tools").Raw), Kwargs: []byte(kwargs), AddGenerationPrompt: true})
				if err != nil {
					t.Fatal(err)
				}
				if got, want := ids(whole.Get("prompt_token_ids")), rt.Tokenizer.Encode(prompt); !eqIDs(got, want) {
					t.Fatalf("%s: prompt ids %v, the template + tokenizer give %v", name, got, want)
				}
				tok := mustOK(t, post(t, origin(base)+"/tokenize", `{"messages":`+msgs+`,"tools":`+orNull(gjson.Get(body+`}`, "tools").Raw)+`,"chat_template_kwargs":`+orNull(kwargs)+`}`))
				if !eqIDs(ids(tok.Get("tokens")), ids(whole.Get("prompt_token_ids"))) {
					t.Fatalf("%s: /tokenize %v, chat prompt ids %v", name, tok.Get("tokens").Raw, whole.Get("prompt_token_ids").Raw)
				}
				out := ids(whole.Get("choices.0.token_ids"))
				eot, _ := rt.Tokenizer.AddedID(eots[model])
				if len(out) < 2 || out[len(out)-1] != eot {
					t.Fatalf("%s: answer ids %v do not end on %s (%d)", name, out, eots[model], eot)
				}
				text, err := rt.Tokenizer.Decode(out[:len(out)-1])
				if err != nil || !eqIDs(rt.Tokenizer.Encode(text), out[:len(out)-1]) {
					t.Fatalf("%s: the answer's ids are not the tokenizer's encoding of their text %q (%v)", name, text, err)
				}
				detok := mustOK(t, post(t, origin(base)+"/detokenize", `{"tokens":`+whole.Get("choices.0.token_ids").Raw+`}`))
				if detok.Get("prompt").Str != text+eots[model] {
					t.Fatalf("%s: /detokenize %q, want %q", name, detok.Get("prompt").Str, text+eots[model])
				}
				m := whole.Get("choices.0.message")
				thinks := model == "qwen3" && kwargs == ""
				if (m.Get("reasoning").String() != "") != thinks || strings.Contains(m.Get("content").String(), "think>") {
					t.Errorf("%s: reasoning %s, content %s; want reasoning exactly when Qwen3 thinks", name, m.Get("reasoning").Raw, m.Get("content").Raw)
				}
				calls := m.Get("tool_calls").Array()
				if tools != (len(calls) == 1) || (tools && (calls[0].Get("function.name").Str != "get_weather" || !gjson.Valid(calls[0].Get("function.arguments").Str))) {
					t.Errorf("%s: tool calls %s", name, m.Get("tool_calls").Raw)
				}
				if tools && model == "llama3" && !strings.HasPrefix(text, `{"name": "get_weather", "parameters": `) {
					t.Errorf("%s: llama3_json tool call text %q", name, text)
				}
				if tools && model != "llama3" && !strings.Contains(text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ") {
					t.Errorf("%s: hermes tool call text %q", name, text)
				}
				// The stream assembles to the whole answer.
				evs := parseSSE(t, post(t, base+"/chat/completions", body+`,"stream":true}`).body)
				var content, reasoning, args, fname string
				for _, ev := range evs {
					d := gjson.Get(ev.data, "choices.0.delta")
					content += d.Get("content").Str
					reasoning += d.Get("reasoning").Str
					for _, tc := range d.Get("tool_calls").Array() {
						fname += tc.Get("function.name").Str
						args += tc.Get("function.arguments").Str
					}
				}
				wantArgs, wantName := "", ""
				if tools {
					wantArgs, wantName = calls[0].Get("function.arguments").Str, calls[0].Get("function.name").Str
				}
				if content != m.Get("content").Str || reasoning != m.Get("reasoning").Str || args != wantArgs || fname != wantName {
					t.Errorf("%s: stream content %q reasoning %q call %s(%s); whole %s", name, content, reasoning, fname, args, m.Raw)
				}
			}
		}
	}
}

func orNull(s string) string {
	if s == "" {
		return "null"
	}
	return s
}

// TestRealTemplateModeRefused: --model-dir that does not load, or with
// another flavour, is an error at start naming the problem.
func TestRealTemplateModeRefused(t *testing.T) {
	if _, _, err := Start(Config{ModelDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "tokenizer.json") {
		t.Errorf("an empty model folder: %v, want an error naming tokenizer.json", err)
	}
	if _, _, err := Start(Config{ModelDir: chattemplatetest.ModelDir(t, "qwen2_5"), Flavor: FlavorSGLang}); err == nil || !strings.Contains(err.Error(), "--flavor vllm") {
		t.Errorf("--model-dir with flavour sglang: %v, want an error naming --flavor vllm", err)
	}
}

// FuzzRealParse: the real-template parsers never panic and always write
// JSON, whole or streamed.
func FuzzRealParse(f *testing.F) {
	f.Add("<think>\nhi\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", 20)
	f.Add(`{"name": "f", "parameters": {"a": [1, {"b": "}"}]}}`, 9)
	f.Add("<tool_call>{\"name\": \"f\", \"arguments\": ", 3)
	f.Add(`{"name" : "g" ,"parameters":`, 1)
	f.Fuzz(func(t *testing.T, text string, cut int) {
		for _, m := range []*realModel{{thinking: true}, {llama3JSON: true}} {
			whole := m.parse(text, true, true, true)
			out := appendParsedMessage([]byte(`{"content":`), &whole, false, []uint32{1}, 0)
			if out = append(out, '}'); !gjson.ValidBytes(out) {
				t.Fatalf("invalid JSON for %q: %s", text, out)
			}
			cut := min(max(cut, 0), len(text))
			was, now := m.parse(text[:cut], true, true, false), m.parse(text, true, true, false)
			d, _ := appendParsedDelta([]byte("{"), &was, &now, cut%2 == 0, func(int) string { return "id" })
			if d = append(d, '}'); !gjson.ValidBytes(d) {
				t.Fatalf("invalid delta JSON for %q cut at %d: %s", text, cut, d)
			}
		}
	})
}
