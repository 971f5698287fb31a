package rewrite

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/openai"
)

// Wire examples after docs/engines.md (vLLM >= 0.10.2): what the engine sends
// with the injected fields ("with") and without them ("without").

const hdrChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",`
const hdrCmpl = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m",`

// roundTrip pairs an engine output with injection and the same output without.
type roundTrip struct {
	name    string
	ep      openai.Endpoint
	inj     Injected
	with    string
	without string // "" = the event is dropped
}

var chatBodyTrips = []roundTrip{
	{
		name: "chat ids", ep: openai.ChatCompletions, inj: ReturnTokenIDs,
		with:    `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[9906,0]}],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2},"prompt_logprobs":null,"prompt_token_ids":[200006,17360]}`,
		without: `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2},"prompt_logprobs":null,"prompt_token_ids":null}`,
	},
	{
		name: "chat ids and logprobs n=2 tool call", ep: openai.ChatCompletions, inj: ReturnTokenIDs | Logprobs,
		with:    `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":"{\"a\":\"]}\"}"}}]},"logprobs":{"content":[{"token":"w","logprob":-0.1,"bytes":[119],"top_logprobs":[]}]},"finish_reason":"tool_calls","stop_reason":null,"token_ids":[17]},{"index":1,"message":{"role":"assistant","content":"x","tool_calls":[]},"logprobs":{"content":[{"token":"x","logprob":-9999.0,"bytes":[120],"top_logprobs":[]}]},"finish_reason":"length","stop_reason":null,"token_ids":[18]}],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2},"prompt_logprobs":null,"prompt_token_ids":[1,2]}`,
		without: `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":"{\"a\":\"]}\"}"}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":null},{"index":1,"message":{"role":"assistant","content":"x","tool_calls":[]},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}],"usage":{"prompt_tokens":2,"total_tokens":4,"completion_tokens":2},"prompt_logprobs":null,"prompt_token_ids":null}`,
	},
	{
		name: "completions ids and logprobs", ep: openai.Completions, inj: ReturnTokenIDs | Logprobs,
		with:    `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"hi","logprobs":{"tokens":["hi"],"token_logprobs":[-0.5],"text_offset":[0],"top_logprobs":[{"hi":-0.5}]},"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null,"prompt_token_ids":[1,2],"token_ids":[3]},{"index":1,"text":"yo","logprobs":{"tokens":["yo"],"token_logprobs":[-0.7],"text_offset":[0],"top_logprobs":[{"yo":-0.7}]},"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null,"prompt_token_ids":[1,2],"token_ids":[4]}],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}`,
		without: `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"hi","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null,"prompt_token_ids":null,"token_ids":null},{"index":1,"text":"yo","logprobs":null,"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null,"prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}`,
	},
	{
		// SGLang puts prompt ids per choice.
		name: "per-choice prompt ids", ep: openai.ChatCompletions, inj: ReturnTokenIDs,
		with:    `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"logprobs":null,"finish_reason":"stop","prompt_token_ids":[1,2],"token_ids":[3]}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`,
		without: `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"},"logprobs":null,"finish_reason":"stop","prompt_token_ids":null,"token_ids":null}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`,
	},
}

