package mock

import (
	"flag"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestFlavorConfig(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-flavor", "sglang"}); err != nil || c.Flavor != FlavorSGLang {
		t.Fatalf("-flavor sglang: %v %q", err, c.Flavor)
	}
	fs = flag.NewFlagSet("mock", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-flavor", "tgi"}); err == nil || !strings.Contains(err.Error(), "vllm, sglang or llamacpp") {
		t.Fatalf("bad flavor accepted: %v", err)
	}
	if f, err := ParseFlavor(""); err != nil || f != FlavorVLLM {
		t.Fatalf("default flavor %q %v", f, err)
	}
	if New(Config{}).Config().Flavor != FlavorVLLM {
		t.Fatal("default flavor is not vllm")
	}
	if _, _, err := Start(Config{Flavor: "tgi"}); err == nil {
		t.Fatal("Start accepted an unknown flavor")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("New accepted an unknown flavor")
		}
	}()
	New(Config{Flavor: "tgi"})
}

func TestVLLMFlavorHasNoLlamaCppRoutes(t *testing.T) {
	_, base := startT(t, Config{})
	root := strings.TrimSuffix(base, "/v1")
	for _, r := range []resp{post(t, root+"/apply-template", `{"messages":[]}`), do(t, http.MethodGet, root+"/props", "")} {
		if r.status != 404 || gjson.GetBytes(r.body, "error.code").Int() != 404 {
			t.Fatalf("vllm answered a llama.cpp route: %d %s", r.status, r.body)
		}
	}
}

func TestSGLangChat(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorSGLang})
	promptIDs := Encode(RenderChat([]byte(gjson.Get(chatBody, "messages").Raw), nil, true))

	plain := mustOK(t, post(t, base+"/chat/completions", chatBody))
	id := plain.Get("id").Str
	content := plain.Get("choices.0.message.content").Str
	want := `{"id":"` + id + `","object":"chat.completion","created":1700000000,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"` + content +
		`","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":258}],"usage":{"prompt_tokens":` + strconv.Itoa(len(promptIDs)) +
		`,"total_tokens":` + strconv.Itoa(len(promptIDs)+16) + `,"completion_tokens":16,"prompt_tokens_details":null,"reasoning_tokens":0},"metadata":null}`
	if plain.Raw != want || len(id) != 32 {
		t.Fatalf("body\n%s\nwant\n%s", plain.Raw, want)
	}

	// return_token_ids: both lists on every choice, nothing at the top level.
	j := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "return_token_ids", true, "n", 3)))
	if j.Get("prompt_token_ids").Exists() || j.Get("choices.0.message.content").Str != content {
		t.Fatalf("top-level ids or other text: %s", j.Raw)
	}
	total := 0
	for i := 0; i < 3; i++ {
		c := j.Get("choices." + strconv.Itoa(i))
		if !eqIDs(ids(c.Get("prompt_token_ids")), promptIDs) {
			t.Fatalf("choice %d prompt ids %s", i, c.Get("prompt_token_ids").Raw)
		}
		tok := ids(c.Get("token_ids"))
		if Decode(tok) != c.Get("message.content").Str {
			t.Fatalf("choice %d ids decode to %q", i, Decode(tok))
		}
		if !strings.HasSuffix(c.Raw, `"finish_reason":"stop","matched_stop":258,"prompt_token_ids":`+c.Get("prompt_token_ids").Raw+`,"token_ids":`+c.Get("token_ids").Raw+`}`) {
			t.Fatalf("choice %d key order: %s", i, c.Raw)
		}
		total += len(tok)
	}
	if int64(total) != j.Get("usage.completion_tokens").Int() || int64(len(promptIDs)) != j.Get("usage.prompt_tokens").Int() {
		t.Fatalf("ids %d vs usage %s", total, j.Get("usage").Raw)
	}

	// Logprobs: the OpenAI shape with SGLang's key order; a cut answer has matched_stop null.
	lp := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "logprobs", true, "top_logprobs", 2, "max_tokens", 2)))
	e := lp.Get("choices.0.logprobs.content.0")
	if !strings.HasPrefix(e.Raw, `{"token":`) || !strings.Contains(e.Raw, `,"bytes":[`) || !strings.Contains(e.Raw, `],"logprob":`) ||
		len(e.Get("top_logprobs").Array()) != 2 || e.Get("id").Exists() || len(lp.Get("choices.0.logprobs.content").Array()) != 2 {
		t.Fatalf("logprobs %s", lp.Get("choices.0.logprobs").Raw)
	}
	if lp.Get("choices.0.finish_reason").Str != "length" || lp.Get("choices.0.matched_stop").Type != gjson.Null {
		t.Fatalf("length: %s", lp.Raw)
	}

	// Tools: an SGLang tool call.
	tj := mustOK(t, post(t, base+"/chat/completions", inject(t, toolsReq, "return_token_ids", true)))
	tc := tj.Get("choices.0.message.tool_calls.0")
	if tj.Get("choices.0.finish_reason").Str != "tool_calls" || tj.Get("choices.0.matched_stop").Type != gjson.Null ||
		!strings.HasPrefix(tc.Get("id").Str, "call_") || len(tc.Get("id").Str) != 29 || tc.Get("index").Int() != 0 ||
		!strings.Contains(Decode(ids(tj.Get("choices.0.token_ids"))), tc.Get("function.arguments").Str) {
		t.Fatalf("tool call %s", tj.Raw)
	}
}

