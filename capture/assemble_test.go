package capture

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/openai"
)

// assembleStream runs the payloads of an SSE stream (its "data: " lines)
// through a fresh Assembler.
func assembleStream(ep openai.Endpoint, stream string) *Assembled {
	var a Assembler
	return assembleStreamWith(&a, ep, stream)
}

func assembleStreamWith(a *Assembler, ep openai.Endpoint, stream string) *Assembled {
	a.Reset(ep)
	var s SSEScanner
	s.Feed([]byte(stream))
	for {
		ev, ok := s.Next()
		if !ok {
			break
		}
		a.AddChunk(ev.Data)
	}
	if ev, ok := s.Finish(); ok {
		a.AddChunk(ev.Data)
	}
	return a.Result()
}

func assembleBody(ep openai.Endpoint, body string) *Assembled {
	var a Assembler
	a.Reset(ep)
	a.SetBody([]byte(body))
	return a.Result()
}

// sse joins payloads into a stream of "data: <payload>\n\n" events.
func sse(payloads ...string) string {
	var b strings.Builder
	for _, p := range payloads {
		b.WriteString("data: " + p + "\n\n")
	}
	return b.String()
}

// want is what a test expects of one choice.
type wantChoice struct {
	index    uint32
	message  string // exact JSON, or "" to skip
	tokenIDs []uint32
	hasIDs   bool
	prompt   []uint32
	logprobs []float32
	finish   string
}

func checkChoices(t *testing.T, r *Assembled, want []wantChoice) {
	t.Helper()
	if len(r.Choices) != len(want) {
		t.Fatalf("%d choices, want %d: %+v", len(r.Choices), len(want), r.Choices)
	}
	for i, w := range want {
		c := r.Choices[i]
		if c.Index != w.index {
			t.Errorf("choice %d: index %d, want %d", i, c.Index, w.index)
		}
		if w.message != "" && string(c.Message) != w.message {
			t.Errorf("choice %d: message\n got %s\nwant %s", i, c.Message, w.message)
		}
		if w.message != "" && !gjson.ValidBytes(c.Message) {
			t.Errorf("choice %d: invalid message JSON %s", i, c.Message)
		}
		if !slices.Equal(c.TokenIDs, w.tokenIDs) || c.HasTokenIDs != w.hasIDs {
			t.Errorf("choice %d: token ids %v (%v), want %v (%v)", i, c.TokenIDs, c.HasTokenIDs, w.tokenIDs, w.hasIDs)
		}
		if !slices.Equal(c.PromptTokenIDs, w.prompt) {
			t.Errorf("choice %d: prompt ids %v, want %v", i, c.PromptTokenIDs, w.prompt)
		}
		if !slices.EqualFunc(c.Logprobs, w.logprobs, func(x, y float32) bool {
			return x == y || (math.IsNaN(float64(x)) && math.IsNaN(float64(y)))
		}) {
			t.Errorf("choice %d: logprobs %v, want %v", i, c.Logprobs, w.logprobs)
		}
		if c.FinishReason != w.finish {
			t.Errorf("choice %d: finish %q, want %q", i, c.FinishReason, w.finish)
		}
	}
}

func checkUsage(t *testing.T, r *Assembled, present bool, p, c uint32) {
	t.Helper()
	if r.Usage.Present != present || r.Usage.PromptTokens != p || r.Usage.CompletionTokens != c {
		t.Fatalf("usage %+v, want present=%v %d/%d", r.Usage, present, p, c)
	}
}

// checkBody asserts the assembled body is valid JSON with these gjson paths.
func checkBody(t *testing.T, body []byte, paths map[string]string) {
	t.Helper()
	if !gjson.ValidBytes(body) {
		t.Fatalf("invalid body JSON: %s", body)
	}
	for p, w := range paths {
		if got := gjson.GetBytes(body, p).Raw; got != w {
			t.Errorf("body %s = %s, want %s\nbody: %s", p, got, w, body)
		}
	}
}

const chunkHead = `{"id":"chatcmpl-7","object":"chat.completion.chunk","created":1730000000,"model":"Qwen/Qwen3-8B",`