var chatStreamTrips = []roundTrip{
	{
		name: "chat first chunk", ep: openai.ChatCompletions, inj: ReturnTokenIDs | IncludeUsage,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[200006,17360,12]}`,
		without: hdrChunk + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}`,
	},
	{
		name: "chat content chunk", ep: openai.ChatCompletions, inj: ReturnTokenIDs | IncludeUsage,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{"content":"w"},"logprobs":null,"finish_reason":null,"token_ids":[17]}]}`,
		without: hdrChunk + `"choices":[{"index":0,"delta":{"content":"w"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
	},
	{
		name: "chat content chunk with logprobs", ep: openai.ChatCompletions, inj: ReturnTokenIDs | Logprobs,
		with:    hdrChunk + `"choices":[{"index":1,"delta":{"content":"w"},"logprobs":{"content":[{"token":"w","logprob":-0.25,"bytes":[119],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[17]}]}`,
		without: hdrChunk + `"choices":[{"index":1,"delta":{"content":"w"},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
	},
	{
		name: "chat tool call chunk", ep: openai.ChatCompletions, inj: ReturnTokenIDs,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null,"token_ids":[5,6,7]}]}`,
		without: hdrChunk + `"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"chatcmpl-tool-1","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null,"token_ids":null}]}`,
	},
	{
		name: "chat last chunk", ep: openai.ChatCompletions, inj: ReturnTokenIDs | IncludeUsage | Logprobs,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[]}]}`,
		without: hdrChunk + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":null}]}`,
	},
	{
		name: "chat filler chunk only sent for ids", ep: openai.ChatCompletions, inj: ReturnTokenIDs,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":null,"token_ids":[151657]}]}`,
		without: "",
	},
	{
		name: "chat filler chunk only sent for ids and injected logprobs", ep: openai.ChatCompletions, inj: ReturnTokenIDs | Logprobs,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"<tool_call>","logprob":-0.5,"bytes":[60],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[151657]}]}`,
		without: "",
	},
	{
		// With the client's own logprobs vLLM sends a swallowed delta's
		// chunk to a direct call too (serving.py, 0.32.0: skipped only when
		// logprobs is None and return_token_ids is off): it stays.
		name: "chat filler chunk with the client's logprobs", ep: openai.ChatCompletions, inj: ReturnTokenIDs,
		with:    hdrChunk + `"choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"<tool_call>","logprob":-0.5,"bytes":[60],"top_logprobs":[]}]},"finish_reason":null,"token_ids":[151657]}]}`,
		without: hdrChunk + `"choices":[{"index":0,"delta":{},"logprobs":{"content":[{"token":"<tool_call>","logprob":-0.5,"bytes":[60],"top_logprobs":[]}]},"finish_reason":null,"token_ids":null}]}`,
	},
	{
		name: "chat usage chunk", ep: openai.ChatCompletions, inj: ReturnTokenIDs | IncludeUsage,
		with:    hdrChunk + `"choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`,
		without: "",
	},
	{
		name: "completions first chunk", ep: openai.Completions, inj: ReturnTokenIDs | IncludeUsage,
		with:    hdrCmpl + `"choices":[{"index":0,"text":"w","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2],"token_ids":[17]}],"usage":null}`,
		without: hdrCmpl + `"choices":[{"index":0,"text":"w","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}`,
	},
	{
		name: "completions later chunk with logprobs", ep: openai.Completions, inj: ReturnTokenIDs | IncludeUsage | Logprobs,
		with:    hdrCmpl + `"choices":[{"index":3,"text":"x","logprobs":{"tokens":["x"],"token_logprobs":[-1.5],"text_offset":[4],"top_logprobs":[{"x":-1.5}]},"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":[18]}],"usage":null}`,
		without: hdrCmpl + `"choices":[{"index":3,"text":"x","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}`,
	},
	{
		name: "completions usage chunk", ep: openai.Completions, inj: ReturnTokenIDs | IncludeUsage,
		with:    hdrCmpl + `"choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`,
		without: "",
	},
	{
		// vLLM sends the whole non-streaming object as one event with best_of != n.
		name: "completion object as one event", ep: openai.Completions, inj: ReturnTokenIDs | IncludeUsage,
		with:    chatBodyTrips[2].with,
		without: strings.NewReplacer(`"prompt_token_ids":[1,2],"token_ids":[3]`, `"prompt_token_ids":null,"token_ids":null`, `"prompt_token_ids":[1,2],"token_ids":[4]`, `"prompt_token_ids":null,"token_ids":null`).Replace(chatBodyTrips[2].with),
	},
	{
		name: "chat.completion object as one event", ep: openai.ChatCompletions, inj: ReturnTokenIDs,
		with:    chatBodyTrips[0].with,
		without: chatBodyTrips[0].without,
	},
}

func TestStripBodyRoundTrip(t *testing.T) {
	for _, rt := range chatBodyTrips {
		dst := []byte("PRE")
		got := StripBody(dst, []byte(rt.with), rt.ep, rt.inj)
		if string(got) != "PRE"+rt.without {
			t.Errorf("%s:\n got %s\nwant PRE%s", rt.name, got, rt.without)
		}
		// The engine would send "without" unchanged: nothing to strip there.
		if got := StripBody(nil, []byte(rt.without), rt.ep, rt.inj); string(got) != rt.without {
			t.Errorf("%s: stripping the plain body changed it: %s", rt.name, got)
		}
	}
}