func TestSGLangStreamChat(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorSGLang})
	// With return_token_ids: rejected, in SGLang's flat error shape.
	r := post(t, base+"/chat/completions", inject(t, chatBody, "stream", true, "return_token_ids", true))
	want := `{"object":"error","message":"` + sglangStreamIDsError + `","type":"BadRequestError","param":null,"code":400}`
	if r.status != 400 || string(r.body) != want {
		t.Fatalf("stream with ids: %d %s", r.status, r.body)
	}
	// An old SGLang that ignores the field streams without ids.
	_, old := startT(t, Config{Flavor: FlavorSGLang, IgnoreReturnTokenIDs: true})
	r = post(t, old+"/chat/completions", inject(t, chatBody, "stream", true, "return_token_ids", true))
	if r.status != 200 || strings.Contains(string(r.body), "token_ids") {
		t.Fatalf("ignored flag: %d %s", r.status, r.body)
	}

	// Without ids: exact chunks.
	r = post(t, base+"/chat/completions", inject(t, chatBody, "stream", true, "stream_options.include_usage", true), "x-mock-tokens", "2")
	evs := parseSSE(t, r.body)
	if len(evs) != 6 {
		t.Fatalf("%d events: %s", len(evs), r.body)
	}
	id := gjson.Get(evs[0].data, "id").Str
	pre := `{"id":"` + id + `","object":"chat.completion.chunk","created":1700000000,"model":"m1","choices":[`
	w1, w2 := gjson.Get(evs[1].data, "choices.0.delta.content").Raw, gjson.Get(evs[2].data, "choices.0.delta.content").Raw
	p := len(Encode(RenderChat([]byte(gjson.Get(chatBody, "messages").Raw), nil, true)))
	wantEvs := []string{
		pre + `{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`,
		pre + `{"index":0,"delta":{"role":null,"content":` + w1 + `,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`,
		pre + `{"index":0,"delta":{"role":null,"content":` + w2 + `,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}`,
		pre + `{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":258}],"usage":null}`,
		pre + `],"usage":{"prompt_tokens":` + strconv.Itoa(p) + `,"total_tokens":` + strconv.Itoa(p+2) + `,"completion_tokens":2,"prompt_tokens_details":null,"reasoning_tokens":0}}`,
		"[DONE]",
	}
	for i := range wantEvs {
		if evs[i].data != wantEvs[i] {
			t.Fatalf("event %d\n%s\nwant\n%s", i, evs[i].data, wantEvs[i])
		}
	}

	// n=2 with tools and logprobs: streamed text and arguments match the full answer.
	body := inject(t, toolsReq, "n", 2, "logprobs", true)
	full := mustOK(t, post(t, base+"/chat/completions", body))
	sc := collectChat(t, parseSSE(t, post(t, base+"/chat/completions", inject(t, body, "stream", true)).body))
	for i := 0; i < 2; i++ {
		c := full.Get("choices." + strconv.Itoa(i))
		if sc.args[i] != c.Get("message.tool_calls.0.function.arguments").Str || sc.finish[i] != "tool_calls" ||
			sc.lpCount[i] != len(c.Get("logprobs.content").Array()) {
			t.Fatalf("choice %d: args %q finish %q logprobs %d", i, sc.args[i], sc.finish[i], sc.lpCount[i])
		}
	}
}

