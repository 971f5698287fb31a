package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

func TestMessagesToChat(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got, _, err := messagesToChat([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if string(got) != want {
			t.Fatalf("%s:\ngot  %s\nwant %s", in, got, want)
		}
	}
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"metadata":{"user_id":"u"}}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`)
	// System blocks joined as vLLM joins them; stop, sampling, streaming.
	f(`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a"},{"type":"text","text":"b","cache_control":{"type":"ephemeral"}}],"stop_sequences":["x"],"temperature":0.5,"top_p":1,"top_k":3,"stream":true,"messages":[{"role":"user","content":"<hi>"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"ab"},{"role":"user","content":"<hi>"}],"max_tokens":5,"stop":["x"],"stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"top_p":1,"top_k":3}`)
	// A tool round trip: thinking as reasoning, tool_use input as Python's
	// json.dumps writes it, the tool result ahead of the user's text.
	f(`{"model":"m","max_tokens":5,"tools":[{"name":"w","input_schema":{"type":"object"},"strict":true}],"tool_choice":{"type":"tool","name":"w","disable_parallel_tool_use":true},"messages":[`+
		`{"role":"user","content":"q"},`+
		`{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"w","input":{"city":"Zürich","n":[1,2],"s":"a,b: c\"d"}}]},`+
		`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"r1"},{"type":"text","text":"r2"},{"type":"image","source":{"type":"url","url":"http://i/x.png"}}]},{"type":"text","text":"more"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":"ok","reasoning":"hm","tool_calls":[{"id":"t1","type":"function","function":{"name":"w","arguments":"{\"city\": \"Z\\u00fcrich\", \"n\": [1, 2], \"s\": \"a,b: c\\\"d\"}"}}]},`+
			`{"role":"tool","content":"r1\nr2","tool_call_id":"t1"},{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://i/x.png"}}]},{"role":"user","content":"more"}],`+
			`"max_tokens":5,"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"},"strict":true}}],"tool_choice":{"function":{"name":"w"},"type":"function"},"parallel_tool_calls":false}`)
	// Only tool results: no empty user message. Images as data URLs.
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"x"}]},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`,
		`{"model":"m","messages":[{"role":"tool","content":"x","tool_call_id":"t"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}],"max_tokens":5}`)
	f(`{"model":"m","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":2000,"chat_template_kwargs":{"enable_thinking":true},"thinking_token_budget":1024}`)
	f(`{"model":"m","max_tokens":5,"thinking":{"type":"disabled"},"tools":[{"name":"w","description":"d","input_schema":{}}],"messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}],"max_tokens":5,"tools":[{"type":"function","function":{"name":"w","description":"d","parameters":{}}}],"tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false}}`)
}

// TestMessagesToChatRefuses: what the translation cannot express is an
// error naming the field, never dropped.
func TestMessagesToChatRefuses(t *testing.T) {
	f := func(in, field string) {
		t.Helper()
		_, _, err := messagesToChat([]byte(in))
		var me *messagesError
		if !errors.As(err, &me) || me.Field != field {
			t.Fatalf("%s: %v, want an error naming %s", in, err, field)
		}
	}
	msg := `"messages":[{"role":"user","content":"q"}]`
	f(`{"max_tokens":5,`+msg+`}`, "model")
	f(`{"model":"m",`+msg+`}`, "max_tokens")
	f(`{"model":"m","max_tokens":0,`+msg+`}`, "max_tokens")
	f(`{"model":"m","max_tokens":1.5,`+msg+`}`, "max_tokens")
	f(`{"model":"m","max_tokens":5,"n":2,`+msg+`}`, `"n"`)
	f(`{"model":"m","max_tokens":5,"temperature":3,`+msg+`}`, "temperature")
	f(`{"model":"m","max_tokens":5,"top_k":1.5,`+msg+`}`, "top_k")
	f(`{"model":"m","max_tokens":5,"stream":"yes",`+msg+`}`, "stream")
	f(`{"model":"m","max_tokens":5,"messages":[]}`, "messages")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"system","content":"q"}]}`, "messages[0].role")
	f(`{"model":"m","max_tokens":5,"system":[{"type":"image"}],`+msg+`}`, "system[0]")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document"}]}]}`, "messages[0].content[0].type")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"redacted_thinking","data":"x"}]}]}`, "messages[0].content[0].type")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"x"}]}]}`, "messages[0].content[0].type")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"x","name":"y"}]}]}`, "messages[0].content[0].type")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","name":"y"}]}]}`, "messages[0].content[0]")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"x","name":"y","input":[1]}]}]}`, "messages[0].content[0].input")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","is_error":true,"content":"e"}]}]}`, "messages[0].content[0].is_error")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"x","content":[{"type":"document"}]}]}]}`, "messages[0].content[0].content[0].type")
	f(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages[0].content[0].source")
	f(`{"model":"m","max_tokens":5,"tools":[{"type":"bash_20250124","name":"bash"}],`+msg+`}`, "tools[0].type")
	f(`{"model":"m","max_tokens":5,"tools":[{"name":"w"}],`+msg+`}`, "tools[0].input_schema")
	f(`{"model":"m","max_tokens":5,"tools":[{"name":"w","input_schema":{},"strict":1}],`+msg+`}`, "tools[0].strict")
	f(`{"model":"m","max_tokens":5,"tools":[{"name":"w","input_schema":{},"input_examples":[]}],`+msg+`}`, "tools[0].input_examples")
	f(`{"model":"m","max_tokens":5,"tool_choice":{"type":"tool"},`+msg+`}`, "tool_choice.name")
	f(`{"model":"m","max_tokens":5,"tool_choice":{"type":"some"},`+msg+`}`, "tool_choice.type")
	f(`{"model":"m","max_tokens":5,"thinking":{"type":"enabled","budget_tokens":1024},`+msg+`}`, "thinking.budget_tokens")
	f(`{"model":"m","max_tokens":5,"thinking":{"type":"on"},`+msg+`}`, "thinking.type")
}