func TestStripEventRoundTrip(t *testing.T) {
	for _, rt := range chatStreamTrips {
		out, drop := StripEvent([]byte("PRE"), []byte(rt.with), rt.ep, rt.inj)
		if rt.without == "" {
			if !drop {
				t.Errorf("%s: not dropped: %s", rt.name, out)
			}
			continue
		}
		if drop || string(out) != "PRE"+rt.without {
			t.Errorf("%s (drop %v):\n got %s\nwant PRE%s", rt.name, drop, out, rt.without)
		}
		if out, drop := StripEvent(nil, []byte(rt.without), rt.ep, rt.inj); drop || string(out) != rt.without {
			t.Errorf("%s: stripping the plain event changed it (drop %v): %s", rt.name, drop, out)
		}
	}
}

// TestStripClientAsked: with nothing injected (the client asked for ids,
// logprobs and usage itself) every byte reaches the client, and the input
// slice itself is returned.
func TestStripClientAsked(t *testing.T) {
	for _, rt := range append(append([]roundTrip{}, chatBodyTrips...), chatStreamTrips...) {
		in := []byte(rt.with)
		out, drop := StripEvent([]byte("PRE"), in, rt.ep, 0)
		if drop || &out[0] != &in[0] || len(out) != len(in) {
			t.Errorf("%s: StripEvent with inj=0 did not return the input", rt.name)
		}
		body := StripBody([]byte("PRE"), in, rt.ep, 0)
		if &body[0] != &in[0] || len(body) != len(in) {
			t.Errorf("%s: StripBody with inj=0 did not return the input", rt.name)
		}
	}
	// Only usage injected: ids the client asked for stay.
	ev := chatStreamTrips[1].with
	if out, drop := StripEvent(nil, []byte(ev), openai.ChatCompletions, IncludeUsage); drop || string(out) != ev {
		t.Fatalf("ids stripped although only include_usage was injected: %s", out)
	}
	// Only ids injected: the usage chunk the client asked for stays.
	ev = chatStreamTrips[8].with
	if out, drop := StripEvent(nil, []byte(ev), openai.ChatCompletions, ReturnTokenIDs); drop || string(out) != ev {
		t.Fatalf("usage chunk dropped although include_usage was the client's: %s", out)
	}
	// Only logprobs injected: ids stay, logprobs go.
	ev = hdrChunk + `"choices":[{"index":0,"delta":{"content":"w"},"logprobs":{"content":[]},"finish_reason":null,"token_ids":[17]}]}`
	want := hdrChunk + `"choices":[{"index":0,"delta":{"content":"w"},"logprobs":null,"finish_reason":null,"token_ids":[17]}]}`
	if out, _ := StripEvent(nil, []byte(ev), openai.ChatCompletions, Logprobs); string(out) != want {
		t.Fatalf("logprobs only:\n got %s\nwant %s", out, want)
	}
	// A filler chunk is the client's when it asked for ids itself.
	ev = chatStreamTrips[5].with
	if out, drop := StripEvent(nil, []byte(ev), openai.ChatCompletions, IncludeUsage|Logprobs); drop || string(out) != ev {
		t.Fatalf("filler chunk touched although ids were the client's: %s", out)
	}
}

func TestStripEventOtherPayloads(t *testing.T) {
	f := func(ep openai.Endpoint, data string) {
		t.Helper()
		out, drop := StripEvent(nil, []byte(data), ep, ReturnTokenIDs|IncludeUsage|Logprobs)
		if drop || string(out) != data {
			t.Fatalf("StripEvent(%q) = %q, drop %v; want it untouched", data, out, drop)
		}
	}
	f(openai.ChatCompletions, `[DONE]`)
	f(openai.ChatCompletions, `{"error":{"message":"boom","type":"BadRequestError","code":400}}`)
	f(openai.ChatCompletions, `{"object":"error","message":"flat"}`)
	f(openai.ChatCompletions, `{"choices":[{"token_ids":[1]`) // truncated: left alone
	f(openai.ChatCompletions, `{"choices":[1,{"token_ids":[1]},`)
	f(openai.ChatCompletions, ``)
	f(openai.Responses, hdrChunk+`"choices":[],"usage":{"prompt_tokens":1}}`)
	f(openai.Embeddings, `{"prompt_token_ids":[1]}`)
	f(openai.Completions, hdrCmpl+`"choices":[],"usage":null}`) // no usage: not the usage chunk
}