func TestSGLangCompletions(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorSGLang})
	body := `{"model":"m1","prompt":["a b","the cat"],"n":2,"max_tokens":4,"return_token_ids":true,"logprobs":1}`
	m := mustOK(t, post(t, base+"/completions", body))
	ch := m.Get("choices").Array()
	if len(ch) != 4 || m.Get("object").Str != "text_completion" || len(m.Get("id").Str) != 32 || m.Get("metadata").Type != gjson.Null {
		t.Fatalf("completions %s", m.Raw)
	}
	prompts := [][]uint32{Encode("a b"), Encode("the cat")}
	total := 0
	for i, c := range ch {
		if !eqIDs(ids(c.Get("prompt_token_ids")), prompts[i/2]) || Decode(ids(c.Get("token_ids"))) != c.Get("text").Str {
			t.Fatalf("choice %d: %s", i, c.Raw)
		}
		if !strings.HasPrefix(c.Get("logprobs").Raw, `{"text_offset":[0,`) || !strings.Contains(c.Raw, `"finish_reason":"length","matched_stop":null,"token_ids":[`) {
			t.Fatalf("choice %d shape: %s", i, c.Raw)
		}
		total += len(c.Get("token_ids").Array())
	}
	if int64(total) != m.Get("usage.completion_tokens").Int() || m.Get("usage.prompt_tokens").Int() != int64(len(prompts[0])+len(prompts[1])) {
		t.Fatalf("usage %s", m.Get("usage").Raw)
	}

	// Streamed: ids per chunk, prompt ids on each choice's first chunk only.
	r := post(t, base+"/completions", inject(t, body, "stream", true, "stream_options.include_usage", true))
	text, got, firsts := map[int]string{}, map[int][]uint32{}, map[int]int{}
	var usage gjson.Result
	for _, ev := range parseSSE(t, r.body) {
		if ev.data == "[DONE]" {
			continue
		}
		e := gjson.Parse(ev.data)
		if len(e.Get("choices").Array()) == 0 {
			usage = e.Get("usage")
			continue
		}
		c := e.Get("choices.0")
		i := int(c.Get("index").Int())
		if pt := c.Get("prompt_token_ids"); pt.Exists() {
			firsts[i]++
			if !eqIDs(ids(pt), prompts[i/2]) || text[i] != "" {
				t.Fatalf("prompt ids %s on a later chunk or wrong", ev.data)
			}
		}
		text[i] += c.Get("text").Str
		got[i] = append(got[i], ids(c.Get("token_ids"))...)
	}
	for i, c := range ch {
		if firsts[i] != 1 || text[i] != c.Get("text").Str || !eqIDs(got[i], ids(c.Get("token_ids"))) {
			t.Fatalf("stream choice %d: %d %q %v", i, firsts[i], text[i], got[i])
		}
	}
	if usage.Raw != m.Get("usage").Raw {
		t.Fatalf("stream usage %s vs %s", usage.Raw, m.Get("usage").Raw)
	}
}

