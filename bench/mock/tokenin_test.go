package mock

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// origin is base without its /v1.
func origin(base string) string { return strings.TrimSuffix(base, "/v1") }

// tokenInChain answers a chat request the way the gateway's token-in mode
// does: render, generate (with prompt in place of the rendered ids when
// given), derender. It returns the render, generate and derender answers.
func tokenInChain(t *testing.T, base, chat string, prompt []uint32) (rendered, gen, der gjson.Result) {
	t.Helper()
	rendered = mustOK(t, post(t, origin(base)+PathRender, chat))
	genReq := rendered.Raw
	if prompt != nil {
		var err error
		if genReq, err = sjson.Set(genReq, "token_ids", prompt); err != nil {
			t.Fatal(err)
		}
	}
	gen = mustOK(t, post(t, origin(base)+PathGenerate, genReq))
	derReq := `{"generate_response":` + gen.Raw + `,"prompt_tokens":` + strconv.Itoa(len(ids(gjson.Get(genReq, "token_ids")))) + `,"chat_request":` + chat + `}`
	der = mustOK(t, post(t, origin(base)+PathDerender, derReq))
	return rendered, gen, der
}

// callsOf is name(arguments) of each tool call of a message.
func callsOf(m gjson.Result) []string {
	var out []string
	m.Get("tool_calls").ForEach(func(_, c gjson.Result) bool {
		out = append(out, c.Get("function.name").Str+"("+c.Get("function.arguments").Str+")")
		return true
	})
	return out
}

// TestTokenInMatchesChat: render → generate → derender answers every
// request as the chat path does: the same prompt ids, the same sampled ids
// (end-of-turn included), stop reason and logprobs, and the same content
// and tool calls; generate reports a tool call's finish as "stop" (vLLM's
// engine; its chat serving says "tool_calls").
func TestTokenInMatchesChat(t *testing.T) {
	for _, eot := range []bool{true, false} {
		t.Run(fmt.Sprintf("end-of-turn=%v", eot), func(t *testing.T) { tokenInMatchesChat(t, Config{ScaleOut: true, EndOfTurn: eot}) })
	}
	// Real-template mode: the real templates, tokenizers and parsers.
	for _, model := range realModels {
		t.Run(model, func(t *testing.T) {
			tokenInMatchesChat(t, Config{ScaleOut: true, ModelDir: chattemplatetest.ModelDir(t, model)})
		})
	}
}