// TestStripDeleteShapes pins the comma handling of deletions (OmitIDs,
// SGLang) wherever the deleted keys sit.
func TestStripDeleteShapes(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		out, drop := StripEvent(nil, []byte(in), openai.ChatCompletions, ReturnTokenIDs|OmitIDs)
		if drop {
			t.Fatalf("StripEvent(%s) dropped", in)
		}
		if string(out) != want {
			t.Fatalf("StripEvent(%s)\n got %s\nwant %s", in, out, want)
		}
		if !gjson.Valid(string(out)) {
			t.Fatalf("invalid JSON %s", out)
		}
	}
	f(`{"prompt_token_ids":[1],"choices":[]}`, `{"choices":[]}`)
	f(`{"prompt_token_ids":[1]}`, `{}`)
	f(`{"choices":[{"token_ids":[1],"index":0,"finish_reason":"stop"}]}`, `{"choices":[{"index":0,"finish_reason":"stop"}]}`)
	f(`{"choices":[{"token_ids":[1],"prompt_token_ids":[2],"index":0,"finish_reason":"stop"}]}`, `{"choices":[{"index":0,"finish_reason":"stop"}]}`)
	f(`{"choices":[{"index":0,"token_ids":[1],"prompt_token_ids":[2],"finish_reason":"stop"}]}`, `{"choices":[{"index":0,"finish_reason":"stop"}]}`)
	f(`{"choices":[{"index":0,"finish_reason":"stop","token_ids":[1],"prompt_token_ids":[2]}]}`, `{"choices":[{"index":0,"finish_reason":"stop"}]}`)
	f(`{"choices":[{"token_ids":[1],"prompt_token_ids":[2]}]}`, `{"choices":[{}]}`)
	f(`{"choices":[{"finish_reason":"stop","token_ids":[1]},{"token_ids":[2],"finish_reason":"length"}],"prompt_token_ids":[3]}`,
		`{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}]}`)
	f("{\n \"choices\": [ {\n  \"finish_reason\": \"stop\" ,\n  \"token_ids\" : [1]\n } ] ,\n \"prompt_token_ids\": [ 2 ]\n}\n",
		"{\n \"choices\": [ {\n  \"finish_reason\": \"stop\"\n } ]\n}\n")
	f(`{"choices":[{"finish_reason":"stop","token_ids":null}]}`, `{"choices":[{"finish_reason":"stop"}]}`)
}

// TestStripOmittingEngines: engines that leave unasked keys out (SGLang's
// token ids, llama.cpp's logprobs) get the injected keys deleted, in bodies
// and in every kind of stream event, while other keys stay as they are.
func TestStripOmittingEngines(t *testing.T) {
	f := func(ep openai.Endpoint, inj Injected, event bool, in, want string) {
		t.Helper()
		var out []byte
		if event {
			var drop bool
			if out, drop = StripEvent(nil, []byte(in), ep, inj); drop {
				t.Fatalf("StripEvent(%s) dropped", in)
			}
		} else {
			out = StripBody(nil, []byte(in), ep, inj)
		}
		if string(out) != want {
			t.Fatalf("strip(%s)\n got %s\nwant %s", in, out, want)
		}
	}
	sg := ReturnTokenIDs | OmitIDs
	f(openai.ChatCompletions, sg, false, `{"choices":[{"index":0,"logprobs":null,"finish_reason":"stop","matched_stop":null,"prompt_token_ids":[1,2],"token_ids":[3]}],"usage":{}}`,
		`{"choices":[{"index":0,"logprobs":null,"finish_reason":"stop","matched_stop":null}],"usage":{}}`)
	f(openai.Completions, sg, false, `{"choices":[{"index":0,"text":"a","token_ids":[3],"prompt_token_ids":[1]},{"index":1,"text":"b","token_ids":[4],"prompt_token_ids":[1]}]}`,
		`{"choices":[{"index":0,"text":"a"},{"index":1,"text":"b"}]}`)
	f(openai.Completions, sg, true, `{"object":"text_completion","choices":[{"index":0,"text":" we","finish_reason":null,"token_ids":[328],"prompt_token_ids":[293]}],"usage":null}`,
		`{"object":"text_completion","choices":[{"index":0,"text":" we","finish_reason":null}],"usage":null}`)
	lc := Logprobs | OmitLogprobs
	f(openai.ChatCompletions, lc, false, `{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"x"},"logprobs":{"content":[{"id":5,"token":"x","logprob":-1}]}}],"object":"chat.completion"}`,
		`{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"x"}}],"object":"chat.completion"}`)
	f(openai.ChatCompletions, lc, true, `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"x"},"logprobs":{"content":[{"id":5,"token":"x","logprob":-1}]}}],"object":"chat.completion.chunk"}`,
		`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"x"}}],"object":"chat.completion.chunk"}`)
	// Without the Omit flags the same injections are set to null (vLLM).
	f(openai.ChatCompletions, Logprobs, false, `{"choices":[{"index":0,"logprobs":{"content":[]}}]}`, `{"choices":[{"index":0,"logprobs":null}]}`)
	f(openai.Completions, ReturnTokenIDs, false, `{"choices":[{"index":0,"token_ids":[3]}]}`, `{"choices":[{"index":0,"token_ids":null}]}`)
}