// Chat, n=3, return_token_ids and include_usage, chunks of the three choices
// interleaved as vLLM sends them.
func TestAssembleChatStreamN3(t *testing.T) {
	h := chunkHead
	stream := sse(
		h+`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[151644,872,198]}`,
		h+`"choices":[{"index":1,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		h+`"choices":[{"index":2,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		h+`"choices":[{"index":0,"delta":{"content":"Hel"},"logprobs":null,"finish_reason":null,"token_ids":[9707]}]}`,
		h+`"choices":[{"index":2,"delta":{"content":"Bon"},"logprobs":null,"finish_reason":null,"token_ids":[20474]}]}`,
		h+`"choices":[{"index":1,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null,"token_ids":[13048]}]}`,
		h+`"choices":[{"index":0,"delta":{"content":"lo \"world\"\n"},"logprobs":null,"finish_reason":null,"token_ids":[385,330,14615,698]}]}`,
		h+`"choices":[{"index":2,"delta":{"content":"jour é"},"logprobs":null,"finish_reason":null,"token_ids":[29262,4042]}]}`,
		h+`"choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[]}]}`,
		h+`"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[]}]}`,
		h+`"choices":[{"index":2,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","stop_reason":151645,"token_ids":[0]}]}`,
		h+`"choices":[],"usage":{"prompt_tokens":3,"total_tokens":11,"completion_tokens":8}}`,
		`[DONE]`,
	)
	r := assembleStream(openai.ChatCompletions, stream)
	if r.Error != "" {
		t.Fatalf("error %q", r.Error)
	}
	if r.ID != "chatcmpl-7" || r.Model != "Qwen/Qwen3-8B" {
		t.Fatalf("id %q model %q", r.ID, r.Model)
	}
	if !slices.Equal(r.PromptTokenIDs, []uint32{151644, 872, 198}) {
		t.Fatalf("prompt ids %v", r.PromptTokenIDs)
	}
	checkUsage(t, r, true, 3, 8)
	checkChoices(t, r, []wantChoice{
		{index: 0, message: `{"role":"assistant","content":"Hello \"world\"\n","tool_calls":[]}`,
			tokenIDs: []uint32{9707, 385, 330, 14615, 698}, hasIDs: true, finish: "stop"},
		{index: 1, message: `{"role":"assistant","content":"Hi","tool_calls":[]}`,
			tokenIDs: []uint32{13048}, hasIDs: true, finish: "length"},
		{index: 2, message: `{"role":"assistant","content":"Bonjour é!","tool_calls":[]}`,
			tokenIDs: []uint32{20474, 29262, 4042, 0}, hasIDs: true, finish: "stop"},
	})
	checkBody(t, r.ResponseBody, map[string]string{
		"id":                         `"chatcmpl-7"`,
		"object":                     `"chat.completion"`,
		"created":                    `1730000000`,
		"model":                      `"Qwen/Qwen3-8B"`,
		"choices.#":                  `3`,
		"choices.0.message.content":  `"Hello \"world\"\n"`,
		"choices.0.token_ids":        `[9707,385,330,14615,698]`,
		"choices.0.finish_reason":    `"stop"`,
		"choices.0.logprobs":         `null`,
		"choices.2.stop_reason":      `151645`,
		"choices.1.finish_reason":    `"length"`,
		"usage":                      `{"prompt_tokens":3,"total_tokens":11,"completion_tokens":8}`,
		"prompt_token_ids":           `[151644,872,198]`,
		"choices.0.prompt_token_ids": ``,
	})
	if c := gjson.GetBytes(r.ResponseBody, "choices.2.message.content").Str; c != "Bonjour é!" {
		t.Fatalf("decoded content %q", c)
	}
}

// Tool calls split across chunks: two parallel calls, arguments in pieces.
func TestAssembleChatStreamToolCalls(t *testing.T) {
	h := chunkHead
	stream := sse(
		h+`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		h+`"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"chatcmpl-tool-a1","type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null,"token_ids":[1]}]}`,
		h+`"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": "}}]},"logprobs":null,"finish_reason":null,"token_ids":[2]}]}`,
		h+`"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"chatcmpl-tool-b2","type":"function","function":{"name":"get_time","arguments":"{}"}}]},"logprobs":null,"finish_reason":null,"token_ids":[3]}]}`,
		h+`"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"logprobs":null,"finish_reason":null,"token_ids":[4,5]}]}`,
		h+`"choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"id":null,"function":{"name":null,"arguments":null}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
		h+`"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":[]}]}`,
		`[DONE]`,
	)
	r := assembleStream(openai.ChatCompletions, stream)
	checkUsage(t, r, false, 0, 0)
	checkChoices(t, r, []wantChoice{{
		index: 0,
		message: `{"role":"assistant","content":null,"tool_calls":[` +
			`{"id":"chatcmpl-tool-a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},` +
			`{"id":"chatcmpl-tool-b2","type":"function","function":{"name":"get_time","arguments":"{}"}}]}`,
		tokenIDs: []uint32{1, 2, 3, 4, 5}, hasIDs: true, finish: "tool_calls",
	}})
	args := gjson.GetBytes(r.ResponseBody, "choices.0.message.tool_calls.0.function.arguments").Str
	if args != `{"city": "Paris"}` {
		t.Fatalf("arguments %q", args)
	}
	if r.PromptTokenIDs != nil {
		t.Fatalf("prompt ids %v", r.PromptTokenIDs)
	}
}

