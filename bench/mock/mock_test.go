package mock

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

const chatBody = `{"model":"m1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hello there, how are you?"}]}`

func inject(t *testing.T, body string, kv ...any) string {
	t.Helper()
	for i := 0; i+1 < len(kv); i += 2 {
		var err error
		body, err = sjson.Set(body, kv[i].(string), kv[i+1])
		if err != nil {
			t.Fatal(err)
		}
	}
	return body
}

func TestTokenizerRoundTrip(t *testing.T) {
	f := func(s string) {
		t.Helper()
		if got := Decode(Encode(s)); got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	}
	f("")
	f("hello world")
	f(" the quick brown fox")
	f("<|im_start|>user\nHi<|im_end|>\n")
	f("\xff\xfe invalid utf8 \x80")
	f("héllo wörld 日本語")
	f(`{"name":"f","arguments":{"a":1}}`)
}

func TestTokenizerStableIDs(t *testing.T) {
	got := Encode("<|im_start|>user\n the fox")
	user := uint32(256 + len(specialTokens)) // "system" is the first piece, "user" the second
	want := []uint32{TokenIMStart, user + 1, '\n', genWords[0], 0}
	// " the" is the first generation word; " fox" is looked up.
	for i, w := range genWordList {
		if w == "fox" {
			want[4] = genBase + uint32(i)
		}
	}
	if !eqIDs(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	if TokenString(TokenToolCall) != "<tool_call>" || TokenString(uint32(VocabSize())) != "" {
		t.Fatalf("TokenString wrong")
	}
	if VocabSize() < 500 {
		t.Fatalf("vocabulary too small: %d", VocabSize())
	}
}

func FuzzEncodeDecode(f *testing.F) {
	f.Add("hello the world")
	f.Add("<|im_end|>\xff")
	f.Fuzz(func(t *testing.T, s string) {
		if Decode(Encode(s)) != s {
			t.Fatalf("round trip failed for %q", s)
		}
	})
}

func TestRenderChat(t *testing.T) {
	got := RenderChat([]byte(`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"f","arguments":"{\"k\":1}"}}]},
		{"role":"tool","tool_call_id":"x","content":"42"}]`),
		[]byte(`[ {"type": "function", "function": {"name": "f"}} ]`), true)
	want := "<|im_start|>system\nTools<tools>{\"type\":\"function\",\"function\":{\"name\":\"f\"}}</tools><|im_end|>\n" +
		"<|im_start|>user\nab<|im_end|>\n" +
		"<|im_start|>assistant\n<tool_call>{\"name\":\"f\",\"arguments\":{\"k\":1}}</tool_call><|im_end|>\n" +
		"<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Fatalf("RenderChat =\n%q\nwant\n%q", got, want)
	}
}

func TestChatNonStreamShape(t *testing.T) {
	_, base := startT(t, Config{})
	r := post(t, base+"/chat/completions", chatBody)
	j := mustOK(t, r)
	body := string(r.body)
	id := j.Get("id").Str
	if !strings.HasPrefix(id, "chatcmpl-") || len(id) != len("chatcmpl-")+32 {
		t.Fatalf("id %q", id)
	}
	content := j.Get("choices.0.message.content").Str
	// vLLM 0.32.0's members and order: every unset member null, no
	// tool_calls on a text answer (TestMockMatchesRealVLLM).
	wantPrefix := `{"id":"` + id + `","object":"chat.completion","created":1700000000,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"` + content +
		`","refusal":null,"annotations":null,"audio":null,"function_call":null,"reasoning":null},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null,"routed_experts":null}],` +
		`"service_tier":null,"system_fingerprint":"vllm-0.10.2-mock","usage":{"prompt_tokens":`
	if !strings.HasPrefix(body, wantPrefix) {
		t.Fatalf("body\n%s\nwant prefix\n%s", body, wantPrefix)
	}
	if !strings.HasSuffix(body, `},"prompt_logprobs":null,"prompt_token_ids":null,"prompt_text":null,"kv_transfer_params":null,"ec_transfer_params":null,"metrics":null}`) {
		t.Fatalf("body suffix: %s", body)
	}
	p := len(Encode(RenderChat([]byte(gjson.Get(chatBody, "messages").Raw), nil, true)))
	wantUsage := `"usage":{"prompt_tokens":` + strconv.Itoa(p) + `,"total_tokens":` + strconv.Itoa(p+16) + `,"completion_tokens":16,"prompt_tokens_details":null,"completion_tokens_details":null}`
	if !strings.Contains(body, wantUsage) {
		t.Fatalf("usage: %s, want %s", body, wantUsage)
	}
	if len(Encode(content)) == 0 || !strings.HasPrefix(content, " ") {
		t.Fatalf("content %q", content)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}
}