func TestStripBodyPretty(t *testing.T) {
	in := "{\n  \"object\": \"chat.completion\",\n  \"choices\": [\n    {\"token_ids\": [1, 2], \"logprobs\": {\"content\": []}}\n  ],\n  \"prompt_token_ids\": [3]\n}"
	want := "{\n  \"object\": \"chat.completion\",\n  \"choices\": [\n    {\"token_ids\": null, \"logprobs\": null}\n  ],\n  \"prompt_token_ids\": null\n}"
	if got := StripBody(nil, []byte(in), openai.ChatCompletions, ReturnTokenIDs|Logprobs); string(got) != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

func FuzzStripEvent(f *testing.F) {
	for _, rt := range chatStreamTrips {
		f.Add([]byte(rt.with), uint8(rt.ep), uint8(rt.inj), true)
	}
	for _, rt := range chatBodyTrips {
		f.Add([]byte(rt.with), uint8(rt.ep), uint8(rt.inj), false)
	}
	f.Add([]byte(`{"choices":[{"token_ids":[1],"x":{"token_ids":"]"}}]}`), uint8(openai.ChatCompletions), uint8(7), true)
	f.Fuzz(func(t *testing.T, data []byte, ep, inj uint8, event bool) {
		endpoint, flags := openai.Endpoint(ep%5), Injected(inj&0x3f) // with OmitIDs and OmitLogprobs
		var out []byte
		drop := false
		if event {
			out, drop = StripEvent(nil, data, endpoint, flags)
		} else {
			out = StripBody(nil, data, endpoint, flags)
		}
		if drop {
			if len(out) != 0 {
				t.Fatalf("dropped but wrote %q", out)
			}
			return
		}
		valid := gjson.ValidBytes(data)
		if valid && !gjson.ValidBytes(out) {
			t.Fatalf("strip(%q) = %q: invalid JSON from valid input", data, out)
		}
		if flags == 0 && string(out) != string(data) {
			t.Fatalf("inj=0 changed %q into %q", data, out)
		}
		// Stripping is idempotent.
		var again []byte
		if event {
			again, drop = StripEvent(nil, out, endpoint, flags)
		} else {
			again = StripBody(nil, out, endpoint, flags)
		}
		if valid && (drop || string(again) != string(out)) {
			t.Fatalf("not idempotent: %q -> %q -> %q (drop %v)", data, out, again, drop)
		}
	})
}

func BenchmarkStripEvent(b *testing.B) {
	ev := []byte(chatStreamTrips[2].with)
	dst := make([]byte, 0, len(ev))
	b.ReportAllocs()
	b.SetBytes(int64(len(ev)))
	for b.Loop() {
		out, drop := StripEvent(dst[:0], ev, openai.ChatCompletions, ReturnTokenIDs|IncludeUsage|Logprobs)
		if drop || len(out) == 0 {
			b.Fatal("unexpected drop")
		}
	}
}

func BenchmarkStripBody(b *testing.B) {
	body := []byte(chatBodyTrips[1].with)
	dst := make([]byte, 0, len(body))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if out := StripBody(dst[:0], body, openai.ChatCompletions, ReturnTokenIDs|Logprobs); len(out) == 0 {
			b.Fatal("empty")
		}
	}
}

