package air

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/jsonscan"
)

// parseSeeds are response messages, usual and hostile, on which parse must
// decode what encoding/json decodes.
var parseSeeds = []string{
	// the usual shapes
	`{"role":"assistant","content":"answer"}`,
	`{"role":"assistant","content":""}`,
	`{"role":"tool","tool_call_id":"c1","content":"Error: city not found"}`,
	`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}`,
	`{"role":"assistant","content":"x","tool_calls":[]}`,
	`{"role":"assistant","content":"x","refusal":null,"annotations":[],"audio":null,"function_call":null,"tool_calls":null,"reasoning_content":"think"}`,
	// content as a list of parts, and other values kept raw
	`{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"data:x"}}]}`,
	`{"content":[ {"type" : "text" , "text":"a\nb"} ,{"text":"c"}] }`,
	`{"content":{"a":[1,2,{"b":null}]}}`, `{"content":-1.5e+300}`, `{"content":true}`, `{"content":"\u00e9\ud83d\ude00"}`,
	// several tool calls, with and without ids and functions
	`{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}},{"id":"b","function":{"name":"g","arguments":"[1,"}},{"function":null},{"id":null},{}]}`,
	`{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":"{\"q\": \"\\\"x\\\"\"}","extra":[{}]}}]}`,
	// keys in other cases, escaped, folded, unknown
	`{"ROLE":"user","Content":"x","TOOL_CALL_ID":"i","Tool_Calls":[{"ID":"a","FUNCTION":{"NAME":"n","Arguments":"{}"}}]}`,
	`{"r\u006fle":"user","\u0063ontent":"x"}`, `{"rol\u0045":"user"}`, `{"tool_call\u017f":[{"id":"a"}]}`,
	`{"tool_callſ":[{"id":"a"}],"argumentſ":"x"}`, `{"tool_calls":[{"function":{"argumentſ":"x","name":"n"}}]}`,
	`{"rôle":"x","role":"y"}`, `{"role ":"x"," role":"y","rolex":"z","":"e"}`,
	// duplicate keys, the last wins (and arrays and objects merge)
	`{"role":"a","role":"b"}`, `{"role":"a","ROLE":"b"}`, `{"role":"a","role":null}`, `{"role":"a","role":5}`,
	`{"content":"a","content":[1]}`, `{"content":"a","Content":null}`,
	`{"tool_calls":[{"id":"a","function":{"name":"x"}}],"tool_calls":[{"function":{"arguments":"y"}}]}`,
	`{"tool_calls":[{"id":"a"},{"id":"b"}],"tool_calls":[{"id":"c"}]}`, `{"tool_calls":[{"id":"a"}],"tool_calls":[]}`,
	`{"tool_calls":[{"id":"a"}],"tool_calls":null}`, `{"tool_calls":[{"id":"a","id":"b","function":{"name":"x"},"function":{"arguments":"y"}}]}`,
	// escapes and invalid UTF-8 in values
	`{"role":"a\"b\\c\/d\be\ff\ng\rh\ti\u0000j\u00e9\u20AC"}`,
	`{"role":"\ud83d\ude00 \ud83d \ude00 \ud83d\u0041 \ud83d\ud83d\ude00 \udfff\ud800"}`,
	"{\"role\":\"a\xffb\xc3\",\"tool_call_id\":\"\xed\xa0\x80\xef\xbf\xbd\"}", "{\"content\":\"\xff\\u00e9\xfe\"}",
	"{\"role\":\"\xc3\xa9\\n\xf0\x9f\x98\"}", "{\"role\":\"\xe2\x82\xac\"}",
	// values of other types
	`{"role":5,"content":"x"}`, `{"role":{},"content":"x"}`, `{"role":[],"content":"x"}`, `{"role":true,"content":"x"}`,
	`{"tool_calls":{},"role":"r"}`, `{"tool_calls":"x","role":"r"}`, `{"tool_calls":[5,{"id":"a"}],"role":"r"}`,
	`{"tool_calls":[null,{"id":"a"}]}`, `{"tool_calls":[{"id":5,"function":{"name":"n"}}]}`, `{"tool_calls":[{"function":"f"}]}`,
	`{"tool_calls":[{"function":{"name":["n"],"arguments":{"a":1}}}]}`, `{"tool_calls":[[]]}`,
	// nulls
	`{"role":null,"content":null,"tool_call_id":null,"tool_calls":null}`, `{"tool_calls":[{"id":null,"function":{"name":null,"arguments":null}}]}`,
	// whitespace everywhere
	" \t\r\n{ \"role\" \n:\t\"assistant\" ,\r\n \"content\" : [ 1 , { \"a\" : \"b\" } ] , \"tool_calls\" : [ { \"id\" : \"x\" , \"function\" : { \"name\" : \"f\" } } ] } \n",
	`{"content" : "  spaced  " }`,
	// not an object, truncated, invalid
	``, ` `, `null`, `"role"`, `[{"role":"a"}]`, `5`, `true`,
	`{"role":"a"`, `{"role":"a",}`, `{"role":"a"}}`, `{"role":"a"} x`, `{"role":"a" "content":"b"}`, `{"role" "a"}`,
	`{"role":"a","content":[1,]}`, `{"role":"a","content":01}`, `{"role":"a","content":"\x"}`, "{\"role\":\"a\x01\"}",
	`{"role":"a","content":tru}`, `{"role":"a","content":nul}`, `{"role":nul}`, `{"role":"a","x":-}`, `{"role":"\u12G4"}`,
	`{"role":"a","tool_calls":[{"id":"b"}`, `{"tool_calls":[{"id":"b"},]}`, `{"tool_calls":[{"id":"b"} {"id":"c"}]}`,
	"\xef\xbb\xbf{\"role\":\"a\"}", `{'role':'a'}`, `{role:"a"}`,
	// huge numbers
	`{"content":1e99999,"role":"a"}`, `{"content":123456789012345678901234567890,"x":-0.0000000000000000000001e-400}`,
	`{"role":1e400}`, `{"tool_calls":[{"id":99999999999999999999999}]}`,
}