func TestChatReturnTokenIDs(t *testing.T) {
	_, base := startT(t, Config{})
	plain := mustOK(t, post(t, base+"/chat/completions", chatBody))
	j := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "return_token_ids", true)))
	if j.Get("id").Str != plain.Get("id").Str || j.Get("choices.0.message.content").Str != plain.Get("choices.0.message.content").Str {
		t.Fatalf("return_token_ids changed the answer")
	}
	tok := ids(j.Get("choices.0.token_ids"))
	if Decode(tok) != j.Get("choices.0.message.content").Str {
		t.Fatalf("token_ids decode to %q", Decode(tok))
	}
	if int64(len(tok)) != j.Get("usage.completion_tokens").Int() {
		t.Fatalf("completion ids %d vs usage %d", len(tok), j.Get("usage.completion_tokens").Int())
	}
	pids := ids(j.Get("prompt_token_ids"))
	if int64(len(pids)) != j.Get("usage.prompt_tokens").Int() {
		t.Fatalf("prompt ids %d vs usage %d", len(pids), j.Get("usage.prompt_tokens").Int())
	}
	want := Encode(RenderChat([]byte(gjson.Get(chatBody, "messages").Raw), nil, true))
	if !eqIDs(pids, want) {
		t.Fatalf("prompt ids %v, want %v", pids, want)
	}
}

func TestChatStreamMatchesNonStream(t *testing.T) {
	_, base := startT(t, Config{})
	for _, n := range []int{1, 3} {
		body := inject(t, chatBody, "n", n, "return_token_ids", true)
		full := mustOK(t, post(t, base+"/chat/completions", body))
		r := post(t, base+"/chat/completions", inject(t, body, "stream", true, "stream_options", map[string]any{"include_usage": true}))
		if r.status != 200 || !strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("stream status %d type %q", r.status, r.header.Get("Content-Type"))
		}
		sc := collectChat(t, parseSSE(t, r.body))
		if !sc.doneSeen || sc.roleChunks != n {
			t.Fatalf("done %v role chunks %d", sc.doneSeen, sc.roleChunks)
		}
		if sc.ids0 != full.Get("id").Str {
			t.Fatalf("stream id %q vs %q", sc.ids0, full.Get("id").Str)
		}
		if !eqIDs(ids(sc.promptIDs), ids(full.Get("prompt_token_ids"))) || int64(len(sc.promptIDs.Array())) != sc.usage.Get("prompt_tokens").Int() {
			t.Fatalf("stream prompt ids differ")
		}
		total := 0
		texts := map[string]bool{}
		for i := 0; i < n; i++ {
			c := full.Get("choices." + strconv.Itoa(i))
			if sc.text[i] != c.Get("message.content").Str {
				t.Fatalf("choice %d: stream text %q vs %q", i, sc.text[i], c.Get("message.content").Str)
			}
			if !eqIDs(sc.ids[i], ids(c.Get("token_ids"))) {
				t.Fatalf("choice %d: stream ids differ", i)
			}
			if sc.finish[i] != "stop" {
				t.Fatalf("finish %q", sc.finish[i])
			}
			total += len(sc.ids[i])
			texts[sc.text[i]] = true
		}
		if len(texts) != n {
			t.Fatalf("choices are not distinct: %v", texts)
		}
		// The usage chunk leaves out the whole answer's null members (exclude_none).
		if int64(total) != sc.usage.Get("completion_tokens").Int() ||
			strings.TrimSuffix(sc.usage.Raw, "}")+`,"prompt_tokens_details":null,"completion_tokens_details":null}` != full.Get("usage").Raw {
			t.Fatalf("stream usage %s, ids %d, full usage %s", sc.usage.Raw, total, full.Get("usage").Raw)
		}
	}
}

func TestChatStreamWireShape(t *testing.T) {
	_, base := startT(t, Config{})
	r := post(t, base+"/chat/completions", inject(t, chatBody, "stream", true, "return_token_ids", true), "x-mock-tokens", "2")
	evs := parseSSE(t, r.body)
	if len(evs) != 4 {
		t.Fatalf("%d events: %s", len(evs), r.body)
	}
	id := gjson.Get(evs[0].data, "id").Str
	pre := `{"id":"` + id + `","object":"chat.completion.chunk","created":1700000000,"model":"m1","choices":[`
	pids := gjson.Get(evs[0].data, "prompt_token_ids").Raw
	tok1 := gjson.Get(evs[1].data, "choices.0.token_ids.0").Raw
	tok2 := gjson.Get(evs[2].data, "choices.0.token_ids.0").Raw
	w1 := gjson.Get(evs[1].data, "choices.0.delta.content").Raw
	w2 := gjson.Get(evs[2].data, "choices.0.delta.content").Raw
	want := []string{
		pre + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":` + pids + `,"prompt_text":null}`,
		pre + `{"index":0,"delta":{"content":` + w1 + `},"logprobs":null,"finish_reason":null,"token_ids":[` + tok1 + `]}]}`,
		// The last token rides on the finish chunk, as in vLLM 0.32.0.
		pre + `{"index":0,"delta":{"content":` + w2 + `},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[` + tok2 + `]}],"system_fingerprint":"vllm-0.10.2-mock"}`,
		"[DONE]",
	}
	for i := range want {
		if evs[i].data != want[i] {
			t.Fatalf("event %d\n%s\nwant\n%s", i, evs[i].data, want[i])
		}
	}
	if !strings.HasPrefix(string(r.body), "data: {") || !strings.HasSuffix(string(r.body), "data: [DONE]\n\n") {
		t.Fatalf("framing: %q", r.body)
	}
}