func tokenInMatchesChat(t *testing.T, cfg Config) {
	_, base := startT(t, cfg)
	thinks := strings.HasSuffix(cfg.ModelDir, filepath.Join("tokenizer-qwen3", "models")) // text before a tool call: "\n\n" after </think>
	cases := map[string]string{
		"text":        `{"model":"m1","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]}`,
		"seeded n=2":  `{"messages":[{"role":"user","content":"Hi"}],"seed":7,"temperature":0.7,"n":2,"logprobs":true,"top_logprobs":3}`,
		"max_tokens":  `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"logprobs":true}`,
		"stop string": `{"messages":[{"role":"user","content":"Hi"}],"stop":[" the"," of"," and"," to"," in"," is"]}`,
		"tool auto":   inject(t, toolsReq, "logprobs", true),
		"tool none":   inject(t, toolsReq, "tool_choice", "none"),
		"tool forced": inject(t, toolsReq, "tool_choice", "required"),
		"tool named":  inject(t, toolsReq, "tool_choice", map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}),
		"tool cut":    inject(t, toolsReq, "max_tokens", 4),
		"after tool": `{"messages":[{"role":"user","content":"Weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"x","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"x","content":"Sunny"}],` +
			`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			chat := mustOK(t, post(t, base+"/chat/completions", inject(t, body, "return_token_ids", true)))
			rendered, gen, der := tokenInChain(t, base, body, nil)
			if got, want := ids(rendered.Get("token_ids")), ids(chat.Get("prompt_token_ids")); !eqIDs(got, want) {
				t.Fatalf("render ids %v, chat prompt ids %v", got, want)
			}
			if rendered.Get("output_mode").Str != "tokens" || !rendered.Get("sampling_params.max_tokens").Exists() || !strings.HasPrefix(rendered.Get("request_id").Str, "chatcmpl-") {
				t.Fatalf("render answer %s", rendered.Raw)
			}
			if n := len(chat.Get("choices").Array()); n != len(gen.Get("choices").Array()) || n != len(der.Get("choices").Array()) {
				t.Fatalf("choices: chat %d, generate %s, derender %s", n, gen.Raw, der.Raw)
			}
			for i, c := range chat.Get("choices").Array() {
				g, d := gen.Get("choices."+strconv.Itoa(i)), der.Get("choices."+strconv.Itoa(i))
				if !eqIDs(ids(g.Get("token_ids")), ids(c.Get("token_ids"))) {
					t.Errorf("choice %d: generate ids %v, chat %v", i, ids(g.Get("token_ids")), ids(c.Get("token_ids")))
				}
				wantFinish := c.Get("finish_reason").Str
				if wantFinish == "tool_calls" {
					wantFinish = "stop"
				}
				if g.Get("finish_reason").Str != wantFinish || d.Get("finish_reason").Str != wantFinish ||
					g.Get("stop_reason").Raw != c.Get("stop_reason").Raw || d.Get("stop_reason").Raw != c.Get("stop_reason").Raw {
					t.Errorf("choice %d: generate finish %s/%s, derender %s/%s, chat %s/%s", i, g.Get("finish_reason").Raw, g.Get("stop_reason").Raw,
						d.Get("finish_reason").Raw, d.Get("stop_reason").Raw, c.Get("finish_reason").Raw, c.Get("stop_reason").Raw)
				}
				if got, want := d.Get("message.content").String(), c.Get("message.content").String(); got != want {
					t.Errorf("choice %d: derender content %q, chat %q", i, got, want)
				}
				if got, want := callsOf(d.Get("message")), callsOf(c.Get("message")); !slices.Equal(got, want) {
					t.Errorf("choice %d: derender calls %v, chat %v", i, got, want)
				}
				// Derender's logprobs are the chat path's, except that with no
				// top_logprobs asked the sampled token is the one alternative
				// (vLLM's generate always lists it; the chat path lists none).
				dl := d.Get("logprobs").Raw
				if c.Get("logprobs").IsObject() && !gjson.Get(body, "top_logprobs").Exists() {
					for _, e := range d.Get("logprobs.content").Array() {
						top := e.Get("top_logprobs").Array()
						if len(top) != 1 || top[0].Get("token").Raw != e.Get("token").Raw || top[0].Get("logprob").Raw != e.Get("logprob").Raw {
							t.Errorf("choice %d: derender top_logprobs %s, want the sampled token alone", i, e.Get("top_logprobs").Raw)
						}
						dl = strings.Replace(dl, `"top_logprobs":`+e.Get("top_logprobs").Raw, `"top_logprobs":[]`, 1)
					}
				}
				if got, want := dl, c.Get("logprobs").Raw; got != want {
					t.Errorf("choice %d: derender logprobs %s\nchat %s", i, got, want)
				}
				// generate's logprobs by token id: the sampled token first, rank 1.
				for pos, e := range g.Get("logprobs.content").Array() {
					ce := c.Get("logprobs.content." + strconv.Itoa(pos))
					if e.Get("token_id").Uint() != uint64(ids(c.Get("token_ids"))[pos]) || e.Get("logprob").Float() != ce.Get("logprob").Float() || e.Get("rank").Int() != 1 {
						t.Errorf("choice %d pos %d: generate logprob %s, chat %s", i, pos, e.Raw, ce.Raw)
					}
				}
			}
			if name == "tool forced" && der.Get("choices.0.message.content").Type != gjson.String {
				t.Errorf("required tool choice: content %s, want \"\" as vLLM's derender", der.Get("choices.0.message.content").Raw)
			}
			if name == "tool auto" && !thinks && der.Get("choices.0.message.content").Type != gjson.Null {
				t.Errorf("auto tool call: content %s, want null", der.Get("choices.0.message.content").Raw)
			}
		})
	}
}

// TestTokenInExtendedPrompt: a prompt built as the previous prompt ids +
// the sampled ids (end-of-turn included) + the template's ids of the new
// messages samples what the chat path samples for the whole history.
func TestTokenInExtendedPrompt(t *testing.T) {
	_, base := startT(t, Config{ScaleOut: true, EndOfTurn: true})
	first := inject(t, toolsReq, "seed", 3)
	_, gen1, der1 := tokenInChain(t, base, first, nil)
	r1 := mustOK(t, post(t, origin(base)+PathRender, first))
	msg := der1.Get("choices.0.message")
	call := msg.Get("tool_calls.0")
	if !call.Exists() {
		t.Fatalf("first answer has no tool call: %s", der1.Raw)
	}
	// The agent sends the call back with the arguments as sampled (compact):
	// derender gives them as the hermes parser's json.dumps writes them, and
	// a history with those re-rendered texts is a different prompt (the
	// retokenisation token-in avoids), which this test is not about.
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(call.Get("function.arguments").Str)); err != nil {
		t.Fatal(err)
	}
	callRaw, err := sjson.Set(call.Raw, "function.arguments", compact.String())
	if err != nil {
		t.Fatal(err)
	}
	call = gjson.Parse(callRaw)
	msgs := gjson.Get(first, "messages").Raw
	msgs = msgs[:len(msgs)-1] + `,{"role":"assistant","content":null,"tool_calls":[` + call.Raw + `]},{"role":"tool","tool_call_id":` + call.Get("id").Raw + `,"content":"Sunny"}]`
	second, err := sjson.SetRaw(first, "messages", msgs)
	if err != nil {
		t.Fatal(err)
	}
	closed, _ := sjson.SetRaw(second, "messages", gjson.Get(first, "messages").Raw[:len(gjson.Get(first, "messages").Raw)-1]+`,{"role":"assistant","content":null,"tool_calls":[`+call.Raw+`]}]`)
	closed, _ = sjson.Set(closed, "add_generation_prompt", false)
	closedIDs := ids(mustOK(t, post(t, origin(base)+PathRender, closed)).Get("token_ids"))
	fullIDs := ids(mustOK(t, post(t, origin(base)+PathRender, second)).Get("token_ids"))
	resp := ids(gen1.Get("choices.0.token_ids"))
	if resp[len(resp)-1] != TokenIMEnd {
		t.Fatalf("first answer does not end on the end-of-turn token: %v", resp)
	}
	// The template's ids after the closed history's last end-of-turn token.
	tail := fullIDs[len(closedIDs)-1:]
	prompt := slices.Concat(ids(r1.Get("token_ids")), resp, tail)
	chat := mustOK(t, post(t, base+"/chat/completions", inject(t, second, "return_token_ids", true)))
	_, gen2, der2 := tokenInChain(t, base, second, prompt)
	if got, want := ids(gen2.Get("choices.0.token_ids")), ids(chat.Get("choices.0.token_ids")); !eqIDs(got, want) || len(got) == 0 {
		t.Fatalf("extended prompt sampled %v, the chat path %v", got, want)
	}
	if got, want := der2.Get("choices.0.message.content").Str, chat.Get("choices.0.message.content").Str; got != want || got == "" {
		t.Fatalf("extended prompt answered %q, the chat path %q", got, want)
	}
}

// TestTokenInDisabledAndErrors: without ScaleOut the routes answer 403 as
// vLLM's; other flavours do not serve them; bad input gets a 400 naming
// the field.
func TestTokenInDisabledAndErrors(t *testing.T) {
	_, off := startT(t, Config{})
	for _, p := range []string{PathRender, PathGenerate, PathDerender} {
		r := post(t, origin(off)+p, `{}`)
		if r.status != 403 || gjson.GetBytes(r.body, "error.type").Str != "PermissionDeniedError" || !strings.Contains(gjson.GetBytes(r.body, "error.message").Str, "--enable-scale-out") {
			t.Errorf("%s without scale-out: %d %s", p, r.status, r.body)
		}
	}
	_, sg := startT(t, Config{Flavor: FlavorSGLang, ScaleOut: true})
	if r := post(t, origin(sg)+PathRender, `{}`); r.status != 404 {
		t.Errorf("sglang flavour render: %d %s", r.status, r.body)
	}
	_, on := startT(t, Config{ScaleOut: true})
	if r := do(t, "GET", origin(on)+PathGenerate, ""); r.status != 405 {
		t.Errorf("GET generate: %d", r.status)
	}
	for _, c := range []struct{ path, body, want string }{
		{PathRender, `{"messages":[{"role":"wizard","content":"hi"}]}`, `role "wizard"`},
		{PathRender, `{"messages":[]}`, "at least 1 item"},
		{PathRender, `not json`, "JSON decode error"},
		{PathGenerate, `{"token_ids":[],"sampling_params":{}}`, "token_ids"},
		{PathGenerate, `{"token_ids":[1,-2],"sampling_params":{}}`, "token_ids"},
		{PathGenerate, `{"token_ids":[1,99999999],"sampling_params":{}}`, "vocabulary size"},
		{PathGenerate, `{"token_ids":[1]}`, "sampling_params"},
		{PathGenerate, `{"token_ids":[1],"sampling_params":{"max_tokens":0}}`, "max_tokens"},
		{PathGenerate, `{"token_ids":[1],"sampling_params":{"seed":"x"}}`, "sampling_params.seed"},
		{PathGenerate, `{"token_ids":[1],"sampling_params":{"logprobs":50}}`, "sampling_params.logprobs"},
		{PathGenerate, `{"token_ids":[1],"sampling_params":{},"stream":[1]}`, "stream"}, // a streamed generate is served (tokenin_stream.go)
		{PathGenerate, `{"token_ids":[1],"sampling_params":{},"stream":true,"stream_options":5}`, "stream_options"},
		{PathGenerate, `{"token_ids":[1],"sampling_params":{"max_tokens":40000}}`, "maximum context length"},
		{PathDerender, `{}`, "generate_response"},
		{PathDerender, `{"generate_response":{"choices":[{"index":0,"token_ids":[]}]}}`, "empty or null token_ids"},
		{PathDerender, `{"generate_response":{"choices":[{"index":0,"token_ids":[1]}]},"chat_request":5}`, "chat_request"},
		{PathDerender, `{"stream":true,"generate_chunk":{"choices":[{"index":0,"token_ids":[1]}]},"prompt_token_ids":[1]}`, "chat_request is required"},
		{PathDerender, `{"stream":true,"generate_chunk":{"choices":[{"index":0,"token_ids":[1]}]},"chat_request":{}}`, "prompt_token_ids is required"},
		{PathDerender, `{"stream":true,"generate_chunk":{"choices":[{"index":0,"token_ids":[1]},{"index":1,"token_ids":[1]}]},"chat_request":{},"prompt_token_ids":[1]}`, "at most one choice"},
		{PathDerender, `{"stream":true,"generate_chunk":{"choices":[]},"chat_request":{},"prompt_token_ids":[1],"stream_state":{"output_token_ids":[1,2],"output_chunk_lens":[1]}}`, "output_chunk_lens must sum"},
	} {
		r := post(t, origin(on)+c.path, c.body)
		if r.status != 400 || !strings.Contains(gjson.GetBytes(r.body, "error.message").Str, c.want) {
			t.Errorf("%s %s: %d %s, want 400 naming %q", c.path, c.body, r.status, r.body, c.want)
		}
	}
}

// FuzzDerender: any JSON body gets valid JSON or a 400 message, never a
// panic.
func FuzzDerender(f *testing.F) {
	f.Add(`{"generate_response":{"choices":[{"index":0,"token_ids":[259,123,260]}]},"chat_request":{"tools":[{}]}}`)
	f.Add(`{"generate_response":{"choices":[{"index":0,"token_ids":[72,105],"stop_reason":"i","logprobs":{"content":[{"token_id":72,"logprob":-1,"top_logprobs":[{"token_id":9}]}]}}]}}`)
	f.Add(`{"generate_response":{"choices":[{"index":0,"token_ids":[259]}]},"chat_request":{"tools":[],"tool_choice":"required"}}`)
	// Streamed derender: a tool call's name completing, its arguments, a state.
	f.Add(`{"stream":true,"generate_chunk":{"choices":[{"index":0,"token_ids":[268,273,269,97,100,100,270]}]},"chat_request":{"tools":[{}]},"prompt_token_ids":[1],"stream_state":{"output_token_ids":[259],"output_chunk_lens":[1],"role_sent":true}}`)
	f.Add(`{"stream":true,"generate_chunk":{"choices":[{"index":0,"token_ids":[272,268,97,272,51,125],"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":9}},"chat_request":{"tools":[{}],"tool_choice":{"type":"function"}},"prompt_token_ids":[1],"stream_state":{"output_token_ids":[259,268,273,269,97,100,100,270,274],"output_chunk_lens":[9],"last_tool_call_ids":["x"]}}`)
	s := New(Config{ScaleOut: true})
	f.Fuzz(func(t *testing.T, body string) {
		if !gjson.Valid(body) { // the handler answers 400 first
			return
		}
		out, msg := s.appendDerender(nil, gjson.Parse(body))
		if msg == "" && !gjson.ValidBytes(out) {
			t.Fatalf("invalid JSON for %s: %s", body, out)
		}
	})
}

// FuzzHermes: the tool-call parser never panics and always writes JSON.
func FuzzHermes(f *testing.F) {
	f.Add(`<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>`)
	f.Add(`hi <tool_call>{"name":"f"}</tool_call> <tool_call>{"name":"g","arguments":`)
	f.Add(`<tool_call>[1]</tool_call>`)
	f.Fuzz(func(t *testing.T, text string) {
		out := appendHermes([]byte(`{"content":`), text, true, false, []uint32{1}, 0)
		if out = append(out, '}'); !gjson.ValidBytes(out) {
			t.Fatalf("invalid JSON for %q: %s", text, out)
		}
	})
}