// benchMessages are response messages of the shapes the bridge reads: a
// short answer, a 2 KB answer (escaped newlines and quotes, the null and
// empty fields an OpenAI-compatible server adds) and two tool calls.
func benchMessages() []struct{ name, msg string } {
	var long strings.Builder
	for long.Len() < 2048 {
		long.WriteString(`The forecast for Paris says \"sunny\", 24 °C in the afternoon; wind from the west at 10 km/h.\n`)
	}
	return []struct{ name, msg string }{
		{"small", `{"role":"assistant","content":"answer"}`},
		{"content2KB", `{"role":"assistant","content":"` + long.String() + `","refusal":null,"annotations":null,` +
			`"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":null}`},
		{"toolCalls", `{"role":"assistant","content":null,"tool_calls":[` +
			`{"id":"chatcmpl-tool-3f1c2b7e9a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\", \"unit\": \"c\"}"}},` +
			`{"id":"chatcmpl-tool-8d0e4a6b1c","type":"function","function":{"name":"search","arguments":"{\"q\": \"weather Paris tomorrow\", \"n\": 3}"}}]}`},
	}
}

// BenchmarkParse times parse, and json.Unmarshal of the response message
// alone, on each message of benchMessages.
func BenchmarkParse(b *testing.B) {
	for _, m := range benchMessages() {
		c := &export.Call{ResponseMessage: m.msg}
		b.Run(m.name+"/encoding_json", func(b *testing.B) {
			b.SetBytes(int64(len(m.msg)))
			b.ReportAllocs()
			for b.Loop() {
				var msg message
				_ = json.Unmarshal([]byte(c.ResponseMessage), &msg)
			}
		})
		b.Run(m.name+"/parse", func(b *testing.B) {
			b.SetBytes(int64(len(m.msg)))
			b.ReportAllocs()
			for b.Loop() {
				parse(c)
			}
		})
	}
}

// FuzzParseMatchesEncodingJSON: parse decodes every response message as
// json.Unmarshal does (the message it leaves when it fails too). What the
// fast path accepts is valid JSON, and its result shares no memory with
// the input.
func FuzzParseMatchesEncodingJSON(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add(s)
	}
	for _, m := range benchMessages() {
		f.Add(m.msg)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want message
		_ = json.Unmarshal([]byte(s), &want)
		got := parse(&export.Call{ResponseMessage: s}).msg
		if !reflect.DeepEqual(got, want) || !bytes.Equal(got.Content, want.Content) {
			t.Fatalf("%q:\nparse         %#v\nencoding/json %#v", s, got, want)
		}
		var fast message
		if fastMessage(jsonscan.Bytes(s), &fast) {
			if !json.Valid([]byte(s)) {
				t.Fatalf("%q: the fast path accepted invalid JSON", s)
			}
			if !reflect.DeepEqual(fast, want) {
				t.Fatalf("%q:\nfast path     %#v\nencoding/json %#v", s, fast, want)
			}
			if jsonscan.Offset(s, jsonscan.String(fast.Content)) >= 0 {
				t.Fatalf("%q: the content shares the input's memory", s)
			}
		}
	})
}