func TestMaxTokensLength(t *testing.T) {
	_, base := startT(t, Config{})
	full := mustOK(t, post(t, base+"/chat/completions", chatBody))
	for _, key := range []string{"max_tokens", "max_completion_tokens"} {
		j := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, key, 5, "return_token_ids", true)))
		if j.Get("choices.0.finish_reason").Str != "length" || len(j.Get("choices.0.token_ids").Array()) != 5 {
			t.Fatalf("%s: %s", key, j.Raw)
		}
		if !strings.HasPrefix(full.Get("choices.0.message.content").Str, j.Get("choices.0.message.content").Str) {
			t.Fatalf("truncated text is not a prefix")
		}
	}
	j := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "max_tokens", 100), "x-mock-tokens", "7"))
	if j.Get("choices.0.finish_reason").Str != "stop" || j.Get("usage.completion_tokens").Int() != 7 {
		t.Fatalf("x-mock-tokens: %s", j.Raw)
	}
}

const toolsReq = `{"model":"m1","messages":[{"role":"user","content":"weather in Paris?"}],
 "tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object",
   "properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"type":"string","enum":["c","f"]},"hourly":{"type":"boolean"}},"required":["city"]}}},
  {"type":"function","function":{"name":"other","parameters":{"type":"object","properties":{}}}}]}`

