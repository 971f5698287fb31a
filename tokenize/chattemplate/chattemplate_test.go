package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
	"github.com/rollgate/rollgate/tokenize/hf"
)

// Models whose real tokenizer.json and tokenizer_config.json the tests use.
var models = []string{"qwen2_5", "qwen3", "llama3"}

var loaded sync.Map // model -> *Retokenizer

// loadModel loads a model's Retokenizer once per test binary (loading a
// 150k-token vocabulary takes seconds under -race).
func loadModel(t testing.TB, model string) *Retokenizer {
	t.Helper()
	if r, ok := loaded.Load(model); ok {
		return r.(*Retokenizer)
	}
	r, err := LoadDir(chattemplatetest.ModelDir(t, model))
	if err != nil {
		t.Fatal(err)
	}
	loaded.Store(model, r)
	return r
}

// testCase is one conversation of testdata/cases.json.
type testCase chattemplatetest.Case

// requestBody is the chat request the case stands for.
func (c testCase) requestBody() string {
	m := map[string]json.RawMessage{"model": json.RawMessage(`"m"`), "messages": c.Messages}
	if len(c.Tools) > 0 {
		m["tools"] = c.Tools
	}
	if len(c.Kwargs) > 0 {
		m["chat_template_kwargs"] = c.Kwargs
	}
	b, _ := json.Marshal(m)
	return string(b)
}

func readJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestGolden renders every conversation of testdata/cases.json with the real
// Qwen2.5, Qwen3 and Llama 3 templates and tokenizers, and compares the
// prompt text and ids, and the response text and ids, with the golden files
// testdata/golden.mjs made with @huggingface/jinja and transformers.js.
func TestGolden(t *testing.T) {
	var cases []testCase
	readJSON(t, filepath.Join("testdata", "cases.json"), &cases)
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			r := loadModel(t, model)
			var want []chattemplatetest.IDs
			readJSON(t, filepath.Join("testdata", model+".golden.json"), &want)
			if len(want) != len(cases) {
				t.Fatalf("%d golden rows for %d cases: regenerate with testdata/golden.mjs", len(want), len(cases))
			}
			for i, c := range cases {
				g := want[i]
				prompt, err := r.Template.Render(Input{Messages: c.Messages, Tools: c.Tools, Kwargs: c.Kwargs, AddGenerationPrompt: true})
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				if prompt != g.Prompt {
					t.Errorf("%s: prompt\n got %q\nwant %q", c.Name, prompt, g.Prompt)
				}
				if ids := r.Tokenizer.Encode(prompt); !slices.Equal(ids, g.PromptIDs) {
					t.Errorf("%s: prompt ids\n got %v\nwant %v", c.Name, ids, g.PromptIDs)
				}
				if len(c.Response) == 0 {
					continue
				}
				got, err := r.Retokenize(c.requestBody(), string(c.Response), c.FinishReason)
				if g.Error != "" {
					if !errors.Is(err, ErrNotRetokenizable) {
						t.Errorf("%s: want ErrNotRetokenizable (%s), got %v", c.Name, g.Error, err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", c.Name, err)
					continue
				}
				if got.PromptText != g.Prompt || !slices.Equal(got.PromptIDs, g.PromptIDs) {
					t.Errorf("%s: Retokenize prompt differs from Render", c.Name)
				}
				if g.Response == nil || got.ResponseText != *g.Response {
					t.Errorf("%s: response\n got %q\nwant %q", c.Name, got.ResponseText, deref(g.Response))
				}
				if !slices.Equal(got.ResponseIDs, g.ResponseIDs) {
					t.Errorf("%s: response ids\n got %v\nwant %v", c.Name, got.ResponseIDs, g.ResponseIDs)
				}
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}

// TestGoldenFilesReproduce runs testdata/golden.mjs with the installed
// references and checks it writes the committed golden files byte for byte,
// so the goldens cannot drift from what the references say.
func TestGoldenFilesReproduce(t *testing.T) {
	for _, m := range models {
		chattemplatetest.ModelDir(t, m)
	}
	node, script := chattemplatetest.Script(t)
	out := t.TempDir()
	cmd := exec.Command(node, script, filepath.Join("testdata", "cases.json"), out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("golden.mjs: %v\n%s", err, b)
	}
	for _, m := range models {
		got, err := os.ReadFile(filepath.Join(out, m+".golden.json"))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("testdata", m+".golden.json"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s: golden.mjs output differs from testdata/%s.golden.json: regenerate with node testdata/golden.mjs testdata/cases.json testdata", m, m)
		}
	}
}

func TestToJSON(t *testing.T) {
	tpl, err := New(`{{ x | tojson }}|{{ x | tojson(indent=2) }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	f := func(in, want, wantIndent string) {
		t.Helper()
		got, err := tpl.Render(Input{Messages: []byte(`[]`), Kwargs: []byte(`{"x":` + in + `}`)})
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got != want+"|"+wantIndent {
			t.Fatalf("%s:\n got %q\nwant %q", in, got, want+"|"+wantIndent)
		}
	}
	f(`{"b":1,"a":[1,2.5,true,null,"x"]}`, `{"b": 1, "a": [1, 2.5, true, null, "x"]}`, "{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5,\n    true,\n    null,\n    \"x\"\n  ]\n}")
	f(`"é <b> & 'q' \"d\" \\ \n\t\u0001 \u2028"`, "\"é <b> & 'q' \\\"d\\\" \\\\ \\n\\t\\u0001 \u2028\"", "\"é <b> & 'q' \\\"d\\\" \\\\ \\n\\t\\u0001 \u2028\"")
	f(`{}`, `{}`, `{}`)
	f(`[]`, `[]`, `[]`)
	f(`1.0`, `1.0`, `1.0`)
	f(`1e20`, `1e+20`, `1e+20`)
	f(`0.0001`, `0.0001`, `0.0001`)
	f(`0.00001`, `1e-05`, `1e-05`)
	f(`12345678901234567890`, `1.2345678901234567e+19`, `1.2345678901234567e+19`)
	f(`{"a":1,"a":2}`, `{"a": 2}`, "{\n  \"a\": 2\n}")
}

func TestPrepareMessages(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got, err := PrepareMessages([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if string(got) != want {
			t.Fatalf("%s:\n got %s\nwant %s", in, got, want)
		}
	}
	f(`[]`, `[]`)
	f(`[{"role":"user","content":null}]`, `[{"role":"user","content":""}]`)
	f(`[{"role":"user"}]`, `[{"role":"user","content":""}]`)
	f(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_text","text":"b"}]}]`, `[{"role":"user","content":"a\nb"}]`)
	f(`[{"role":"assistant","content":"x","tool_calls":[{"function":{"name":"f","arguments":"{\"b\": 1, \"a\": 2}"}},{"function":{"name":"g","arguments":"not json"}}]}]`,
		`[{"role":"assistant","content":"x","tool_calls":[{"function":{"name":"f","arguments":{"b": 1, "a": 2}}},{"function":{"name":"g","arguments":"not json"}}]}]`)
	// Absent, null and empty arguments (a forced tool call cut short, a
	// streamed call with no argument deltas) render as {} as in vLLM 0.32;
	// "" written raw left "arguments": with no value.
	f(`[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":""}},{"function":{"name":"g","arguments":null}},{"function":{"name":"h"}}]}]`,
		`[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":{}}},{"function":{"name":"g","arguments":{}}},{"function":{"name":"h","arguments":{}}}],"content":""}]`)
	f(`[{"role":"assistant","content":"x","reasoning":"r"}]`, `[{"role":"assistant","content":"x","reasoning":"r","reasoning_content":"r"}]`)
	for _, bad := range []string{`{}`, `[1]`, `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`} {
		if _, err := PrepareMessages([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	tpl, err := LoadConfig([]byte(`{"chat_template":[{"name":"tool_use","template":"T"},{"name":"default","template":"{{ bos_token }}D{{ eos_token }}"}],"bos_token":{"content":"<s>"},"eos_token":"</s>"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tpl.Render(Input{Messages: []byte(`[]`)}); err != nil || got != "<s>D</s>" {
		t.Fatalf("got %q %v", got, err)
	}
	for _, bad := range []string{`{}`, `{"chat_template":1}`, `{"chat_template":[{"name":"x","template":""}]}`, `not json`, `{"chat_template":"{% if %}"}`} {
		if _, err := LoadConfig([]byte(bad)); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
	tpl, err = New(`{{ raise_exception("no system role") }}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tpl.Render(Input{Messages: []byte(`[]`)}); err == nil || !strings.Contains(err.Error(), "no system role") {
		t.Fatalf("raise_exception: %v", err)
	}
}

// TestRetokenizeRejects: calls that cannot be rebuilt faithfully are
// reported, not guessed.
func TestRetokenizeRejects(t *testing.T) {
	r := loadModel(t, "qwen2_5")
	for _, c := range []struct{ req, resp string }{
		{`{"prompt":"hi"}`, `{"content":"x"}`},
		{`not json`, `{"content":"x"}`},
		{`{"messages":[{"role":"user","content":"hi"}],"chat_template":"x"}`, `{"content":"x"}`},
		{`{"messages":[{"role":"user","content":"hi"}],"continue_final_message":true}`, `{"content":"x"}`},
		{`{"messages":[{"role":"user","content":"hi"}]}`, `[]`},
		{`{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, `{"content":"x"}`},
	} {
		if _, err := r.Retokenize(c.req, c.resp, "stop"); !errors.Is(err, ErrNotRetokenizable) {
			t.Errorf("%s %s: got %v, want ErrNotRetokenizable", c.req, c.resp, err)
		}
	}
}

// fuzzTemplate exercises what real chat templates use: loops with loop
// variables, namespace, slicing, string methods, tests, tojson.
const fuzzTemplate = `{%- set ns = namespace(last=messages|length - 1) %}
{%- for message in messages[::-1] %}{% if message.role == "user" %}{% set ns.last = loop.index0 %}{% endif %}{% endfor %}
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\n' }}
{%- if message.content is string %}{{ message.content.split('</think>')[-1].lstrip('\n') }}{% else %}{{ message.content | tojson }}{% endif %}
{%- if message.tool_calls %}{% for tc in message.tool_calls %}{% if tc.function is defined %}{% set tc = tc.function %}{% endif %}
{{- '\n<tool_call>\n{"name": "' }}{{ tc.name }}{{ '", "arguments": ' }}{{ tc.arguments | tojson }}{{ '}\n</tool_call>' }}{% endfor %}{% endif %}
{{- '<|im_end|>\n' }}
{%- endfor %}
{%- if tools %}{% for tool in tools %}{{ tool | tojson(indent=2) }}{% endfor %}{% endif %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

// FuzzRender renders captured (untrusted) messages: Render never panics,
// and either renders or returns an error.
func FuzzRender(f *testing.F) {
	tpl, err := New(fuzzTemplate, "", "")
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(`[{"role":"user","content":"hi"}]`), []byte(`null`))
	f.Add([]byte(`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":[1,{}]}"}}]}]`), []byte(`[{"type":"function"}]`))
	f.Add([]byte(`[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":1}]`), []byte(`{}`))
	f.Fuzz(func(t *testing.T, messages, tools []byte) {
		out, err := tpl.Render(Input{Messages: messages, Tools: tools, AddGenerationPrompt: true})
		if err == nil && !strings.HasSuffix(out, "<|im_start|>assistant\n") {
			t.Fatalf("rendered without the generation prompt: %q", out)
		}
	})
}

// TestConcurrentRetokenize retokenizes from several goroutines (for -race):
// one Retokenizer serves a whole bridge run or several HTTP builds.
func TestConcurrentRetokenize(t *testing.T) {
	r := loadModel(t, "qwen2_5")
	var cases []testCase
	readJSON(t, filepath.Join("testdata", "cases.json"), &cases)
	want := make([]*Retokenized, len(cases))
	for i, c := range cases {
		var err error
		if want[i], err = r.Retokenize(c.requestBody(), string(c.Response), c.FinishReason); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, c := range cases {
				got, err := r.Retokenize(c.requestBody(), string(c.Response), c.FinishReason)
				if err != nil || !slices.Equal(got.PromptIDs, want[i].PromptIDs) || !slices.Equal(got.ResponseIDs, want[i].ResponseIDs) {
					t.Errorf("%s: concurrent result differs (%v)", c.Name, err)
				}
			}
		}()
	}
	wg.Wait()
}

// FuzzRetokenize feeds captured (untrusted) request bodies, assistant
// messages and finish reasons to Retokenize, with fuzzTemplate and the
// embedded cl100k_base vocabulary: it never panics, and what it returns
// decodes back to the texts it reports.
func FuzzRetokenize(f *testing.F) {
	tpl, err := New(fuzzTemplate, "", "")
	if err != nil {
		f.Fatal(err)
	}
	tok, err := hf.Tiktoken(hf.CL100K)
	if err != nil {
		f.Fatal(err)
	}
	r := &Retokenizer{Template: tpl, Tokenizer: tok}
	f.Add(`{"messages":[{"role":"user","content":"hi"}]}`, `{"role":"assistant","content":"hello"}`, "stop")
	f.Add(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"x":1}}`,
		`{"content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\": [1, 2.5]}"}}]}`, "tool_calls")
	f.Add(`{"messages":[],"add_generation_prompt":false}`, `{"content":"cut","reasoning":"r"}`, "length")
	f.Fuzz(func(t *testing.T, request, message, finish string) {
		out, err := r.Retokenize(request, message, finish)
		if err != nil {
			return
		}
		for _, c := range []struct {
			ids  []uint32
			text string
		}{{out.PromptIDs, out.PromptText}, {out.ResponseIDs, out.ResponseText}} {
			if got, err := tok.Decode(c.ids); err != nil || got != tok.Normalize(c.text) && got != c.text {
				t.Fatalf("ids decode to %q (%v), want %q", got, err, c.text)
			}
		}
	})
}

// TestLoadModelDir: a chat_template.jinja or chat_template.json next to
// tokenizer_config.json wins over its chat_template; tokens come from the config.
func TestLoadModelDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	render := func() string {
		t.Helper()
		tpl, err := LoadModelDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		out, err := tpl.Render(Input{Messages: []byte(`[]`)})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	write("tokenizer_config.json", `{"chat_template":"config {{ bos_token }}","bos_token":"<s>"}`)
	if got := render(); got != "config <s>" {
		t.Fatalf("tokenizer_config.json: %q", got)
	}
	write("chat_template.json", `{"chat_template":"json {{ bos_token }}"}`)
	if got := render(); got != "json <s>" {
		t.Fatalf("chat_template.json: %q", got)
	}
	write("chat_template.jinja", "jinja {{ bos_token }}")
	if got := render(); got != "jinja <s>" {
		t.Fatalf("chat_template.jinja: %q", got)
	}
	if _, err := LoadModelDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("no error for a missing folder")
	}
}
