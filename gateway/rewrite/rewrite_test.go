package rewrite

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

func TestRewrite(t *testing.T) {
	f := func(body string, ep openai.Endpoint, kind openai.Kind, opt Options, want string, wantInj Injected) {
		t.Helper()
		prefix := []byte("PREFIX")
		out, _, inj, err := Rewrite(prefix, []byte(body), ep, kind, opt)
		if err != nil {
			t.Fatalf("Rewrite(%s): %v", body, err)
		}
		if !strings.HasPrefix(string(out), "PREFIX") {
			t.Fatalf("Rewrite(%s) did not append to dst: %q", body, out)
		}
		got := string(out[len("PREFIX"):])
		if got != want {
			t.Fatalf("Rewrite(%s)\n got %s\nwant %s", body, got, want)
		}
		if inj != wantInj {
			t.Fatalf("Rewrite(%s) injected %v, want %v", body, inj, wantInj)
		}
		if !gjson.Valid(got) {
			t.Fatalf("Rewrite(%s) produced invalid JSON %s", body, got)
		}
	}
	none := Options{}
	lp := Options{Logprobs: true}

	// vLLM: ids always, usage on streams.
	f(`{"model":"m","messages":[]}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"model":"m","messages":[],"return_token_ids":true}`, ReturnTokenIDs)
	f(`{"model":"m","stream":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"model":"m","stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`, ReturnTokenIDs|IncludeUsage)
	f(`{"model":"m","prompt":"x","stream":true}`, openai.Completions, openai.KindVLLM, none,
		`{"model":"m","prompt":"x","stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`, ReturnTokenIDs|IncludeUsage)
	// vLLM before 0.10.2: ids through logprobs named by id, not return_token_ids.
	old := Options{IDsFromLogprobs: true}
	f(`{"model":"m","messages":[]}`, openai.ChatCompletions, openai.KindVLLM, old,
		`{"model":"m","messages":[],"logprobs":true,"return_tokens_as_token_ids":true}`, Logprobs|TokensAsIDs)
	f(`{"model":"m","prompt":"x","stream":true}`, openai.Completions, openai.KindVLLM, old,
		`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true},"logprobs":0,"return_tokens_as_token_ids":true}`, IncludeUsage|Logprobs|TokensAsIDs)
	// ... but never when the client asked for logprobs (its token strings would change).
	f(`{"model":"m","messages":[],"logprobs":true}`, openai.ChatCompletions, openai.KindVLLM, old,
		`{"model":"m","messages":[],"logprobs":true}`, 0)
	f(`{"model":"m","messages":[],"return_tokens_as_token_ids":false}`, openai.ChatCompletions, openai.KindVLLM, old,
		`{"model":"m","messages":[],"return_tokens_as_token_ids":false}`, 0)
	// SGLang: no ids on streaming chat (400 there), ids elsewhere.
	f(`{"model":"m","stream":true}`, openai.ChatCompletions, openai.KindSGLang, none,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, IncludeUsage)
	f(`{"model":"m"}`, openai.ChatCompletions, openai.KindSGLang, none, `{"model":"m","return_token_ids":true}`, ReturnTokenIDs|OmitIDs)
	f(`{"model":"m","stream":true}`, openai.Completions, openai.KindSGLang, none,
		`{"model":"m","stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`, ReturnTokenIDs|IncludeUsage|OmitIDs)
	// SGLang leaves unasked id keys out: stripping must delete them.
	f(`{"model":"m","prompt":"x"}`, openai.Completions, openai.KindSGLang, none,
		`{"model":"m","prompt":"x","return_token_ids":true}`, ReturnTokenIDs|OmitIDs)
	// llama.cpp: output ids only through logprobs (their "id"), with the
	// fewest alternatives that still return entries (top_logprobs / n_probs
	// 1); not when the client set logprobs, top_logprobs or n_probs.
	f(`{"model":"m","messages":[]}`, openai.ChatCompletions, openai.KindLlamaCpp, none,
		`{"model":"m","messages":[],"logprobs":true,"top_logprobs":1}`, Logprobs|OmitLogprobs)
	f(`{"model":"m","messages":[],"top_logprobs":null}`, openai.ChatCompletions, openai.KindLlamaCpp, none,
		`{"model":"m","messages":[],"top_logprobs":1,"logprobs":true}`, Logprobs|OmitLogprobs)
	// Streams: no include_usage (it moves "timings" off the finish chunk).
	f(`{"model":"m","messages":[],"stream":true}`, openai.ChatCompletions, openai.KindLlamaCpp, none,
		`{"model":"m","messages":[],"stream":true,"logprobs":true,"top_logprobs":1}`, Logprobs|OmitLogprobs)
	// A streamed chat request with tools: llama.cpp refuses logprobs there
	// ("logprobs is not supported with tools + stream"), so nothing is added.
	f(`{"model":"m","messages":[],"stream":true,"tools":[{"type":"function","function":{"name":"f"}}]}`, openai.ChatCompletions, openai.KindLlamaCpp, none,
		`{"model":"m","messages":[],"stream":true,"tools":[{"type":"function","function":{"name":"f"}}]}`, 0)
	// ... but an empty tools list is no tools, and without stream tools are fine.
	f(`{"model":"m","messages":[],"stream":true,"tools":[ ]}`, openai.ChatCompletions, openai.KindLlamaCpp, none,
		`{"model":"m","messages":[],"stream":true,"tools":[ ],"logprobs":true,"top_logprobs":1}`, Logprobs|OmitLogprobs)
	f(`{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f"}}]}`, openai.ChatCompletions, openai.KindLlamaCpp, none,
		`{"model":"m","messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"logprobs":true,"top_logprobs":1}`, Logprobs|OmitLogprobs)
	f(`{"model":"m","messages":[],"logprobs":false}`, openai.ChatCompletions, openai.KindLlamaCpp, none, `{"model":"m","messages":[],"logprobs":false}`, 0)
	f(`{"model":"m","messages":[],"top_logprobs":2}`, openai.ChatCompletions, openai.KindLlamaCpp, none, `{"model":"m","messages":[],"top_logprobs":2}`, 0)
	f(`{"model":"m","messages":[],"n_probs":3}`, openai.ChatCompletions, openai.KindLlamaCpp, none, `{"model":"m","messages":[],"n_probs":3}`, 0)
	// Completions: "logprobs":1 (n_probs 1; 0 returns no entries); the key is
	// always in llama.cpp's answer (null when not asked), so it is nulled.
	f(`{"model":"m","prompt":"x"}`, openai.Completions, openai.KindLlamaCpp, none, `{"model":"m","prompt":"x","logprobs":1}`, Logprobs)
	f(`{"model":"m","prompt":"x","stream":true}`, openai.Completions, openai.KindLlamaCpp, lp, `{"model":"m","prompt":"x","stream":true,"logprobs":1}`, Logprobs)
	f(`{"model":"m","prompt":"x","logprobs":2}`, openai.Completions, openai.KindLlamaCpp, none, `{"model":"m","prompt":"x","logprobs":2}`, 0)
	// OpenAI upstream and other endpoints: never touched.
	f(`{"model":"m","stream":true}`, openai.ChatCompletions, openai.KindOpenAI, lp, `{"model":"m","stream":true}`, 0)
	f(`{"model":"m","input":"x","stream":true}`, openai.Responses, openai.KindVLLM, lp, `{"model":"m","input":"x","stream":true}`, 0)
	f(`{"model":"m","input":"x"}`, openai.Embeddings, openai.KindVLLM, lp, `{"model":"m","input":"x"}`, 0)
	f(`{"model":"m"}`, openai.Unknown, openai.KindVLLM, lp, `{"model":"m"}`, 0)
	// Client set the field itself: untouched (even to false).
	f(`{"model":"m","return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none, `{"model":"m","return_token_ids":true}`, 0)
	f(`{"model":"m","return_token_ids":false}`, openai.ChatCompletions, openai.KindVLLM, none, `{"model":"m","return_token_ids":false}`, 0)
	f(`{"model":"m","return_token_ids":null}`, openai.ChatCompletions, openai.KindVLLM, none, `{"model":"m","return_token_ids":true}`, ReturnTokenIDs)
	// stream_options: merge, respect, replace null.
	f(`{"stream":true,"stream_options":{},"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, IncludeUsage)
	f(`{"stream":true,"stream_options":{ },"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"include_usage":true },"return_token_ids":true}`, IncludeUsage)
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":false},"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"continuous_usage_stats":false,"include_usage":true},"return_token_ids":true}`, IncludeUsage)
	f(`{"stream":true,"stream_options":{"continuous_usage_stats":true},"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"continuous_usage_stats":true},"return_token_ids":true}`, 0)
	f(`{"stream":true,"stream_options":{"include_usage":false},"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"include_usage":false},"return_token_ids":true}`, 0)
	f(`{"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, 0)
	f(`{"stream":true,"stream_options":{"include_usage":null},"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, IncludeUsage)
	f(`{"stream":true,"stream_options":null,"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":{"include_usage":true},"return_token_ids":true}`, IncludeUsage)
	f(`{"stream":true,"stream_options":"x","return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":true,"stream_options":"x","return_token_ids":true}`, 0)
	// Not a stream: no stream_options, even when stream is null or false.
	f(`{"stream":false,"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none, `{"stream":false,"return_token_ids":true}`, 0)
	f(`{"stream":null,"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none, `{"stream":null,"return_token_ids":true}`, 0)
	// Duplicate keys: the last one wins, as in the engines' decoders.
	f(`{"stream":false,"stream":true,"return_token_ids":true}`, openai.ChatCompletions, openai.KindVLLM, none,
		`{"stream":false,"stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`, IncludeUsage)
	// Whitespace and pretty-printed bodies.
	f("{\n  \"model\": \"m\",\n  \"stream\": true\n}\n", openai.ChatCompletions, openai.KindVLLM, none,
		"{\n  \"model\": \"m\",\n  \"stream\": true,\"return_token_ids\":true,\"stream_options\":{\"include_usage\":true}\n}\n", ReturnTokenIDs|IncludeUsage)
	f("  {\"stream\" : true , \"stream_options\" : { \"continuous_usage_stats\" : false } }  ", openai.ChatCompletions, openai.KindSGLang, none,
		"  {\"stream\" : true , \"stream_options\" : { \"continuous_usage_stats\" : false,\"include_usage\":true } }  ", IncludeUsage)
	f(`{}`, openai.ChatCompletions, openai.KindVLLM, none, `{"return_token_ids":true}`, ReturnTokenIDs)
	f(`{ }`, openai.ChatCompletions, openai.KindVLLM, none, `{"return_token_ids":true }`, ReturnTokenIDs)
	f(`{}`, openai.ChatCompletions, openai.KindVLLM, lp, `{"return_token_ids":true,"logprobs":true}`, ReturnTokenIDs|Logprobs)
	// Logprobs (opt-in).
	f(`{"model":"m"}`, openai.ChatCompletions, openai.KindVLLM, none, `{"model":"m","return_token_ids":true}`, ReturnTokenIDs)
	f(`{"model":"m"}`, openai.ChatCompletions, openai.KindVLLM, lp, `{"model":"m","return_token_ids":true,"logprobs":true}`, ReturnTokenIDs|Logprobs)
	f(`{"model":"m"}`, openai.Completions, openai.KindVLLM, lp, `{"model":"m","return_token_ids":true,"logprobs":0}`, ReturnTokenIDs|Logprobs)
	f(`{"model":"m","logprobs":null}`, openai.ChatCompletions, openai.KindVLLM, lp, `{"model":"m","logprobs":true,"return_token_ids":true}`, ReturnTokenIDs|Logprobs)
	f(`{"model":"m","logprobs":false}`, openai.ChatCompletions, openai.KindVLLM, lp, `{"model":"m","logprobs":false,"return_token_ids":true}`, ReturnTokenIDs)
	f(`{"model":"m","logprobs":2}`, openai.Completions, openai.KindVLLM, lp, `{"model":"m","logprobs":2,"return_token_ids":true}`, ReturnTokenIDs)
	f(`{"model":"m","top_logprobs":3}`, openai.ChatCompletions, openai.KindVLLM, lp, `{"model":"m","top_logprobs":3,"return_token_ids":true}`, ReturnTokenIDs)
	f(`{"model":"m","stream":true,"return_token_ids":null,"stream_options":null,"logprobs":null}`, openai.ChatCompletions, openai.KindVLLM, lp,
		`{"model":"m","stream":true,"return_token_ids":true,"stream_options":{"include_usage":true},"logprobs":true}`, ReturnTokenIDs|IncludeUsage|Logprobs)
}

func TestRewriteInfo(t *testing.T) {
	f := func(body string, ep openai.Endpoint, want Request) {
		t.Helper()
		_, info, _, err := Rewrite(nil, []byte(body), ep, openai.KindVLLM, Options{})
		if err != nil {
			t.Fatalf("Rewrite(%s): %v", body, err)
		}
		if string(info.Model) != string(want.Model) || info.Stream != want.Stream || info.N != want.N ||
			info.ReturnTokenIDs != want.ReturnTokenIDs || info.Logprobs != want.Logprobs || info.IncludeUsage != want.IncludeUsage {
			t.Fatalf("Rewrite(%s) info = %+v (model %q), want %+v (model %q)", body, info, info.Model, want, want.Model)
		}
	}
	f(`{}`, openai.ChatCompletions, Request{N: 1})
	f(`{"model":"qwen/Qwen3-8B","stream":true,"n":4}`, openai.ChatCompletions, Request{Model: []byte("qwen/Qwen3-8B"), Stream: true, N: 4})
	f(`{"model":"qwen\/Qwen3\u002d8B"}`, openai.ChatCompletions, Request{Model: []byte("qwen/Qwen3-8B"), N: 1})
	f(`{"model":null,"stream":null,"n":null}`, openai.ChatCompletions, Request{N: 1})
	f(`{"n":2.0}`, openai.ChatCompletions, Request{N: 2})
	f(`{"return_token_ids":true,"logprobs":true,"stream":true,"stream_options":{"include_usage":true}}`, openai.ChatCompletions,
		Request{ReturnTokenIDs: true, Logprobs: true, IncludeUsage: true, Stream: true, N: 1})
	f(`{"logprobs":0}`, openai.Completions, Request{Logprobs: true, N: 1})
	f(`{"logprobs":false}`, openai.ChatCompletions, Request{N: 1})
}

func TestRewriteModelAliasesBody(t *testing.T) {
	body := []byte(`{"model":"m1"}`)
	_, info, _, err := Rewrite(nil, body, openai.ChatCompletions, openai.KindVLLM, Options{})
	if err != nil {
		t.Fatal(err)
	}
	body[11] = '2'
	if string(info.Model) != "m2" {
		t.Fatalf("Model = %q, want it to alias the body", info.Model)
	}
}

func TestRewriteErrors(t *testing.T) {
	f := func(body, field, msg string) {
		t.Helper()
		dst := []byte("keep")
		out, _, inj, err := Rewrite(dst, []byte(body), openai.ChatCompletions, openai.KindVLLM, Options{})
		if err == nil {
			t.Fatalf("Rewrite(%q): no error", body)
		}
		if !errors.Is(err, ErrInvalidBody) {
			t.Fatalf("Rewrite(%q): error %v does not wrap ErrInvalidBody", body, err)
		}
		var re *RequestError
		if !errors.As(err, &re) || re.Field != field {
			t.Fatalf("Rewrite(%q): error %#v, want field %q", body, err, field)
		}
		if !strings.Contains(err.Error(), msg) {
			t.Fatalf("Rewrite(%q): error %q does not contain %q", body, err, msg)
		}
		if string(out) != "keep" || inj != 0 {
			t.Fatalf("Rewrite(%q): out %q inj %v on error", body, out, inj)
		}
	}
	f(``, "", "not valid JSON")
	f(`{"model":`, "", "not valid JSON")
	f(`{"model":"m"}}`, "", "not valid JSON")
	f(`{"a":1,}`, "", "not valid JSON")
	f(`[{"model":"m"}]`, "", "must be a JSON object")
	f(`"model"`, "", "must be a JSON object")
	f(`null`, "", "must be a JSON object")
	f(`{"model":1}`, "model", `"model" must be a string, got a number`)
	f(`{"model":["m"]}`, "model", "must be a string, got an array")
	f(`{"stream":"true"}`, "stream", `"stream" must be a boolean, got a string`)
	f(`{"stream":1}`, "stream", "must be a boolean, got a number")
	f(`{"n":"2"}`, "n", `"n" must be an integer, got a string`)
	f(`{"n":true}`, "n", "must be an integer, got a boolean")
	f(`{"n":1.5}`, "n", "must be an integer, got 1.5")
	f(`{"n":0}`, "n", "must be at least 1")
	f(`{"n":-3}`, "n", "must be at least 1")
	f(`{"n":99999999999999999999}`, "n", "must be at most")
	f(`{"n":1e99}`, "n", "must be at most")
}

func FuzzRewrite(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}`,
		`{"stream":true,"stream_options":null,"return_token_ids":null,"logprobs":null}`,
		"{\n\t\"stream\" : true }\n",
		`{}`, `[]`, `{"n":2.0}`, `{"model":"\u00e9"}`, `{"a":{"b":[1,2,{"c":"}"}]}}`,
	} {
		f.Add([]byte(s), uint8(0), uint8(0), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, ep, kind uint8, logprobs bool) {
		endpoint := openai.Endpoint(ep % 5)
		k := openai.Kind(kind % 4)
		out, info, inj, err := Rewrite(nil, body, endpoint, k, Options{Logprobs: logprobs})
		if err != nil {
			if !errors.Is(err, ErrInvalidBody) {
				t.Fatalf("error %v does not wrap ErrInvalidBody", err)
			}
			return
		}
		if !gjson.ValidBytes(out) {
			t.Fatalf("Rewrite(%q) = %q: invalid JSON", body, out)
		}
		if info.N < 1 {
			t.Fatalf("N = %d", info.N)
		}
		if inj == 0 && string(out) != string(body) {
			t.Fatalf("nothing injected but body changed: %q -> %q", body, out)
		}
		if inj != 0 && (k == openai.KindOpenAI || (endpoint != openai.ChatCompletions && endpoint != openai.Completions)) {
			t.Fatalf("injected %v towards %v %v", inj, k, endpoint)
		}
		// Injected fields carry the injected value, as the engine will read it
		// (last duplicate wins: check the last occurrence).
		last := func(key string) string {
			v := ""
			gjson.ParseBytes(out).ForEach(func(k, val gjson.Result) bool {
				if k.String() == key {
					v = val.Raw
				}
				return true
			})
			return v
		}
		if inj&ReturnTokenIDs != 0 && last("return_token_ids") != "true" {
			t.Fatalf("return_token_ids not true in %s", out)
		}
		if inj&IncludeUsage != 0 {
			so := gjson.Parse(last("stream_options"))
			v := ""
			so.ForEach(func(k, val gjson.Result) bool {
				if k.String() == "include_usage" {
					v = val.Raw
				}
				return true
			})
			if v != "true" {
				t.Fatalf("include_usage not true in %s", out)
			}
		}
		if inj&Logprobs != 0 {
			v := last("logprobs")
			llamaCmpl := k == openai.KindLlamaCpp && endpoint == openai.Completions
			if (v != "true" && v != "0" && !llamaCmpl) || (llamaCmpl && v != "1") {
				t.Fatalf("logprobs = %q in %s", v, out)
			}
			if k == openai.KindLlamaCpp && endpoint == openai.ChatCompletions && last("top_logprobs") != "1" {
				t.Fatalf("top_logprobs = %q towards llama.cpp in %s", last("top_logprobs"), out)
			}
		}
	})
}

// chatBody2K is a realistic ~2 KB agent request: system prompt, a few turns,
// one tool.
var chatBody2K = []byte(`{"model":"Qwen/Qwen3-8B","messages":[{"role":"system","content":"You are a careful software engineering agent. You can read files, run shell commands and edit code. Think step by step, keep answers short, and always call a tool when you need information you do not have. Never invent file contents."},{"role":"user","content":"The test TestParseConfig fails with 'unexpected end of JSON input'. Find the cause and fix it."},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"run","arguments":"{\"cmd\":\"go test ./config -run TestParseConfig\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"--- FAIL: TestParseConfig (0.00s)\n    config_test.go:41: unexpected end of JSON input\nFAIL\nexit status 1\nFAIL\tgithub.com/example/app/config\t0.012s"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_2","type":"function","function":{"name":"run","arguments":"{\"cmd\":\"sed -n 30,50p config/config_test.go\"}"}}]},{"role":"tool","tool_call_id":"call_2","content":"func TestParseConfig(t *testing.T) {\n\tdata, err := os.ReadFile(\"testdata/config.json\")\n\tif err != nil {\n\t\tt.Fatal(err)\n\t}\n\tvar c Config\n\tif err := json.Unmarshal(data[:len(data)-1], &c); err != nil {\n\t\tt.Fatal(err)\n\t}\n}"}],"tools":[{"type":"function","function":{"name":"run","description":"Run a shell command in the repository and return its combined output.","parameters":{"type":"object","properties":{"cmd":{"type":"string","description":"the command line"}},"required":["cmd"]}}}],"tool_choice":"auto","temperature":1.0,"top_p":1.0,"max_tokens":2048,"stream":true}`)

func BenchmarkRewrite(b *testing.B) {
	dst := make([]byte, 0, len(chatBody2K)+256)
	b.ReportAllocs()
	b.SetBytes(int64(len(chatBody2K)))
	for b.Loop() {
		out, _, _, err := Rewrite(dst[:0], chatBody2K, openai.ChatCompletions, openai.KindVLLM, Options{})
		if err != nil || len(out) == 0 {
			b.Fatal(err)
		}
	}
}

func TestRewriteAllocs(t *testing.T) {
	dst := make([]byte, 0, len(chatBody2K)+256)
	var inj Injected
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		_, _, inj, err = Rewrite(dst[:0], chatBody2K, openai.ChatCompletions, openai.KindVLLM, Options{Logprobs: true})
		if err != nil {
			t.Fatal(err)
		}
	})
	if inj != ReturnTokenIDs|IncludeUsage|Logprobs {
		t.Fatalf("injected %v", inj)
	}
	if allocs != 0 {
		t.Fatalf("Rewrite allocates %v times per call, want 0", allocs)
	}
}

// TestInspect: one validation and the model, as Rewrite reads it.
func TestInspect(t *testing.T) {
	for _, c := range []struct {
		body, model string
		object      bool
	}{
		{`{"model":"m","messages":[]}`, `"m"`, true},
		{`{"messages":[{"content":"model"}],"model":"last"}`, `"last"`, true},
		{`{"model":"a","model":"b"}`, `"b"`, true},
		{`{"model":7}`, `7`, true},
		{`{"mod\u0065l":"x"}`, ``, true},
		{` {"model":"m"} `, `"m"`, true},
		{`{"messages":[]}`, ``, true},
		{`[{"model":"m"}]`, ``, false},
		{`{"model":"m"`, ``, false},
		{`{"model":"m"}x`, ``, false},
		{``, ``, false},
	} {
		model, err := Inspect([]byte(c.body))
		if object := err == nil; string(model) != c.model || object != c.object {
			t.Errorf("Inspect(%s) = %q, %v; want %q, %v", c.body, model, object, c.model, c.object)
		}
	}
}

// FuzzInspect: Inspect accepts exactly the valid JSON objects, finds the
// "model" Rewrite reads, and Rewrite told the body was validated gives the
// same result as Rewrite validating it.
func FuzzInspect(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, `{"messages":[],"model":"z","stream":true}`,
		`{"model":"a","model":"b","n":2}`, `[]`, `{"model":"m"`, `{"model":"\u00e9"}`, ` {} `,
	} {
		f.Add([]byte(s), uint8(0), uint8(1))
	}
	f.Fuzz(func(t *testing.T, body []byte, ep, kind uint8) {
		model, err := Inspect(body)
		object := err == nil
		// Too deep is refused before anything else looks (and only then).
		if tooDeep := errors.Is(err, jsonscan.ErrTooDeep); tooDeep != errors.Is(jsonscan.Validate(body), jsonscan.ErrTooDeep) {
			t.Fatalf("Inspect(%q): %v, but jsonscan.Validate: %v", body, err, jsonscan.Validate(body))
		} else if tooDeep {
			return
		}
		trimmed := bytes.TrimLeft(body, " \t\r\n")
		if want := gjson.ValidBytes(body) && len(trimmed) > 0 && trimmed[0] == '{'; object != want {
			t.Fatalf("Inspect(%q): object %v, want %v", body, object, want)
		}
		if !object {
			return
		}
		endpoint, k := openai.Endpoint(ep%5), openai.Kind(kind%4)
		out1, info1, inj1, err1 := Rewrite(nil, body, endpoint, k, Options{})
		out2, info2, inj2, err2 := Rewrite(nil, body, endpoint, k, Options{Validated: true})
		if string(out1) != string(out2) || inj1 != inj2 || (err1 == nil) != (err2 == nil) ||
			string(info1.Model) != string(info2.Model) || info1.N != info2.N || info1.Stream != info2.Stream {
			t.Fatalf("Rewrite(%q) differs with Validated: %q %v %v / %q %v %v", body, out1, inj1, err1, out2, inj2, err2)
		}
		if err1 == nil && len(model) > 0 && model[0] == '"' && bytes.IndexByte(model, '\\') < 0 &&
			string(model[1:len(model)-1]) != string(info1.Model) {
			t.Fatalf("Inspect model %s, Rewrite model %q", model, info1.Model)
		}
	})
}

// TestInspectTooDeep: a body nested deeper than jsonscan.MaxDepth is refused
// with jsonscan.ErrTooDeep before any recursive parser sees it (issue 36: 5
// million '[' overflowed gjson.Valid's stack and killed the gateway), and
// Rewrite validating a body itself refuses it the same way.
func TestInspectTooDeep(t *testing.T) {
	deep := []byte(`{"model":"m","x":` + strings.Repeat("[", 10<<20))
	if model, err := Inspect(deep); !errors.Is(err, jsonscan.ErrTooDeep) || model != nil {
		t.Fatalf("Inspect(deep) = %q, %v; want nil, ErrTooDeep", model, err)
	}
	atLimit := []byte(`{"model":"m","x":` + strings.Repeat("[", jsonscan.MaxDepth-1) + strings.Repeat("]", jsonscan.MaxDepth-1) + `}`)
	if model, err := Inspect(atLimit); err != nil || string(model) != `"m"` {
		t.Fatalf("Inspect(at the limit) = %q, %v; want \"m\", nil", model, err)
	}
	_, _, _, err := Rewrite(nil, deep, openai.ChatCompletions, openai.KindVLLM, Options{})
	if !errors.Is(err, ErrInvalidBody) || !strings.Contains(err.Error(), "512") {
		t.Fatalf("Rewrite(deep): %v; want a RequestError naming the limit", err)
	}
}