func TestChatToMessage(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got, err := chatToMessage([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Fatalf("%s:\ngot  %s\nwant %s", in, got, want)
		}
	}
	f(`{"id":"c1","model":"m","choices":[{"message":{"role":"assistant","content":"hi","reasoning":"r"},"finish_reason":"stop","stop_reason":null,"token_ids":[1]}],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`,
		`{"id":"c1","type":"message","role":"assistant","content":[{"type":"thinking","thinking":"r","signature":""},{"type":"text","text":"hi"}],"model":"m","stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":4}}`)
	f(`{"id":"c2","model":"m","choices":[{"message":{"content":null,"tool_calls":[{"id":"t","function":{"name":"w","arguments":"{\"a\": 1}"}},{"id":"u","function":{"name":"v","arguments":"oops"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":3,"completion_tokens":4}}`,
		`{"id":"c2","type":"message","role":"assistant","content":[{"type":"tool_use","id":"t","name":"w","input":{"a":1}},{"type":"tool_use","id":"u","name":"v","input":{}}],"model":"m","stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":4}}`)
	f(`{"id":"c3","model":"m","choices":[{"message":{"content":""},"finish_reason":"stop","stop_reason":"END"}]}`,
		`{"id":"c3","type":"message","role":"assistant","content":[{"type":"text","text":""}],"model":"m","stop_reason":"stop_sequence","stop_sequence":"END","usage":{"input_tokens":0,"output_tokens":0}}`)
	f(`{"id":"c4","model":"m","choices":[{"message":{"content":"x"},"finish_reason":"length"}]}`,
		`{"id":"c4","type":"message","role":"assistant","content":[{"type":"text","text":"x"}],"model":"m","stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}`)
}

// chatStream is a vLLM chat stream with reasoning, text and two tool calls.
const chatStream = `data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"reasoning":"think"}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"Hel"}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"content":"lo"}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"w","arguments":""}}]}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"a\": 1}"}}]}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"t2","type":"function","function":{"name":"v","arguments":"{}"}}]}}]}

data: {"id":"c","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}

data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9}}

data: [DONE]

`

const messagesWant = `event: message_start
data: {"type":"message_start","message":{"id":"c","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"think"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":""}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Hel"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"lo"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"t1","name":"w","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"a\": 1}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: content_block_start
data: {"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"t2","name":"v","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"input_json_delta","partial_json":"{}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":3}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"input_tokens":7,"output_tokens":9}}

event: message_stop
data: {"type":"message_stop"}

`