func TestSGLangRoutes(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorSGLang, Model: "a", ExtraModels: []string{"b"}})
	root := strings.TrimSuffix(base, "/v1")
	m := do(t, http.MethodGet, base+"/models", "")
	if string(m.body) != `{"object":"list","data":[{"id":"a","object":"model","created":1700000000,"owned_by":"sglang","root":"a","parent":null,"max_model_len":32768},`+
		`{"id":"b","object":"model","created":1700000000,"owned_by":"sglang","root":"b","parent":null,"max_model_len":32768}]}` {
		t.Fatalf("models %s", m.body)
	}
	f := func(method, url, body string, status int, wantBody string) {
		t.Helper()
		r := do(t, method, url, body)
		if r.status != status || (wantBody != "" && string(r.body) != wantBody) {
			t.Fatalf("%s %s %s: %d %s", method, url, body, r.status, r.body)
		}
		if status != 200 {
			e := gjson.ParseBytes(r.body)
			if e.Get("object").Str != "error" || e.Get("code").Int() != int64(status) || e.Get("message").Str == "" || e.Get("error").Exists() {
				t.Fatalf("not a flat SGLang error: %s", r.body)
			}
		}
	}
	f("GET", root+"/version", "", 404, `{"object":"error","message":"Not Found","type":"NotFoundError","param":null,"code":404}`)
	f("GET", root+"/props", "", 404, "")
	f("POST", root+"/sleep", "", 404, "")
	f("POST", base+"/chat/completions", `{"messages":[]}`, 400, "")
	f("POST", root+"/tokenize", `{"prompt":"hello the world"}`, 200, `{"tokens":`+jsonIDs(Encode("hello the world"))+`,"count":7,"max_model_len":32768}`)
	f("POST", root+"/tokenize", `{"prompt":["a b","c"]}`, 200, `{"tokens":[[97,32,98],[99]],"count":[3,1],"max_model_len":32768}`)
	f("POST", root+"/tokenize", `{}`, 400, "")
	f("POST", root+"/tokenize", `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`, 400, "")
	msgs := `[{"role":"user","content":"hi"}]`
	f("POST", root+"/tokenize", `{"messages":`+msgs+`}`, 200, `{"tokens":`+jsonIDs(Encode(RenderChat([]byte(msgs), nil, true)))+`,"count":10,"max_model_len":32768}`)
	f("POST", root+"/detokenize", `{"tokens":`+jsonIDs(Encode("hello the world"))+`}`, 200, `{"text":"hello the world"}`)
	f("GET", root+"/health", "", 200, "")
}

// wantTimings is llama.cpp's "timings" member (with the leading comma) for a mock
// without latency knobs: cache and prompt tokens, predicted tokens, zero times.
func wantTimings(cache, prompt, predicted int) string {
	return `,"timings":{"cache_n":` + strconv.Itoa(cache) + `,"prompt_n":` + strconv.Itoa(prompt) +
		`,"prompt_ms":0.0,"prompt_per_token_ms":0.0,"prompt_per_second":0.0,"predicted_n":` + strconv.Itoa(predicted) +
		`,"predicted_ms":0.0,"predicted_per_token_ms":0.0,"predicted_per_second":0.0}`
}

// jsonIDs renders ids as a JSON list.
func jsonIDs(v []uint32) string { return string(appendIDs(nil, v)) }