func TestStripAllocs(t *testing.T) {
	ev := []byte(chatStreamTrips[2].with)
	body := []byte(chatBodyTrips[1].with)
	dst := make([]byte, 0, len(body))
	allocs := testing.AllocsPerRun(100, func() {
		out, drop := StripEvent(dst[:0], ev, openai.ChatCompletions, ReturnTokenIDs|IncludeUsage|Logprobs)
		if drop || string(out) != chatStreamTrips[2].without {
			t.Fatalf("StripEvent = %s", out)
		}
		if out := StripBody(dst[:0], body, openai.ChatCompletions, ReturnTokenIDs|Logprobs); string(out) != chatBodyTrips[1].without {
			t.Fatalf("StripBody = %s", out)
		}
	})
	if allocs != 0 {
		t.Fatalf("stripping allocates %v times per call, want 0", allocs)
	}
}

// BenchmarkStripEventKinds is StripEvent on the chunks a vLLM chat stream is
// made of, with the flags the gateway injects: a content chunk carrying ids
// to delete (every chunk when return_token_ids was injected), the same chunk
// when only include_usage was injected (nothing to strip: the common case
// when the client asked for ids itself), and the final usage chunk (dropped).
func BenchmarkStripEventKinds(b *testing.B) {
	for _, tc := range []struct {
		name string
		ev   string
		inj  Injected
		drop bool
	}{
		{"ids", chatStreamTrips[1].with, ReturnTokenIDs | IncludeUsage, false},
		{"nothing", chatStreamTrips[1].without, IncludeUsage, false},
		{"usage", hdrChunk + `"choices":[],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2}}`, ReturnTokenIDs | IncludeUsage, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ev := []byte(tc.ev)
			dst := make([]byte, 0, len(ev))
			b.ReportAllocs()
			b.SetBytes(int64(len(ev)))
			for b.Loop() {
				if _, drop := StripEvent(dst[:0], ev, openai.ChatCompletions, tc.inj); drop != tc.drop {
					b.Fatal("drop")
				}
			}
		})
	}
}

// TestHeadSet: Head takes the head vLLM and SGLang repeat (id, object,
// created, model, each followed by a comma), and nothing else; a chunk
// starting with it is stripped as StripEvent strips it.
func TestHeadSet(t *testing.T) {
	const vllm = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m",`
	var h Head
	h.Set([]byte(vllm))
	if !h.Matches([]byte(vllm)) {
		t.Fatal("the vLLM head was not taken")
	}
	for _, bad := range []string{
		`{"id":"c","prompt_token_ids":[1],`,     // a member the stripper edits
		`{"id":"c","object":"chat.completion",`, // the non-streaming rule
		`{"id":"c","model":"m"`,                 // no comma after the last member
		`{"id":"c",,`, `{"id" "c",`, `{"id":,`, `[1,`, `{`, ``,
	} {
		h.Set([]byte(bad))
		if h.Matches([]byte(bad)) {
			t.Errorf("head %q taken", bad)
		}
	}
	h.Set([]byte(vllm))
	for _, rt := range chatStreamTrips {
		data := []byte(rt.with)
		if rt.ep != openai.ChatCompletions || !bytes.HasPrefix(data, []byte(vllm)) {
			continue
		}
		got, gotDrop := StripEventHead(nil, data, rt.ep, rt.inj, &h)
		want, wantDrop := StripEvent(nil, data, rt.ep, rt.inj)
		if gotDrop != wantDrop || !bytes.Equal(got, want) {
			t.Errorf("%q: StripEventHead %q (drop %v), StripEvent %q (drop %v)", data, got, gotDrop, want, wantDrop)
		}
	}
	data := []byte(vllm + `"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":[7]}],"prompt_token_ids":[1,2]}`)
	got, _ := StripEventHead(nil, data, openai.ChatCompletions, ReturnTokenIDs|IncludeUsage, &h)
	if want := vllm + `"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null,"token_ids":null}],"prompt_token_ids":null}`; string(got) != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	dst := make([]byte, 0, len(data))
	if n := testing.AllocsPerRun(100, func() { StripEventHead(dst, data, openai.ChatCompletions, ReturnTokenIDs|IncludeUsage, &h) }); n != 0 {
		t.Fatalf("%v allocations per StripEventHead, want 0", n)
	}
}