// TestFastPath: the usual shapes take the fast path (or parse is no
// faster), and what it sends to encoding/json it does send there.
func TestFastPath(t *testing.T) {
	fast := []string{
		`{"role":"assistant","content":"answer"}`, `{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"hi"}]}`,
		`{"ROLE":"user","Content":"x","TOOL_CALL_ID":"i","Tool_Calls":[{"ID":"a","FUNCTION":{"NAME":"n","Arguments":"{}"}}]}`,
		`{"role":"\ud83d\ude00\u00e9\n","content":"x","unknown":{"role":5},"tool_calls":[{"id":null,"function":null},{}]}`,
	}
	for _, m := range benchMessages() {
		fast = append(fast, m.msg)
	}
	for _, s := range fast {
		var m message
		if !fastMessage(jsonscan.Bytes(s), &m) {
			t.Errorf("%q: not the fast path", s)
		}
	}
	for _, s := range []string{
		`{"role":"a","role":"b"}`, `{"r\u006fle":"a"}`, `{"tool_callſ":[]}`, `{"rôle":"a"}`, `{"role":5}`, `{"tool_calls":{}}`,
		`{"tool_calls":[null]}`, `{"tool_calls":[{"function":"f"}]}`, `{"role":"a"} x`, `[]`, `null`,
	} {
		var m message
		if fastMessage(jsonscan.Bytes(s), &m) {
			t.Errorf("%q: the fast path took it", s)
		}
	}
}

// TestParseDepth: encoding/json rejects a text nested deeper than 10000
// levels (the message stays zero) and parse with it, and neither goes deep
// into the stack on an input of many openings.
func TestParseDepth(t *testing.T) {
	nested := func(depth int) string { // the message object is one level
		return `{"role":"a","content":` + strings.Repeat("[", depth-1) + strings.Repeat("]", depth-1) + `}`
	}
	for _, s := range []string{
		nested(maxDepth), nested(maxDepth + 1), `{"role":"a","content":` + strings.Repeat("[", 1<<20),
		`{"role":"a","x":"` + strings.Repeat(`\"[`, maxDepth+1) + `","content":` + strings.Repeat("{\"a\":", 100) + "1" + strings.Repeat("}", 100) + `}`,
	} {
		var want message
		_ = json.Unmarshal([]byte(s), &want)
		got := parse(&export.Call{ResponseMessage: s}).msg
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%.40q... (%d bytes): parse %.40q, encoding/json %.40q", s, len(s), got.Content, want.Content)
		}
	}
	if parse(&export.Call{ResponseMessage: nested(maxDepth)}).msg.Role != "a" || parse(&export.Call{ResponseMessage: nested(maxDepth + 1)}).msg.Role != "" {
		t.Error("the depth limit is not encoding/json's")
	}
}

// FuzzTextMatchesEncodingJSON: text reads every content as textDecoded
// (encoding/json) does.
func FuzzTextMatchesEncodingJSON(f *testing.F) {
	for _, s := range []string{
		``, `null`, `""`, `"answer"`, `"a\nb\"c\\d\/e\u00e9\ud83d\ude00 \ud83d \udfff"`, "\"\xff\xc3(\"", "\"\x01\"", `"\x"`,
		` "x"`, `"x" `, `"x`, `"a"b"`, `"a""b"`, `5`, `[{"type":"text","text":"a"},{"text":"b"}]`, `[1]`, `{"text":"a"}`, `"\u12G4"`,
		`"assistant"`, `"` + strings.Repeat(`Error: x\n`, 100) + `"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, content string) {
		m := message{Content: json.RawMessage(content)}
		if got, want := m.text(), m.textDecoded(); got != want {
			t.Fatalf("%q: text %q, encoding/json %q", content, got, want)
		}
	})
}