func TestLlamaCppChat(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorLlamaCpp})
	root := strings.TrimSuffix(base, "/v1")
	p := len(Encode(RenderChat([]byte(gjson.Get(chatBody, "messages").Raw), nil, true)))

	// return_token_ids is ignored: the answer is the plain one, byte for byte.
	plain := post(t, base+"/chat/completions", chatBody)
	withIDs := post(t, base+"/chat/completions", inject(t, chatBody, "return_token_ids", true))
	if string(plain.body) != string(withIDs.body) || strings.Contains(string(plain.body), "token_ids") {
		t.Fatalf("return_token_ids changed the answer:\n%s\n%s", plain.body, withIDs.body)
	}
	j := mustOK(t, plain)
	content := j.Get("choices.0.message.content").Str
	want := `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"` + content + `"}}],"created":1700000000,"model":"m1",` +
		`"system_fingerprint":"` + llamaCppBuildInfo + `","object":"chat.completion","usage":{"completion_tokens":16,"prompt_tokens":` + strconv.Itoa(p) +
		`,"total_tokens":` + strconv.Itoa(p+16) + `,"prompt_tokens_details":{"cached_tokens":0}},"id":"` + j.Get("id").Str + `"` + wantTimings(0, p, 16) + `}`
	if j.Raw != want || !strings.HasPrefix(j.Get("id").Str, "chatcmpl-") {
		t.Fatalf("body\n%s\nwant\n%s", j.Raw, want)
	}

	// logprobs: an "id" on every entry; the ids are the output: count = completion_tokens,
	// /detokenize gives the content.
	body := inject(t, chatBody, "logprobs", true, "top_logprobs", 2, "n", 2, "return_token_ids", true)
	lj := mustOK(t, post(t, base+"/chat/completions", body))
	full := map[int][]uint32{}
	total := 0
	for i := 0; i < 2; i++ {
		c := lj.Get("choices." + strconv.Itoa(i))
		for _, e := range c.Get("logprobs.content").Array() {
			if !strings.HasPrefix(e.Raw, `{"id":`+e.Get("id").Raw+`,"token":`) || len(e.Get("top_logprobs").Array()) != 2 ||
				e.Get("top_logprobs.0.id").Int() != e.Get("id").Int() || e.Get("token").Str != TokenString(uint32(e.Get("id").Int())) {
				t.Fatalf("entry %s", e.Raw)
			}
			full[i] = append(full[i], uint32(e.Get("id").Int()))
		}
		d := mustOK(t, post(t, root+"/detokenize", `{"tokens":`+jsonIDs(full[i])+`}`))
		if d.Raw != `{"content":`+strconv.Quote(c.Get("message.content").Str)+`}` {
			t.Fatalf("detokenize %s vs %q", d.Raw, c.Get("message.content").Str)
		}
		total += len(full[i])
	}
	if int64(total) != lj.Get("usage.completion_tokens").Int() || strings.Contains(lj.Raw, "token_ids") {
		t.Fatalf("logprob ids %d vs usage %s", total, lj.Get("usage").Raw)
	}

	// Streamed: the same ids, one chunk per token, role chunk first, usage last.
	r := post(t, base+"/chat/completions", inject(t, body, "stream", true, "stream_options.include_usage", true))
	evs := parseSSE(t, r.body)
	streamed := map[int][]uint32{}
	text := map[int]string{}
	var usage gjson.Result
	for n, ev := range evs {
		if ev.data == "[DONE]" {
			continue
		}
		e := gjson.Parse(ev.data)
		if !strings.HasPrefix(ev.data, `{"choices":[`) || !strings.HasSuffix(ev.data, `"system_fingerprint":"`+llamaCppBuildInfo+`","object":"chat.completion.chunk"}`) &&
			!e.Get("usage").Exists() || strings.Contains(ev.data, "token_ids") {
			t.Fatalf("chunk %s", ev.data)
		}
		if len(e.Get("choices").Array()) == 0 {
			usage = e.Get("usage")
			continue
		}
		c := e.Get("choices.0")
		i := int(c.Get("index").Int())
		if n < 2 && c.Get("delta").Raw != `{"role":"assistant","content":null}` {
			t.Fatalf("role chunk %s", ev.data)
		}
		text[i] += c.Get("delta.content").Str
		for _, x := range c.Get("logprobs.content").Array() {
			streamed[i] = append(streamed[i], uint32(x.Get("id").Int()))
		}
	}
	for i := 0; i < 2; i++ {
		if !eqIDs(streamed[i], full[i]) || text[i] != lj.Get("choices."+strconv.Itoa(i)+".message.content").Str {
			t.Fatalf("stream choice %d: %v vs %v", i, streamed[i], full[i])
		}
	}
	if usage.Raw != lj.Get("usage").Raw {
		t.Fatalf("stream usage %s vs %s", usage.Raw, lj.Get("usage").Raw)
	}

	// Tool calls: the logprob ids cover the call too.
	tj := mustOK(t, post(t, base+"/chat/completions", inject(t, toolsReq, "logprobs", true)))
	if tj.Get("choices.0.finish_reason").Str != "tool_calls" || tj.Get("choices.0.message.tool_calls.0.function.name").Str != "get_weather" ||
		int64(len(tj.Get("choices.0.logprobs.content").Array())) != tj.Get("usage.completion_tokens").Int() {
		t.Fatalf("tool call %s", tj.Raw)
	}
	// Streamed with tools, llama.cpp refuses logprobs (server-common.cpp
	// oaicompat_chat_params_parse); without them the same call streams.
	r = post(t, base+"/chat/completions", inject(t, toolsReq, "logprobs", true, "stream", true))
	if r.status != 400 || gjson.GetBytes(r.body, "error.message").Str != llamaCppToolsStreamLogprobs {
		t.Fatalf("streamed tool call with logprobs: %d %s", r.status, r.body)
	}
	sc := collectChat(t, parseSSE(t, post(t, base+"/chat/completions", inject(t, toolsReq, "stream", true)).body))
	if sc.args[0] != tj.Get("choices.0.message.tool_calls.0.function.arguments").Str || sc.lpCount[0] != 0 {
		t.Fatalf("streamed tool call %q, %d logprobs", sc.args[0], sc.lpCount[0])
	}
	// An empty tools list is no tools; top_logprobs needs logprobs; logprobs
	// alone gives 20 alternatives per token.
	if r := post(t, base+"/chat/completions", inject(t, chatBody, "logprobs", true, "stream", true, "tools", []any{})); r.status != 200 {
		t.Fatalf("empty tools: %d %s", r.status, r.body)
	}
	if r := post(t, base+"/chat/completions", inject(t, chatBody, "top_logprobs", 0)); r.status != 400 ||
		gjson.GetBytes(r.body, "error.message").Str != llamaCppTopLogprobsAlone {
		t.Fatalf("top_logprobs alone: %d %s", r.status, r.body)
	}
	dj := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "logprobs", true)))
	for _, e := range dj.Get("choices.0.logprobs.content").Array() {
		if n := len(e.Get("top_logprobs").Array()); n != llamaCppDefaultNProbs {
			t.Fatalf("default top_logprobs: %d alternatives in %s", n, e.Raw)
		}
	}
}