// Reasoning models stream reasoning_content before content.
func TestAssembleChatStreamReasoning(t *testing.T) {
	h := chunkHead
	r := assembleStream(openai.ChatCompletions, sse(
		h+`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		h+`"choices":[{"index":0,"delta":{"reasoning_content":"Think"},"finish_reason":null}]}`,
		h+`"choices":[{"index":0,"delta":{"reasoning_content":"ing."},"finish_reason":null}]}`,
		h+`"choices":[{"index":0,"delta":{"content":"Answer"},"finish_reason":"stop"}]}`,
	))
	checkChoices(t, r, []wantChoice{{index: 0,
		message: `{"role":"assistant","content":"Answer","reasoning_content":"Thinking.","tool_calls":[]}`,
		finish:  "stop"}})
}

// Chat logprobs: logprobs.content[].logprob, kept whole in the body.
func TestAssembleChatStreamLogprobs(t *testing.T) {
	h := chunkHead
	r := assembleStream(openai.ChatCompletions, sse(
		h+`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		h+`"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.25,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.25,"bytes":[72,105]}]}]},"finish_reason":null,"token_ids":[13048]}]}`,
		h+`"choices":[{"index":0,"delta":{"content":" there"},"logprobs":{"content":[{"token":" the","logprob":-9999.0,"bytes":[32],"top_logprobs":[]},{"token":"re","logprob":-1.5,"bytes":[32],"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[279,265]}]}`,
	))
	checkChoices(t, r, []wantChoice{{index: 0, message: `{"role":"assistant","content":"Hi there","tool_calls":[]}`,
		tokenIDs: []uint32{13048, 279, 265}, hasIDs: true, logprobs: []float32{-0.25, -9999, -1.5}, finish: "stop"}})
	checkBody(t, r.ResponseBody, map[string]string{
		"choices.0.logprobs.content.#":                `3`,
		"choices.0.logprobs.content.0.top_logprobs.#": `1`,
		"choices.0.logprobs.content.2.logprob":        `-1.5`,
	})
}

// Completions with a list of two prompts (n=1): per-choice prompt ids on each
// choice's first chunk, every key present (null) in every chunk, the chunks
// of index 1 arriving first, logprobs in the completions form.
func TestAssembleCompletionsStreamListPrompts(t *testing.T) {
	h := `{"id":"cmpl-9","object":"text_completion","created":1730000001,"model":"m",`
	stream := sse(
		h+`"choices":[{"index":1,"text":"B","logprobs":{"tokens":["B"],"token_logprobs":[-0.5],"text_offset":[6],"top_logprobs":[{"B":-0.5}]},"finish_reason":null,"stop_reason":null,"prompt_token_ids":[7,8],"token_ids":[33]}],"usage":null}`,
		h+`"choices":[{"index":0,"text":"A","logprobs":{"tokens":["A"],"token_logprobs":[-0.1],"text_offset":[5],"top_logprobs":[{"A":-0.1}]},"finish_reason":null,"stop_reason":null,"prompt_token_ids":[5,6],"token_ids":[32]}],"usage":null}`,
		h+`"choices":[{"index":0,"text":"a","logprobs":{"tokens":["a"],"token_logprobs":[-0.2],"text_offset":[6],"top_logprobs":[{"a":-0.2}]},"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[64]}],"usage":null}`,
		h+`"choices":[{"index":1,"text":"b\t","logprobs":{"tokens":["b","\t"],"token_logprobs":[null,-3],"text_offset":[7,8],"top_logprobs":[null,{"\t":-3}]},"finish_reason":"stop","stop_reason":null,"prompt_token_ids":null,"token_ids":[65,197]}],"usage":null}`,
		h+`"choices":[],"usage":{"prompt_tokens":4,"total_tokens":9,"completion_tokens":5}}`,
		`[DONE]`,
	)
	r := assembleStream(openai.Completions, stream)
	if r.Error != "" {
		t.Fatal(r.Error)
	}
	checkUsage(t, r, true, 4, 5)
	nan := float32(math.NaN())
	checkChoices(t, r, []wantChoice{
		{index: 0, message: `{"text":"Aa"}`, tokenIDs: []uint32{32, 64}, hasIDs: true, prompt: []uint32{5, 6},
			logprobs: []float32{-0.1, -0.2}, finish: "length"},
		{index: 1, message: `{"text":"Bb\t"}`, tokenIDs: []uint32{33, 65, 197}, hasIDs: true, prompt: []uint32{7, 8},
			logprobs: []float32{-0.5, nan, -3}, finish: "stop"},
	})
	checkBody(t, r.ResponseBody, map[string]string{
		"object":                              `"text_completion"`,
		"choices.0.text":                      `"Aa"`,
		"choices.1.text":                      `"Bb\t"`,
		"choices.1.prompt_token_ids":          `[7,8]`,
		"choices.1.token_ids":                 `[33,65,197]`,
		"choices.1.logprobs.tokens":           `["B","b","\t"]`,
		"choices.1.logprobs.token_logprobs":   `[-0.5,null,-3]`,
		"choices.1.logprobs.text_offset":      `[6,7,8]`,
		"choices.1.logprobs.top_logprobs":     `[{"B":-0.5},null,{"\t":-3}]`,
		"choices.0.logprobs.top_logprobs.1.a": `-0.2`,
		"prompt_token_ids":                    ``,
	})
	if r.PromptTokenIDs != nil {
		t.Fatalf("top-level prompt ids %v", r.PromptTokenIDs)
	}
}