// chunked reads its data n bytes at a time.
type chunked struct {
	b []byte
	n int
}

func (c *chunked) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	k := min(c.n, len(p), len(c.b))
	copy(p, c.b[:k])
	c.b = c.b[k:]
	return k, nil
}

func TestMessagesStream(t *testing.T) {
	for _, n := range []int{1, 7, 1 << 20} {
		got, err := io.ReadAll(newMessagesStream(&chunked{b: []byte(chatStream), n: n}))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != messagesWant {
			t.Fatalf("read %d at a time:\n%s", n, got)
		}
	}
	// Cut before the finish: an error event, no message_stop.
	cut := chatStream[:strings.Index(chatStream, `data: {"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls"`)]
	got, _ := io.ReadAll(newMessagesStream(&chunked{b: []byte(cut), n: 5}))
	if !bytes.HasSuffix(got, []byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"the engine's stream ended before the message was finished\"}}\n\n")) {
		t.Fatalf("cut stream:\n%s", got)
	}
	// The engine's error event.
	got, _ = io.ReadAll(newMessagesStream(strings.NewReader(`data: {"error":{"message":"boom","type":"BadRequestError","code":400}}` + "\n\n")))
	if string(got) != "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"boom\"}}\n\n" {
		t.Fatalf("error event:\n%s", got)
	}
}

// FuzzMessagesToChat: any body is refused with a named field or translated
// to a chat request with a model, messages and a positive max_tokens.
func FuzzMessagesToChat(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a"}],"tools":[{"name":"w","input_schema":{}}],"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"w","input":{"k":"\u00e9\ud83d\ude00"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]}]}`,
		`{"model":"m","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"x"}]}]}`,
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA"}}]}]}`,
		`[]`, `{}`, `{"model":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		chat, _, err := messagesToChat(body)
		if err != nil {
			var me *messagesError
			if !errors.As(err, &me) || me.Field == "" || me.Msg == "" {
				t.Fatalf("%q: error %v names no field", body, err)
			}
			return
		}
		if !json.Valid(chat) {
			t.Fatalf("%q: not JSON: %s", body, chat)
		}
		r := gjson.ParseBytes(chat)
		if r.Get("model").String() == "" || !r.Get("messages").IsArray() || r.Get("max_tokens").Int() < 1 {
			t.Fatalf("%q: translated to %s", body, chat)
		}
		for _, m := range r.Get("messages").Array() {
			if tc := m.Get("tool_calls"); tc.Exists() {
				for _, c := range tc.Array() {
					if a := c.Get("function.arguments").String(); !gjson.Valid(a) || !gjson.Parse(a).IsObject() {
						t.Fatalf("%q: arguments %q are not a JSON object", body, a)
					}
				}
			}
		}
	})
}

// FuzzMessagesStream: any engine stream becomes well-formed events (each
// named as its JSON data's type), ending in message_stop or an error.
func FuzzMessagesStream(f *testing.F) {
	f.Add([]byte(chatStream))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":5}]},\"finish_reason\":\"stop\"}]}\n\n"))
	f.Add([]byte("data: [DONE]\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		n := 1 + len(in)%7 // read sizes vary with the input
		out, err := io.ReadAll(newMessagesStream(&chunked{b: in, n: n}))
		if err != nil {
			t.Fatal(err)
		}
		evs := strings.Split(string(out), "\n\n")
		if len(evs) < 2 || evs[len(evs)-1] != "" {
			t.Fatalf("%q -> %q: not whole events", in, out)
		}
		for _, e := range evs[:len(evs)-1] {
			name, data, ok := strings.Cut(e, "\ndata: ")
			if !ok || !strings.HasPrefix(name, "event: ") || !json.Valid([]byte(data)) || gjson.Get(data, "type").String() != name[7:] {
				t.Fatalf("%q -> bad event %q", in, e)
			}
		}
		last := evs[len(evs)-2]
		if !strings.HasPrefix(last, "event: message_stop") && !strings.HasPrefix(last, "event: error") {
			t.Fatalf("%q -> ends with %q", in, last)
		}
	})
}