func TestLlamaCppPromptIDsConsistent(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorLlamaCpp})
	root := strings.TrimSuffix(base, "/v1")
	for _, req := range []string{chatBody, inject(t, toolsReq, "tool_choice", "none")} {
		j := mustOK(t, post(t, base+"/chat/completions", req))
		msgs, tools := gjson.Get(req, "messages").Raw, gjson.Get(req, "tools").Raw
		tb := `{"messages":` + msgs
		if tools != "" {
			tb += `,"tools":` + tools
		}
		at := mustOK(t, post(t, root+"/apply-template", tb+`}`))
		prompt := at.Get("prompt").Str
		if at.Raw != `{"prompt":`+string(appendJSONString(nil, prompt))+`}` || prompt != RenderChat([]byte(msgs), []byte(tools), true) {
			t.Fatalf("apply-template %s", at.Raw)
		}
		tk := mustOK(t, post(t, root+"/tokenize", `{"content":`+string(appendJSONString(nil, prompt))+`,"add_special":true,"parse_special":true}`))
		if !strings.HasPrefix(tk.Raw, `{"tokens":[`) || int64(len(tk.Get("tokens").Array())) != j.Get("usage.prompt_tokens").Int() ||
			!eqIDs(ids(tk.Get("tokens")), Encode(prompt)) {
			t.Fatalf("tokenize %s vs prompt_tokens %d", tk.Raw, j.Get("usage.prompt_tokens").Int())
		}
	}
	// with_pieces and parse_special: false.
	tk := mustOK(t, post(t, root+"/tokenize", "{\"content\":\"<|im_end|> the\xff\",\"with_pieces\":true}"))
	if tk.Raw != `{"tokens":[{"id":258,"piece":"<|im_end|>"},{"id":`+strconv.Itoa(int(genWords[0]))+`,"piece":" the"},{"id":255,"piece":[255]}]}` {
		t.Fatalf("with_pieces %s", tk.Raw)
	}
	tk = mustOK(t, post(t, root+"/tokenize", `{"content":"<|im_end|>","parse_special":false}`))
	if got := ids(tk.Get("tokens")); Decode(got) != "<|im_end|>" || len(got) < 2 {
		t.Fatalf("parse_special false: %s", tk.Raw)
	}
	for _, b := range []string{`{}`, `{"content":1}`, `{"content":"x","with_pieces":"yes"}`} {
		if r := post(t, root+"/tokenize", b); r.status != 400 {
			t.Fatalf("tokenize %s: %d", b, r.status)
		}
	}
	if r := post(t, root+"/apply-template", `{"messages":"hi"}`); r.status != 400 {
		t.Fatalf("apply-template bad messages: %d", r.status)
	}
}