// Without return_token_ids the ids are absent or null: HasTokenIDs is false.
func TestAssembleStreamNulls(t *testing.T) {
	h := chunkHead
	r := assembleStream(openai.ChatCompletions, sse(
		h+`"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"usage":null}`,
		h+`"choices":[{"index":0,"delta":{"content":"x"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
		h+`"choices":[{"index":0,"delta":{"content":null},"logprobs":{"content":null},"finish_reason":null,"stop_reason":null}]}`,
		h+`"choices":[{"index":null,"delta":null,"logprobs":null,"finish_reason":"stop"}]}`,
	))
	checkChoices(t, r, []wantChoice{{index: 0, message: `{"role":"assistant","content":"x","tool_calls":[]}`, finish: "stop"}})
	checkUsage(t, r, false, 0, 0)
	checkBody(t, r.ResponseBody, map[string]string{"choices.0.token_ids": ``, "prompt_token_ids": ``, "usage": ``})
	if r.PromptTokenIDs != nil || r.Error != "" {
		t.Fatalf("prompt %v error %q", r.PromptTokenIDs, r.Error)
	}
}

func TestAssembleStreamError(t *testing.T) {
	h := chunkHead
	f := func(name, errChunk, wantErr string) {
		t.Helper()
		r := assembleStream(openai.ChatCompletions, sse(
			h+`"choices":[{"index":0,"delta":{"role":"assistant","content":"par"},"finish_reason":null,"token_ids":[1]}]}`,
			errChunk,
			h+`"choices":[{"index":0,"delta":{"content":"tial"},"finish_reason":null,"token_ids":[2]}]}`,
		))
		if r.Error != wantErr {
			t.Fatalf("%s: error %q, want %q", name, r.Error, wantErr)
		}
		checkChoices(t, r, []wantChoice{{index: 0, message: `{"role":"assistant","content":"partial","tool_calls":[]}`,
			tokenIDs: []uint32{1, 2}, hasIDs: true}})
		checkBody(t, r.ResponseBody, nil)
	}
	f("error object", `{"error":{"message":"engine dead","type":"InternalServerError","code":500}}`, "InternalServerError: engine dead")
	f("error without type", `{"error":{"message":"boom"}}`, "boom")
	f("flat error", `{"object":"error","message":"bad","type":"BadRequestError","code":400}`, "BadRequestError: bad")
	f("error string", `{"error":"plain"}`, "plain")
	f("error without message", `{"error":{"code":1}}`, `backend error: {"code":1}`)
	f("invalid JSON", `{"choices":[`, "invalid JSON in stream event")
	f("not an object", `[1,2]`, "stream event is not a JSON object")
	f("first error wins", `{"error":{"message":"first"}}`+"\n\ndata: "+`{"error":{"message":"second"}}`, "first")
}

const respCompleted = `{"id":"resp_1","object":"response","created_at":1730000002,"model":"m","output":[{"id":"msg_1","type":"message","role":"assistant","status":"completed","content":[{"type":"output_text","text":"Hi!","annotations":[]}]}],"status":"completed","incomplete_details":null,"usage":{"input_tokens":12,"input_tokens_details":{"cached_tokens":0},"output_tokens":3,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":15}}`

func TestAssembleResponsesStream(t *testing.T) {
	stream := "event: response.created\ndata: " + `{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","model":"m","output":[],"status":"in_progress","usage":null}}` + "\n\n" +
		"event: response.output_text.delta\ndata: " + `{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi!"}` + "\n\n" +
		"event: response.completed\ndata: " + `{"type":"response.completed","sequence_number":2,"response":` + respCompleted + `}` + "\n\n"
	for _, ep := range []openai.Endpoint{openai.Responses, openai.Unknown} {
		r := assembleStream(ep, stream)
		if r.Error != "" {
			t.Fatal(r.Error)
		}
		if string(r.ResponseBody) != respCompleted {
			t.Fatalf("body %s", r.ResponseBody)
		}
		checkUsage(t, r, true, 12, 3)
		checkChoices(t, r, []wantChoice{{index: 0, message: gjson.Get(respCompleted, "output").Raw, finish: "completed"}})
		if r.ID != "resp_1" || r.Model != "m" {
			t.Fatalf("id %q model %q", r.ID, r.Model)
		}
	}
	// A stream cut before response.completed, and an error event.
	r := assembleStream(openai.Responses, sse(`{"type":"response.created","response":{"id":"resp_2"}}`))
	if r.Error != "stream ended before response.completed" || len(r.Choices) != 0 {
		t.Fatalf("cut stream: %q %d", r.Error, len(r.Choices))
	}
	for _, ep := range []openai.Endpoint{openai.Responses, openai.Unknown} {
		r = assembleStream(ep, sse(`{"type":"error","code":"server_error","message":"overloaded","sequence_number":1}`))
		if r.Error != "overloaded" {
			t.Fatalf("error event (endpoint %v): %q", ep, r.Error)
		}
	}
}

func TestAssembleBody(t *testing.T) {
	type tc struct {
		name     string
		ep       openai.Endpoint
		body     string
		err      string
		usage    [2]uint32 // prompt, completion; usage present when non-zero
		prompt   []uint32
		choices  []wantChoice
		model    string
		noChoice bool
	}
	f := func(c tc) {
		t.Helper()
		t.Run(c.name, func(t *testing.T) {
			r := assembleBody(c.ep, c.body)
			if r.Error != c.err {
				t.Fatalf("error %q, want %q", r.Error, c.err)
			}
			if string(r.ResponseBody) != c.body {
				t.Fatalf("ResponseBody is not the body: %s", r.ResponseBody)
			}
			checkUsage(t, r, c.usage != [2]uint32{}, c.usage[0], c.usage[1])
			if !slices.Equal(r.PromptTokenIDs, c.prompt) {
				t.Fatalf("prompt ids %v, want %v", r.PromptTokenIDs, c.prompt)
			}
			checkChoices(t, r, c.choices)
			if r.Model != c.model {
				t.Fatalf("model %q, want %q", r.Model, c.model)
			}
		})
	}
	f(tc{name: "chat with ids", ep: openai.ChatCompletions,
		body:   `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[9906,0]}],"usage":{"prompt_tokens":71,"completion_tokens":2,"total_tokens":73},"prompt_logprobs":null,"prompt_token_ids":[200006,17360]}`,
		usage:  [2]uint32{71, 2},
		prompt: []uint32{200006, 17360}, model: "m",
		choices: []wantChoice{{index: 0, message: `{"role":"assistant","content":"Hello!","tool_calls":[]}`,
			tokenIDs: []uint32{9906, 0}, hasIDs: true, finish: "stop"}}})
	f(tc{name: "chat nulls and logprobs n=2", ep: openai.ChatCompletions,
		body:  `{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"m","choices":[{"index":1,"message":{"role":"assistant","content":"b","tool_calls":[]},"logprobs":{"content":[{"token":"b","logprob":-2.0,"bytes":[98],"top_logprobs":[]}]},"finish_reason":"length","stop_reason":null,"token_ids":null},{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":"{}"}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2},"prompt_logprobs":null,"prompt_token_ids":null}`,
		usage: [2]uint32{5, 2}, model: "m",
		choices: []wantChoice{
			{index: 0, message: `{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":"{}"}}]}`, finish: "tool_calls"},
			{index: 1, message: `{"role":"assistant","content":"b","tool_calls":[]}`, logprobs: []float32{-2}, finish: "length"},
		}})
	f(tc{name: "completions sglang per-choice ids", ep: openai.Completions,
		body:  `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a\nb","logprobs":{"tokens":["a"],"token_logprobs":[-0.5],"text_offset":[0],"top_logprobs":null},"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null,"prompt_token_ids":[1,2,3],"token_ids":[4,5]}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`,
		usage: [2]uint32{3, 2}, model: "m",
		choices: []wantChoice{{index: 0, message: `{"text":" a\nb"}`, tokenIDs: []uint32{4, 5}, hasIDs: true,
			prompt: []uint32{1, 2, 3}, logprobs: []float32{-0.5}, finish: "stop"}}})
	f(tc{name: "error object", ep: openai.ChatCompletions,
		body: `{"error":{"message":"model not found","type":"NotFoundError","param":null,"code":404}}`,
		err:  "NotFoundError: model not found"})
	f(tc{name: "flat error", ep: openai.ChatCompletions,
		body: `{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`,
		err:  "BadRequestError: too long"})
	f(tc{name: "error null", ep: openai.ChatCompletions,
		body: `{"id":"x","error":null,"choices":null,"usage":null}`})
	f(tc{name: "invalid JSON", ep: openai.ChatCompletions, body: `{"id":`, err: "invalid JSON in response body"})
	f(tc{name: "not an object", ep: openai.ChatCompletions, body: `"hi"`, err: "response body is not a JSON object"})
	f(tc{name: "empty", ep: openai.ChatCompletions, body: ``, err: "invalid JSON in response body"})
	f(tc{name: "embeddings", ep: openai.Embeddings,
		body:  `{"id":"embd-1","object":"list","created":1,"model":"e","data":[{"index":0,"object":"embedding","embedding":[0.1,0.2]}],"usage":{"prompt_tokens":4,"total_tokens":4,"completion_tokens":0}}`,
		usage: [2]uint32{4, 0}, model: "e"})
	f(tc{name: "responses", ep: openai.Responses, body: respCompleted, usage: [2]uint32{12, 3}, model: "m",
		choices: []wantChoice{{index: 0, message: gjson.Get(respCompleted, "output").Raw, finish: "completed"}}})
	f(tc{name: "responses incomplete", ep: openai.Unknown,
		body:  `{"id":"resp_3","object":"response","model":"m","output":[],"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":1,"output_tokens":9}}`,
		usage: [2]uint32{1, 9}, model: "m",
		choices: []wantChoice{{index: 0, message: `[]`, finish: "max_output_tokens"}}})
	f(tc{name: "unknown endpoint guessed chat", ep: openai.Unknown,
		body:  `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"stop","token_ids":[]}]}`,
		model: "m",
		choices: []wantChoice{{index: 0, message: `{"role":"assistant","content":"x"}`, tokenIDs: []uint32{}, hasIDs: true,
			finish: "stop"}}})
	f(tc{name: "odd ids and usage", ep: openai.ChatCompletions,
		body:  `{"model":"m\u00e9","choices":[{"index":-1,"message":{},"token_ids":[1, 2.7,-3,"x",null,99999999999],"finish_reason":"\u0073top"}],"usage":{"prompt_tokens":1e12,"completion_tokens":-4}}`,
		usage: [2]uint32{math.MaxUint32, 0}, model: "mé", // completion clamped to 0: usage present
		choices: []wantChoice{{index: 0, message: `{}`, tokenIDs: []uint32{1, 2, 0, math.MaxUint32}, hasIDs: true, finish: "stop"}}})
}

// A whole non-streaming object sent as a single SSE event (best_of, beam search).
func TestAssembleStreamWholeObject(t *testing.T) {
	r := assembleStream(openai.Completions, sse(
		`{"id":"cmpl-b","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"best","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":[1],"token_ids":[2,3]}],"usage":{"prompt_tokens":1,"total_tokens":3,"completion_tokens":2}}`,
		`[DONE]`))
	checkChoices(t, r, []wantChoice{{index: 0, message: `{"text":"best"}`, tokenIDs: []uint32{2, 3}, hasIDs: true, prompt: []uint32{1}, finish: "length"}})
	checkUsage(t, r, true, 1, 2)
	r = assembleStream(openai.ChatCompletions, sse(
		`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"whole","tool_calls":[]},"finish_reason":"stop"}]}`))
	checkChoices(t, r, []wantChoice{{index: 0, message: `{"role":"assistant","content":"whole","tool_calls":[]}`, finish: "stop"}})
}

func TestAssembleChoiceLimit(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"choices":[`)
	for i := range MaxChoices + 10 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"index":%d,"delta":{"content":"x"},"token_ids":[%d]}`, 3*i, i)
	}
	b.WriteString(`]}`)
	var a Assembler
	a.Reset(openai.ChatCompletions)
	a.AddChunk([]byte(b.String()))
	a.AddChunk([]byte(b.String())) // again: merges into the same choices
	r := a.Result()
	if len(r.Choices) != MaxChoices {
		t.Fatalf("%d choices", len(r.Choices))
	}
	if r.Error != "too many choices: 20 dropped over the limit of 1024" {
		t.Fatalf("error %q", r.Error)
	}
	last := r.Choices[MaxChoices-1]
	if last.Index != 3*(MaxChoices-1) || !slices.Equal(last.TokenIDs, []uint32{MaxChoices - 1, MaxChoices - 1}) {
		t.Fatalf("last choice %+v", last)
	}
	checkBody(t, r.ResponseBody, map[string]string{"choices.#": "1024"})

	// Tool calls per choice are capped too.
	b.Reset()
	b.WriteString(`{"choices":[{"index":0,"delta":{"tool_calls":[`)
	for i := range MaxToolCalls + 1 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"index":%d,"function":{"name":"f","arguments":"{}"}}`, i)
	}
	b.WriteString(`]}}]}`)
	a.Reset(openai.ChatCompletions)
	a.AddChunk([]byte(b.String()))
	r = a.Result()
	if r.Error != "too many tool calls: 1 dropped over the limit of 128 per choice" {
		t.Fatalf("error %q", r.Error)
	}
	if n := gjson.GetBytes(r.Choices[0].Message, "tool_calls.#").Int(); n != MaxToolCalls {
		t.Fatalf("%d tool calls", n)
	}
}

// An Assembler reused through Reset gives the same results as a fresh one,
// and a result stays valid until the next call.
func TestAssembleReuse(t *testing.T) {
	streamA := benchChatStream(20)
	streamB := sse(
		`{"id":"cmpl-z","object":"text_completion","model":"other","choices":[{"index":0,"text":"z","finish_reason":"stop","prompt_token_ids":[9],"token_ids":[8]}]}`)
	var a Assembler
	for range 3 {
		for _, c := range []struct {
			ep openai.Endpoint
			s  string
		}{{openai.ChatCompletions, streamA}, {openai.Completions, streamB}} {
			got := assembleStreamWith(&a, c.ep, c.s)
			want := assembleStream(c.ep, c.s)
			if fmt.Sprintf("%+v", *got) != fmt.Sprintf("%+v", *want) {
				t.Fatalf("reused:\n%+v\nfresh:\n%+v", *got, *want)
			}
			if again := a.Result(); !bytes.Equal(again.ResponseBody, want.ResponseBody) {
				t.Fatal("second Result differs")
			}
		}
		a.Reset(openai.ChatCompletions)
		a.SetBody([]byte(`{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"q"},"finish_reason":"stop"}]}`))
		if r := a.Result(); string(r.Choices[0].Message) != `{"role":"assistant","content":"q"}` || r.Model != "m" {
			t.Fatalf("body after streams: %+v", r)
		}
	}
}

// TestAssembleAllocs bounds the allocations of a warm Assembler on a 256-token
// chat stream: the id string, and little else.
func TestAssembleAllocs(t *testing.T) {
	payloads := streamPayloads(benchChatStream(256))
	var a Assembler
	run := func() {
		a.Reset(openai.ChatCompletions)
		for _, p := range payloads {
			a.AddChunk(p)
		}
		if r := a.Result(); len(r.Choices[0].TokenIDs) != 256 {
			t.Fatalf("%d ids", len(r.Choices[0].TokenIDs))
		}
	}
	run()
	want := " tok0 tok1 tok2\n tok4 tok5 café tok7"
	if c := gjson.GetBytes(a.Result().Choices[0].Message, "content").Str; !strings.HasPrefix(c, want) {
		t.Fatalf("content starts %q, want %q", c[:min(len(c), len(want))], want)
	}
	if n := testing.AllocsPerRun(20, run); n > 2 {
		t.Fatalf("%v allocations per stream, want <= 2", n)
	}
}

func FuzzAssembler(f *testing.F) {
	f.Add([]byte(benchChatStream(3)), uint8(1))
	f.Add([]byte(sse(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"arguments":"{\""}}]}}]}`, `{"error":{"message":"x"}}`)), uint8(1))
	f.Add([]byte(sse(`{"object":"text_completion","choices":[{"index":5,"text":"x","logprobs":{"tokens":["x"],"token_logprobs":[null]},"prompt_token_ids":[1]}]}`)), uint8(0))
	f.Add([]byte(sse(`{"type":"response.completed","response":`+respCompleted+`}`)), uint8(3))
	f.Add([]byte(respCompleted), uint8(3))
	f.Add([]byte(""), uint8(0)) // regression: no chunk at all is not a stream
	f.Fuzz(func(t *testing.T, in []byte, ep uint8) {
		endpoint := openai.Endpoint(ep % 5)
		var a Assembler
		// As a stream: each line is a payload.
		a.Reset(endpoint)
		for line := range bytes.Lines(in) {
			a.AddChunk(bytes.TrimPrefix(line, []byte("data: ")))
		}
		r := a.Result()
		if a.stream && a.kind != openai.Responses && !gjson.ValidBytes(r.ResponseBody) {
			t.Fatalf("invalid assembled body %s", r.ResponseBody)
		}
		for i, c := range r.Choices {
			if len(c.Message) > 0 && !gjson.ValidBytes(c.Message) {
				t.Fatalf("invalid message %s", c.Message)
			}
			if i > 0 && r.Choices[i-1].Index >= c.Index {
				t.Fatalf("choices not sorted")
			}
		}
		// As a body.
		a.Reset(endpoint)
		a.SetBody(in)
		r = a.Result()
		if !bytes.Equal(r.ResponseBody, in) {
			t.Fatal("body changed")
		}
	})
}