func TestChatTools(t *testing.T) {
	_, base := startT(t, Config{DropIDsEvery: 0})
	body := inject(t, toolsReq, "n", 2, "return_token_ids", true)
	full := mustOK(t, post(t, base+"/chat/completions", body))
	for i := 0; i < 2; i++ {
		c := full.Get("choices." + strconv.Itoa(i))
		// tool_choice auto: "tool_calls", content null (vLLM 0.32.0).
		if c.Get("finish_reason").Str != "tool_calls" || c.Get("message.content").Type != gjson.Null {
			t.Fatalf("choice %d: %s", i, c.Raw)
		}
		tc := c.Get("message.tool_calls.0")
		if tc.Get("type").Str != "function" || tc.Get("function.name").Str != "get_weather" || !strings.HasPrefix(tc.Get("id").Str, "chatcmpl-tool-") {
			t.Fatalf("tool call %s", tc.Raw)
		}
		// The whole answer's arguments are json.dumps'd again (", ", ": ");
		// the ids and a stream carry the generated compact text.
		args := string(appendCompactJSON(nil, tc.Get("function.arguments").Str))
		if !strings.Contains(tc.Get("function.arguments").Str, `", "`) {
			t.Fatalf("arguments not in json.dumps form: %s", tc.Raw)
		}
		a := gjson.Parse(args)
		if !gjson.Valid(args) || a.Get("city").Type != gjson.String || a.Get("days").Type != gjson.Number ||
			(a.Get("unit").Str != "c" && a.Get("unit").Str != "f") || !a.Get("hourly").IsBool() {
			t.Fatalf("arguments %s", args)
		}
		tid := ids(c.Get("token_ids"))
		if !strings.Contains(Decode(tid), args) || tid[0] != TokenToolCall || tid[len(tid)-1] != TokenToolEnd {
			t.Fatalf("tool ids decode to %q", Decode(tid))
		}
	}
	if full.Get("choices.0.message.tool_calls.0.function.arguments").Str == full.Get("choices.1.message.tool_calls.0.function.arguments").Str {
		t.Fatalf("choices share arguments")
	}

	// Stream: same calls, ids sum to usage.
	r := post(t, base+"/chat/completions", inject(t, body, "stream", true, "stream_options.include_usage", true, "logprobs", true))
	sc := collectChat(t, parseSSE(t, r.body))
	total := 0
	for i := 0; i < 2; i++ {
		c := full.Get("choices." + strconv.Itoa(i))
		if sc.args[i] != string(appendCompactJSON(nil, c.Get("message.tool_calls.0.function.arguments").Str)) || sc.finish[i] != "tool_calls" {
			t.Fatalf("stream args %q finish %q", sc.args[i], sc.finish[i])
		}
		if !eqIDs(sc.ids[i], ids(c.Get("token_ids"))) {
			t.Fatalf("stream tool ids differ")
		}
		if sc.lpCount[i] != len(sc.ids[i]) {
			t.Fatalf("logprobs %d vs ids %d", sc.lpCount[i], len(sc.ids[i]))
		}
		total += len(sc.ids[i])
	}
	if int64(total) != sc.usage.Get("completion_tokens").Int() {
		t.Fatalf("ids %d vs usage %s", total, sc.usage.Raw)
	}

	// Round trip: the assistant's call and the tool result go back; the answer is text.
	tc := full.Get("choices.0.message")
	next, _ := sjson.SetRaw(toolsReq, "messages.-1", tc.Raw)
	next, _ = sjson.SetRaw(next, "messages.-1", `{"role":"tool","tool_call_id":"`+tc.Get("tool_calls.0.id").Str+`","content":"sunny"}`)
	j := mustOK(t, post(t, base+"/chat/completions", next))
	if j.Get("choices.0.finish_reason").Str != "stop" || j.Get("choices.0.message.content").Str == "" || len(j.Get("choices.0.message.tool_calls").Array()) != 0 {
		t.Fatalf("after tool: %s", j.Raw)
	}
	// The prompt renders the call: more prompt tokens than before.
	if j.Get("usage.prompt_tokens").Int() <= full.Get("usage.prompt_tokens").Int() {
		t.Fatalf("prompt did not grow")
	}

	// tool_choice names the second tool; "none" gives text; a short max_tokens gives text.
	j = mustOK(t, post(t, base+"/chat/completions", inject(t, toolsReq, "tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "other"}})))
	if j.Get("choices.0.message.tool_calls.0.function.name").Str != "other" || j.Get("choices.0.message.tool_calls.0.function.arguments").Str != "{}" {
		t.Fatalf("named tool choice: %s", j.Raw)
	}
	j = mustOK(t, post(t, base+"/chat/completions", inject(t, toolsReq, "tool_choice", "none")))
	if j.Get("choices.0.finish_reason").Str != "stop" {
		t.Fatalf("tool_choice none: %s", j.Raw)
	}
	j = mustOK(t, post(t, base+"/chat/completions", inject(t, toolsReq, "max_tokens", 3)))
	if j.Get("choices.0.finish_reason").Str != "length" || j.Get("usage.completion_tokens").Int() != 3 {
		t.Fatalf("truncated tool call: %s", j.Raw)
	}
	if r := post(t, base+"/chat/completions", inject(t, toolsReq, "tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "nope"}})); r.status != 400 {
		t.Fatalf("unknown named tool: %d", r.status)
	}
}

func TestChatLogprobs(t *testing.T) {
	_, base := startT(t, Config{})
	body := inject(t, chatBody, "logprobs", true, "top_logprobs", 3, "return_token_ids", true, "return_tokens_as_token_ids", true)
	j := mustOK(t, post(t, base+"/chat/completions", body))
	content := j.Get("choices.0.logprobs.content").Array()
	tok := ids(j.Get("choices.0.token_ids"))
	if len(content) != len(tok) || len(tok) != 16 {
		t.Fatalf("logprobs %d vs ids %d", len(content), len(tok))
	}
	for i, e := range content {
		if e.Get("token").Str != "token_id:"+strconv.Itoa(int(tok[i])) {
			t.Fatalf("token %q, id %d", e.Get("token").Str, tok[i])
		}
		var bs []byte
		for _, b := range e.Get("bytes").Array() {
			bs = append(bs, byte(b.Int()))
		}
		if string(bs) != TokenString(tok[i]) {
			t.Fatalf("bytes %q", bs)
		}
		top := e.Get("top_logprobs").Array()
		if len(top) != 3 || top[0].Get("token").Str != e.Get("token").Str || top[0].Get("logprob").Float() != e.Get("logprob").Float() {
			t.Fatalf("top_logprobs %s", e.Raw)
		}
		if !(top[0].Get("logprob").Float() > top[1].Get("logprob").Float() && top[1].Get("logprob").Float() > top[2].Get("logprob").Float()) || e.Get("logprob").Float() >= 0 {
			t.Fatalf("logprobs not decreasing: %s", e.Raw)
		}
	}
	r := post(t, base+"/chat/completions", inject(t, body, "stream", true))
	sc := collectChat(t, parseSSE(t, r.body))
	if sc.lpCount[0] != 16 {
		t.Fatalf("stream logprobs %d", sc.lpCount[0])
	}
	if r := post(t, base+"/chat/completions", inject(t, chatBody, "top_logprobs", 2)); r.status != 400 {
		t.Fatalf("top_logprobs without logprobs: %d", r.status)
	}
}

func TestTokenizeChatFormMatchesChat(t *testing.T) {
	_, base := startT(t, Config{})
	j := mustOK(t, post(t, base+"/chat/completions", inject(t, toolsReq, "return_token_ids", true, "tool_choice", "none")))
	tk := gjson.Get(toolsReq, "tools").Raw
	msgs := gjson.Get(toolsReq, "messages").Raw
	root := strings.TrimSuffix(base, "/v1")
	tj := mustOK(t, post(t, root+"/tokenize", `{"model":"m1","messages":`+msgs+`,"tools":`+tk+`,"add_generation_prompt":true,"add_special_tokens":false}`))
	if !eqIDs(ids(tj.Get("tokens")), ids(j.Get("prompt_token_ids"))) || tj.Get("count").Int() != j.Get("usage.prompt_tokens").Int() {
		t.Fatalf("tokenize %s vs chat %s", tj.Get("tokens").Raw, j.Get("prompt_token_ids").Raw)
	}
	if tj.Get("max_model_len").Int() != DefaultMaxModelLen || tj.Get("token_strs").Type != gjson.Null {
		t.Fatalf("tokenize shape %s", tj.Raw)
	}
	pj := mustOK(t, post(t, root+"/tokenize", `{"model":"m1","prompt":"hello the world","add_special_tokens":true,"return_token_strs":true}`))
	if !eqIDs(ids(pj.Get("tokens")), Encode("hello the world")) || len(pj.Get("token_strs").Array()) != int(pj.Get("count").Int()) {
		t.Fatalf("prompt form %s", pj.Raw)
	}
	dj := mustOK(t, post(t, root+"/detokenize", `{"model":"m1","tokens":`+pj.Get("tokens").Raw+`}`))
	if dj.Raw != `{"prompt":"hello the world"}` {
		t.Fatalf("detokenize %s", dj.Raw)
	}
	if r := post(t, root+"/detokenize", `{"tokens":[999999]}`); r.status != 400 {
		t.Fatalf("bad token: %d", r.status)
	}
}

func TestIgnoreReturnTokenIDs(t *testing.T) {
	_, base := startT(t, Config{IgnoreReturnTokenIDs: true})
	body := inject(t, chatBody, "return_token_ids", true)
	j := mustOK(t, post(t, base+"/chat/completions", body))
	if j.Get("choices.0.token_ids").Type != gjson.Null || j.Get("prompt_token_ids").Type != gjson.Null {
		t.Fatalf("ids present: %s", j.Raw)
	}
	r := post(t, base+"/chat/completions", inject(t, body, "stream", true))
	if strings.Contains(string(r.body), "token_ids\":[") {
		t.Fatalf("stream has ids: %s", r.body)
	}
	c := mustOK(t, post(t, base+"/completions", `{"prompt":"hi","return_token_ids":true}`))
	if c.Get("choices.0.token_ids").Type != gjson.Null || c.Get("choices.0.prompt_token_ids").Type != gjson.Null {
		t.Fatalf("completion ids present: %s", c.Raw)
	}
}

func TestDropIDsEvery(t *testing.T) {
	_, base := startT(t, Config{DropIDsEvery: 4})
	r := post(t, base+"/chat/completions", inject(t, chatBody, "stream", true, "return_token_ids", true, "stream_options.include_usage", true))
	sc := collectChat(t, parseSSE(t, r.body))
	if sc.text[0] == "" || len(Encode(sc.text[0])) == 0 {
		t.Fatalf("no text")
	}
	if got, want := len(sc.ids[0]), 16-4; got != want || sc.usage.Get("completion_tokens").Int() != 16 {
		t.Fatalf("streamed ids %d, want %d; usage %s", got, want, sc.usage.Raw)
	}
	// Non-streaming answers are complete.
	j := mustOK(t, post(t, base+"/chat/completions", inject(t, chatBody, "return_token_ids", true)))
	if len(j.Get("choices.0.token_ids").Array()) != 16 {
		t.Fatalf("non-stream ids dropped")
	}
	// Completions streams too: token_ids is null on every 4th chunk.
	r = post(t, base+"/completions", `{"prompt":"hi","stream":true,"return_token_ids":true}`)
	nulls := 0
	for _, ev := range parseSSE(t, r.body) {
		if ev.data != "[DONE]" && gjson.Get(ev.data, "choices.0.text").Str != "" && gjson.Get(ev.data, "choices.0.token_ids").Type == gjson.Null {
			nulls++
		}
	}
	if nulls != 4 {
		t.Fatalf("completions chunks without ids: %d", nulls)
	}
}

func TestStreamOptionsNonStream(t *testing.T) {
	_, base := startT(t, Config{})
	for _, path := range []string{"/chat/completions", "/completions"} {
		body := inject(t, `{"prompt":"x","messages":[{"role":"user","content":"x"}]}`, "stream_options", map[string]any{"include_usage": true})
		r := post(t, base+path, body)
		e := gjson.ParseBytes(r.body)
		if r.status != 400 || e.Get("error.type").Str != "BadRequestError" || e.Get("error.code").Int() != 400 ||
			!strings.Contains(e.Get("error.message").Str, "stream=True") || e.Get("error.param").Type != gjson.Null {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		// stream:false with an empty object is allowed, as in vLLM.
		if r := post(t, base+path, inject(t, body, "stream_options", map[string]any{}, "stream", false)); r.status != 200 {
			t.Fatalf("%s: empty stream_options: %d %s", path, r.status, r.body)
		}
	}
}

func TestCompletions(t *testing.T) {
	_, base := startT(t, Config{})
	j := mustOK(t, post(t, base+"/completions", `{"model":"m1","prompt":"hello the world","return_token_ids":true}`))
	// vLLM 0.32.0's order: token_ids before prompt_logprobs.
	wantPre := `{"id":"` + j.Get("id").Str + `","object":"text_completion","created":1700000000,"model":"m1","choices":[{"index":0,"text":"` + j.Get("choices.0.text").Str + `","logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[`
	if !strings.HasPrefix(j.Raw, wantPre) || !strings.HasPrefix(j.Get("id").Str, "cmpl-") {
		t.Fatalf("shape %s", j.Raw)
	}
	if !eqIDs(ids(j.Get("choices.0.prompt_token_ids")), Encode("hello the world")) || Decode(ids(j.Get("choices.0.token_ids"))) != j.Get("choices.0.text").Str {
		t.Fatalf("ids %s", j.Raw)
	}
	// A token-id prompt equal to the encoded string gives the same text.
	idsPrompt := j.Get("choices.0.prompt_token_ids").Raw
	k := mustOK(t, post(t, base+"/completions", `{"model":"m1","prompt":`+idsPrompt+`}`))
	if k.Get("choices.0.text").Str != j.Get("choices.0.text").Str {
		t.Fatalf("id prompt gives other text")
	}
	// List of prompts, n=2: index = output_index + prompt_index*n.
	for _, prompts := range []string{`["a b","the cat","x"]`, `[[1,2],[3],[4,5,6]]`} {
		body := `{"model":"m1","prompt":` + prompts + `,"n":2,"return_token_ids":true,"max_tokens":4}`
		m := mustOK(t, post(t, base+"/completions", body))
		ch := m.Get("choices").Array()
		if len(ch) != 6 {
			t.Fatalf("%d choices", len(ch))
		}
		promptTotal := 0
		compTotal := 0
		for i, c := range ch {
			if int(c.Get("index").Int()) != i || c.Get("finish_reason").Str != "length" {
				t.Fatalf("choice %d: %s", i, c.Raw)
			}
			if i%2 == 0 {
				promptTotal += len(c.Get("prompt_token_ids").Array())
			}
			compTotal += len(c.Get("token_ids").Array())
		}
		if ch[0].Get("text").Str == ch[1].Get("text").Str || ch[0].Get("prompt_token_ids").Raw != ch[1].Get("prompt_token_ids").Raw {
			t.Fatalf("n outputs of one prompt")
		}
		if m.Get("usage.prompt_tokens").Int() != int64(promptTotal) || m.Get("usage.completion_tokens").Int() != int64(compTotal) {
			t.Fatalf("usage %s vs %d/%d", m.Get("usage").Raw, promptTotal, compTotal)
		}
		// Stream: every key in every chunk, same text and ids per index.
		r := post(t, base+"/completions", inject(t, body, "stream", true, "stream_options.include_usage", true))
		text := map[int]string{}
		got := map[int][]uint32{}
		first := map[int]bool{}
		var usage gjson.Result
		for _, ev := range parseSSE(t, r.body) {
			if ev.data == "[DONE]" {
				continue
			}
			e := gjson.Parse(ev.data)
			// Every key in every chunk but usage, which only the usage chunk has.
			if !strings.HasPrefix(ev.data, `{"id":"`+m.Get("id").Str+`","object":"text_completion","created":1700000000,"model":"m1","choices":[`) || e.Get("usage").Exists() != (len(e.Get("choices").Array()) == 0) {
				t.Fatalf("chunk %s", ev.data)
			}
			if len(e.Get("choices").Array()) == 0 {
				usage = e.Get("usage")
				continue
			}
			c := e.Get("choices.0")
			for _, key := range []string{"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"} {
				if !c.Get(key).Exists() {
					t.Fatalf("missing %s: %s", key, ev.data)
				}
			}
			i := int(c.Get("index").Int())
			if !first[i] {
				first[i] = true
				if c.Get("prompt_token_ids").Raw != ch[i].Get("prompt_token_ids").Raw {
					t.Fatalf("first chunk prompt ids %s", ev.data)
				}
			} else if c.Get("prompt_token_ids").Type != gjson.Null {
				t.Fatalf("prompt ids on a later chunk")
			}
			text[i] += c.Get("text").Str
			got[i] = append(got[i], ids(c.Get("token_ids"))...)
		}
		for i, c := range ch {
			if text[i] != c.Get("text").Str || !eqIDs(got[i], ids(c.Get("token_ids"))) {
				t.Fatalf("stream choice %d differs", i)
			}
		}
		// The usage chunk leaves out the whole answer's null members (exclude_none).
		if strings.TrimSuffix(usage.Raw, "}")+`,"prompt_tokens_details":null,"completion_tokens_details":null}` != m.Get("usage").Raw {
			t.Fatalf("stream usage %s vs %s", usage.Raw, m.Get("usage").Raw)
		}
	}
}

func TestCompletionsLogprobs(t *testing.T) {
	_, base := startT(t, Config{})
	j := mustOK(t, post(t, base+"/completions", `{"prompt":"hi","logprobs":2,"max_tokens":5,"return_token_ids":true}`))
	lp := j.Get("choices.0.logprobs")
	toks := ids(j.Get("choices.0.token_ids"))
	if len(lp.Get("tokens").Array()) != 5 || len(lp.Get("token_logprobs").Array()) != 5 || len(lp.Get("text_offset").Array()) != 5 || len(lp.Get("top_logprobs").Array()) != 5 {
		t.Fatalf("logprobs %s", lp.Raw)
	}
	off := 0
	for i, tok := range lp.Get("tokens").Array() {
		if tok.Str != TokenString(toks[i]) || lp.Get("text_offset."+strconv.Itoa(i)).Int() != int64(off) {
			t.Fatalf("token %d: %s", i, lp.Raw)
		}
		off += len(tok.Str)
		top := lp.Get("top_logprobs." + strconv.Itoa(i))
		n := 0
		top.ForEach(func(_, _ gjson.Result) bool { n++; return true })
		if n != 3 || top.Get(gjson.Escape(tok.Str)).Float() != lp.Get("token_logprobs."+strconv.Itoa(i)).Float() {
			t.Fatalf("top %s", top.Raw)
		}
	}
	r := post(t, base+"/completions", `{"prompt":"hi","logprobs":2,"max_tokens":5,"stream":true}`)
	n := 0
	for _, ev := range parseSSE(t, r.body) {
		n += len(gjson.Get(ev.data, "choices.0.logprobs.tokens").Array())
	}
	if n != 5 {
		t.Fatalf("stream logprobs tokens %d", n)
	}
}

func TestResponses(t *testing.T) {
	_, base := startT(t, Config{})
	body := `{"model":"m1","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"instructions":"be nice","max_output_tokens":64}`
	j := mustOK(t, post(t, base+"/responses", body))
	text := j.Get("output.0.content.0.text").Str
	if j.Get("object").Str != "response" || j.Get("status").Str != "completed" || !strings.HasPrefix(j.Get("id").Str, "resp_") ||
		j.Get("output.0.type").Str != "message" || j.Get("output.0.content.0.type").Str != "output_text" || text == "" ||
		j.Get("usage.output_tokens").Int() != 16 || j.Get("usage.total_tokens").Int() != j.Get("usage.input_tokens").Int()+16 {
		t.Fatalf("response %s", j.Raw)
	}
	if strings.Contains(j.Raw, "token_ids") {
		t.Fatalf("ids in responses")
	}
	r := post(t, base+"/responses", inject(t, body, "stream", true))
	evs := parseSSE(t, r.body)
	var deltas string
	for i, ev := range evs {
		if ev.name == "" || gjson.Get(ev.data, "type").Str != ev.name || gjson.Get(ev.data, "sequence_number").Int() != int64(i) {
			t.Fatalf("event %d: %s %s", i, ev.name, ev.data)
		}
		if ev.name == "response.output_text.delta" {
			deltas += gjson.Get(ev.data, "delta").Str
		}
	}
	if evs[0].name != "response.created" || evs[len(evs)-1].name != "response.completed" {
		t.Fatalf("events %v", evs)
	}
	if deltas != text || gjson.Get(evs[len(evs)-1].data, "response").Raw != j.Raw {
		t.Fatalf("stream text %q vs %q\n%s\n%s", deltas, text, gjson.Get(evs[len(evs)-1].data, "response").Raw, j.Raw)
	}
	k := mustOK(t, post(t, base+"/responses", `{"input":"hi","max_output_tokens":2}`))
	if k.Get("status").Str != "incomplete" || k.Get("incomplete_details.reason").Str != "max_output_tokens" || k.Get("model").Str != DefaultModel {
		t.Fatalf("incomplete %s", k.Raw)
	}
}

func TestEmbeddings(t *testing.T) {
	_, base := startT(t, Config{})
	j := mustOK(t, post(t, base+"/embeddings", `{"model":"m1","input":["a b","the cat"]}`))
	if j.Get("object").Str != "list" || len(j.Get("data").Array()) != 2 || j.Get("usage.prompt_tokens").Int() != int64(len(Encode("a b"))+len(Encode("the cat"))) {
		t.Fatalf("embeddings %s", j.Raw)
	}
	var vecs [][]float64
	for i, d := range j.Get("data").Array() {
		v := d.Get("embedding").Array()
		if d.Get("index").Int() != int64(i) || d.Get("object").Str != "embedding" || len(v) != DefaultEmbeddingDim {
			t.Fatalf("item %s", d.Raw)
		}
		var norm float64
		var fv []float64
		for _, x := range v {
			norm += x.Float() * x.Float()
			fv = append(fv, x.Float())
		}
		if math.Abs(norm-1) > 1e-4 {
			t.Fatalf("norm %v", norm)
		}
		vecs = append(vecs, fv)
	}
	b := mustOK(t, post(t, base+"/embeddings", `{"model":"m1","input":"a b","encoding_format":"base64"}`))
	raw, err := base64.StdEncoding.DecodeString(b.Get("data.0.embedding").Str)
	if err != nil || len(raw) != 4*DefaultEmbeddingDim {
		t.Fatalf("base64 %s: %v", b.Raw, err)
	}
	for i := range vecs[0] {
		if float32(vecs[0][i]) != math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])) {
			t.Fatalf("base64 vector differs at %d", i)
		}
	}
}

func TestModelsVersionHealth(t *testing.T) {
	_, base := startT(t, Config{Model: "a", ExtraModels: []string{"b"}, Version: "0.11.0"})
	root := strings.TrimSuffix(base, "/v1")
	m := mustOK(t, do(t, http.MethodGet, base+"/models", ""))
	if m.Get("object").Str != "list" || m.Get("data.#").Int() != 2 || m.Get("data.0.id").Str != "a" || m.Get("data.1.id").Str != "b" ||
		m.Get("data.0.owned_by").Str != "vllm" || m.Get("data.0.max_model_len").Int() != DefaultMaxModelLen {
		t.Fatalf("models %s", m.Raw)
	}
	if v := do(t, http.MethodGet, root+"/version", ""); string(v.body) != `{"version":"0.11.0"}` {
		t.Fatalf("version %s", v.body)
	}
	if h := do(t, http.MethodGet, root+"/health", ""); h.status != 200 || len(h.body) != 0 {
		t.Fatalf("health %d %q", h.status, h.body)
	}
	post(t, root+"/sleep?level=1", "")
	if s := do(t, http.MethodGet, root+"/is_sleeping", ""); string(s.body) != `{"is_sleeping":true}` {
		t.Fatalf("is_sleeping %s", s.body)
	}
	post(t, root+"/wake_up", "")
	if s := do(t, http.MethodGet, root+"/is_sleeping", ""); string(s.body) != `{"is_sleeping":false}` {
		t.Fatalf("is_sleeping %s", s.body)
	}
}

func TestErrors(t *testing.T) {
	_, base := startT(t, Config{})
	root := strings.TrimSuffix(base, "/v1")
	f := func(method, url, body string, status int, msgPart string) {
		t.Helper()
		r := do(t, method, url, body)
		e := gjson.ParseBytes(r.body)
		if r.status != status || e.Get("error.code").Int() != int64(status) || !strings.Contains(e.Get("error.message").Str, msgPart) ||
			e.Get("error.type").Str == "" || e.Get("error.param").Type != gjson.Null {
			t.Fatalf("%s %s %s: %d %s", method, url, body, r.status, r.body)
		}
	}
	f("POST", base+"/chat/completions", `{"messages":`, 400, "JSON")
	f("POST", base+"/chat/completions", `[]`, 400, "dictionary")
	f("POST", base+"/chat/completions", `{"model":"m"}`, 400, "messages")
	f("POST", base+"/chat/completions", `{"messages":"hi"}`, 400, "messages")
	f("POST", base+"/chat/completions", `{"messages":[]}`, 400, "at least 1")
	f("POST", base+"/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "role")
	f("POST", base+"/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":0}`, 400, "n must be at least 1")
	f("POST", base+"/chat/completions", `{"messages":[{"role":"user","content":"x"}],"n":"2"}`, 400, "valid integer")
	f("POST", base+"/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "max_tokens")
	f("POST", base+"/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":40000}`, 400, "maximum context length")
	f("POST", base+"/chat/completions", `{"messages":[{"role":"user","content":"x"}],"stream":"yes"}`, 400, "boolean")
	f("POST", base+"/completions", `{"prompt":[]}`, 400, "empty")
	f("POST", base+"/completions", `{"prompt":[1,"a"]}`, 400, "prompt")
	f("POST", base+"/completions", `{"prompt":""}`, 400, "empty")
	f("POST", base+"/completions", `{"prompt":"x","logprobs":21}`, 400, "logprobs")
	f("POST", base+"/embeddings", `{"input":"x","encoding_format":"hex"}`, 400, "encoding_format")
	f("POST", base+"/responses", `{}`, 400, "input")
	f("POST", root+"/tokenize", `{}`, 400, "prompt")
	f("POST", root+"/detokenize", `{}`, 400, "tokens")
	f("GET", base+"/nope", "", 404, "Not Found")
	f("GET", base+"/chat/completions", "", 405, "Method Not Allowed")
}