func TestLlamaCppCompletionsAndRoutes(t *testing.T) {
	_, base := startT(t, Config{Flavor: FlavorLlamaCpp})
	root := strings.TrimSuffix(base, "/v1")
	body := `{"model":"m1","prompt":"hello the world","max_tokens":4,"logprobs":1,"return_token_ids":true}`
	j := mustOK(t, post(t, base+"/completions", body))
	c := j.Get("choices.0")
	var got []uint32
	for _, e := range c.Get("logprobs.content").Array() {
		got = append(got, uint32(e.Get("id").Int()))
	}
	if !strings.HasPrefix(c.Raw, `{"text":`) || Decode(got) != c.Get("text").Str || len(got) != 4 || strings.Contains(j.Raw, "token_ids") ||
		!strings.HasSuffix(j.Raw, `"object":"text_completion","usage":{"completion_tokens":4,"prompt_tokens":`+strconv.Itoa(len(Encode("hello the world")))+
			`,"total_tokens":`+strconv.Itoa(len(Encode("hello the world"))+4)+`,"prompt_tokens_details":{"cached_tokens":0}},"id":"`+j.Get("id").Str+`"`+
			wantTimings(0, len(Encode("hello the world")), 4)+`}`) {
		t.Fatalf("completion %s", j.Raw)
	}
	text := ""
	for _, ev := range parseSSE(t, post(t, base+"/completions", inject(t, body, "stream", true)).body) {
		text += gjson.Get(ev.data, "choices.0.text").Str
	}
	if text != c.Get("text").Str {
		t.Fatalf("streamed %q vs %q", text, c.Get("text").Str)
	}

	if h := do(t, http.MethodGet, root+"/health", ""); h.status != 200 || string(h.body) != `{"status":"ok"}` {
		t.Fatalf("health %d %s", h.status, h.body)
	}
	pr := mustOK(t, do(t, http.MethodGet, root+"/props", ""))
	if pr.Get("default_generation_settings.n_ctx").Int() != DefaultMaxModelLen || pr.Get("total_slots").Int() != 1 || pr.Get("chat_template").Str == "" {
		t.Fatalf("props %s", pr.Raw)
	}
	m := mustOK(t, do(t, http.MethodGet, base+"/models", ""))
	if m.Get("data.0.owned_by").Str != "llamacpp" || m.Get("data.0.id").Str != DefaultModel || m.Get("data.0.meta.n_vocab").Int() != int64(VocabSize()) {
		t.Fatalf("models %s", m.Raw)
	}
	for _, r := range []resp{do(t, http.MethodGet, root+"/version", ""), post(t, base+"/chat/completions", `{"messages":[]}`)} {
		e := gjson.ParseBytes(r.body)
		if e.Get("error.code").Int() != int64(r.status) || e.Get("error.message").Str == "" || e.Get("error.param").Exists() ||
			(r.status == 404) != (e.Get("error.type").Str == "not_found_error") || (r.status == 400) != (e.Get("error.type").Str == "invalid_request_error") {
			t.Fatalf("llama.cpp error %d %s", r.status, r.body)
		}
	}
}

// TestFlavorsSameText: the flavours change the wire, not the generated text or usage.
func TestFlavorsSameText(t *testing.T) {
	var texts []string
	for _, fl := range Flavors {
		_, base := startT(t, Config{Flavor: fl})
		j := mustOK(t, post(t, base+"/chat/completions", chatBody))
		texts = append(texts, j.Get("choices.0.message.content").Str+"|"+j.Get("usage.prompt_tokens").Raw+"|"+j.Get("usage.completion_tokens").Raw)
	}
	if texts[0] != texts[1] || texts[0] != texts[2] {
		t.Fatalf("flavours differ: %q", texts)
	}
}