// benchChatStream is benchStream as a string.
func benchChatStream(n int) string {
	return string(benchStream(n))
}

// streamPayloads returns the data payloads of a stream (copied).
func streamPayloads(stream string) [][]byte {
	var s SSEScanner
	s.Feed([]byte(stream))
	var out [][]byte
	for {
		ev, ok := s.Next()
		if !ok {
			return out
		}
		out = append(out, bytes.Clone(ev.Data))
	}
}

func BenchmarkAssembleChatStream256(b *testing.B) {
	payloads := streamPayloads(benchChatStream(256))
	var a Assembler
	b.ReportAllocs()
	for b.Loop() {
		a.Reset(openai.ChatCompletions)
		for _, p := range payloads {
			a.AddChunk(p)
		}
		if r := a.Result(); len(r.Choices) != 1 {
			b.Fatal("no choice")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(payloads)), "ns/chunk")
}

// BenchmarkAssembleChatBody: a non-streamed 256-token chat answer, plain and
// carrying the sampled tokens' logprobs, as the gateway asks vLLM for them
// by default (the body the closed-loop non-streamed load captures).
func BenchmarkAssembleChatBody(b *testing.B) {
	for _, logprobs := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "logprobs"}[logprobs], func(b *testing.B) {
			r := assembleStream(openai.ChatCompletions, string(benchStreamOf(256, logprobs)))
			body := bytes.Clone(r.ResponseBody)
			var a Assembler
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				a.Reset(openai.ChatCompletions)
				a.SetBody(body)
				if r := a.Result(); len(r.Choices[0].TokenIDs) != 256 || logprobs != (len(r.Choices[0].Logprobs) == 256) {
					b.Fatal("ids or logprobs")
				}
			}
		})
	}
}

// TestAssembleStreamTimings: a llama.cpp stream without usage (include_usage not
// asked) gives its counts in the finish chunk's "timings": prompt_tokens = cache_n +
// prompt_n, completion_tokens = predicted_n; usage, when present, wins; timings of
// the wrong types give no counts.
func TestAssembleStreamTimings(t *testing.T) {
	const head = `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"hi"}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"}`
	finish := func(tail string) string {
		return `{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk"` + tail + `}`
	}
	timings := `,"timings":{"cache_n":7,"prompt_n":3,"prompt_ms":1.5,"predicted_n":2,"predicted_ms":2.0}`
	r := assembleStream(openai.ChatCompletions, sse(head, finish(timings), "[DONE]"))
	checkUsage(t, r, true, 10, 2)
	if !r.Usage.FromTimings {
		t.Fatal("counts from timings not marked")
	}
	checkBody(t, r.ResponseBody, map[string]string{"timings.predicted_n": `2`, "usage": ``})

	r = assembleStream(openai.ChatCompletions, sse(head, finish(""), `{"choices":[],"created":1,"id":"chatcmpl-x","model":"m","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":11,"total_tokens":13}`+timings+`}`, "[DONE]"))
	checkUsage(t, r, true, 11, 2)
	if r.Usage.FromTimings {
		t.Fatal("usage present, but counts marked as from timings")
	}

	r = assembleStream(openai.ChatCompletions, sse(head, finish(`,"timings":{"cache_n":"7","prompt_n":3,"predicted_n":2}`), "[DONE]"))
	checkUsage(t, r, false, 0, 0)
}
