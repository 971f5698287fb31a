package air

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/jsonscan"
)

// agenticTools are the tool declarations of agenticRequest (those of the
// trainer bridge's agentic benchmark data).
const agenticTools = `[{"type":"function","function":{"name":"run_shell","description":"Run a shell command in the repository and return its standard output and standard error.","parameters":{"type":"object","properties":{"command":{"type":"string","description":"the command line"}},"required":["command"]}}},` +
	`{"type":"function","function":{"name":"read_file","description":"Read a file of the repository, fifty lines from a line offset.","parameters":{"type":"object","properties":{"path":{"type":"string"},"offset":{"type":"integer"}},"required":["path"]}}}]`

// agenticRequest is the request body of turn turn (0..4) of
// agenticAttempt (turn 4: about 5 kB).
func agenticRequest(turn int) string { return agenticAttempt()[turn].RequestBody }

// agenticAttempt is the five calls of a coding agent's attempt, as the
// trainer bridge's agentic benchmark data has them: turn t's request holds
// a system and a user message, then per earlier turn the assistant's
// reasoning and tool call and the tool's result, the tools declared, and
// sampling options; turns 0..3 call a tool, turn 4 answers.
func agenticAttempt() []export.Call {
	words := strings.Fields(`the a of to in and is for file function return value test tests module import class def
		self config options list dict string index parse input output result check update fix line lines call args path
		src main util handler request response json field name count let me look at now then so this that should we
		need change passed ok = == + ( ) [ ] { } 0 1 42 None True False len range if else print assert x y i n data items key`)
	seed := uint32(1)
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			seed = seed*1664525 + 1013904223
			b.WriteString(words[int(seed>>8)%len(words)])
		}
		return b.String()
	}
	msgs := []string{`{"role":"system","content":"You are a coding agent. ` + text(800) + `"}`,
		`{"role":"user","content":"Task 7: ` + text(500) + `"}`}
	var calls []export.Call
	for t := range 5 {
		body := `{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[` + strings.Join(msgs, ",") + `],"tools":` + agenticTools +
			`,"temperature":1.0,"top_p":1.0,"max_tokens":2048,"logprobs":true}`
		if t == 4 {
			calls = append(calls, call("a", uint64(t+1), 0, body, `{"role":"assistant","content":"`+text(700)+`"}`, "stop"))
			break
		}
		id := "call_r000007_" + strconv.Itoa(t)
		args := `{\"command\":\"sed -n ` + strconv.Itoa(50*t+1) + `,` + strconv.Itoa(50*t+50) + `p src/util/config.py\"}`
		name := "run_shell"
		if t%2 == 1 {
			args, name = `{\"path\":\"src/main/handler.py\",\"offset\":`+strconv.Itoa(50*t)+`}`, "read_file"
		}
		resp := `{"role":"assistant","content":"` + text(350) + `","tool_calls":[{"id":"` + id +
			`","type":"function","function":{"name":"` + name + `","arguments":"` + args + `"}}]}`
		calls = append(calls, call("a", uint64(t+1), 0, body, resp, "tool_calls"))
		msgs = append(msgs, resp, `{"role":"tool","tool_call_id":"`+id+`","content":"`+text(200)+`"}`)
	}
	return calls
}

// benchRequests are request bodies of the shapes the bridge reads: a small
// request (a user turn, a tool call and its result, two tools declared) and
// the last turn of an agentic conversation (about 5 kB).
func benchRequests() []struct{ name, body string } {
	return []struct{ name, body string }{
		{"small", req("c1", "Error: city not found")},
		{"agentic5KB", agenticRequest(4)},
	}
}

// BenchmarkRequest times, on each body of benchRequests, request with a
// cache that holds the body's tool declarations (as an Engine's does after
// the first request of a run), request without a cache, and decodeRequest
// (encoding/json), on a new parsed value each time (request reads a body
// once).
func BenchmarkRequest(b *testing.B) {
	for _, r := range benchRequests() {
		c := &export.Call{RequestBody: r.body}
		decls := &declCache{}
		for _, v := range []struct {
			name string
			read func()
		}{
			{"request", func() { p := parsed{c: c}; p.request(decls) }},
			{"uncached", func() { p := parsed{c: c}; p.request(nil) }},
			{"encoding_json", func() { decodeRequest(c.RequestBody) }},
		} {
			b.Run(r.name+"/"+v.name, func(b *testing.B) {
				b.SetBytes(int64(len(r.body)))
				b.ReportAllocs()
				for b.Loop() {
					v.read()
				}
			})
		}
	}
}

// BenchmarkEvaluateAgentic times Evaluate on agenticAttempt (no hits).
func BenchmarkEvaluateAgentic(b *testing.B) { benchEvaluate(b, agenticAttempt()) }

// benchEvaluate times Evaluate (the default rules) on calls.
func benchEvaluate(b *testing.B, calls []export.Call) {
	e, _ := New(DefaultConfig())
	b.ReportAllocs()
	for b.Loop() {
		e.Evaluate(calls, 0)
	}
}

// TestBenchRequests: the benchmark's bodies are valid and of their sizes,
// and the agentic attempt hits no rule.
func TestBenchRequests(t *testing.T) {
	for _, r := range benchRequests() {
		p := parsed{c: &export.Call{RequestBody: r.body}}
		p.request(nil)
		if !json.Valid([]byte(r.body)) || len(p.reqMsgs) < 3 || !p.toolsSeen || len(p.tools) != 2 {
			t.Errorf("%s: valid %v, %d messages, tools %v", r.name, json.Valid([]byte(r.body)), len(p.reqMsgs), p.tools)
		}
	}
	if n := len(agenticRequest(4)); n < 4800 || n > 5300 {
		t.Errorf("agentic request of %d bytes", n)
	}
	e, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if rs := e.Evaluate(agenticAttempt(), 0); len(rs) > 0 {
		t.Errorf("agentic attempt: AIR hits %+v", rs)
	}
}

// requestSeeds are request bodies, usual and hostile, on which request must
// decode what encoding/json decodes.
func requestSeeds() []string {
	seeds := []string{
		// the usual shapes
		req(), req("c1", "Error: city not found"), req("c1", "ok", "c2", `{"temp": 20}`),
		agenticRequest(0), agenticRequest(1), agenticRequest(2),
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":[{"type":"text","text":"Error: "},{"type":"text","text":"x"}]}],"tools":[]}`,
		`{"messages":[],"tools":[{"type":"function","function":{"name":"f"}}],"stream":true,"n":2}`,
		`{"tools":null,"messages":null}`, `{"messages":[null,{"role":"user"},null]}`, `{}`, ` { } `,
		`{"tools":[null,{},{"function":null},{"function":{}},{"function":{"name":null,"parameters":null}}]}`,
		`{"tools":[{"function":{"name":"f","parameters":{}}},{"function":{"name":"f","parameters":{"type":"object"}}}]}`,
		// keys in other cases, escaped, folded, unknown
		`{"Messages":[{"ROLE":"tool","Tool_Call_ID":"c","CONTENT":"x"}],"TOOLS":[{"FUNCTION":{"NAME":"f","PARAMETERS":{"Type":"object"}}}]}`,
		`{"mEsSaGeS":[],"tOoLs":[{"Function":{"Name":"g"}}]}`, `{"m\u0065ssages":[{"role":"a"}]}`, `{"tool\u0073":[{"function":{"name":"f"}}]}`,
		`{"meſſageſ":[{"role":"a"}]}`, `{"toolſ":[{"function":{"name":"f"}}]}`, `{"messages ":[{"role":"a"}]," tools":[{}],"":1}`,
		`{"tools":[{"functioN":{"namE":"f","Parameters":{"A":1,"a":2}}}]}`, `{"tools":[{"function":{"name":"f","parameterſ":{"a":1}}}]}`,
		"{\"m\xc3\xa9ssages\":[],\"messages\":[{\"role\":\"a\"}]}",
		// duplicate keys: the last wins for strings, arrays and objects merge
		`{"messages":[{"role":"a"}],"messages":[{"content":"b"}]}`, `{"messages":[{"role":"a"},{"role":"b"}],"Messages":[{"content":"c"}]}`,
		`{"messages":[{"role":"a"}],"messages":null}`, `{"messages":[{"role":"a"}],"messages":[]}`,
		`{"tools":[{"function":{"name":"f"}}],"tools":[{"function":{"parameters":{"a":1}}}]}`, `{"tools":[{}],"TOOLS":null}`,
		`{"tools":[{"function":{"name":"f","parameters":{"a":1},"parameters":{"b":2}}}]}`,
		`{"tools":[{"function":{"name":"f","name":"g","parameters":{"a":1,"a":{"x":2},"a":[3]}}}]}`,
		`{"tools":[{"function":{"name":"f"},"function":{"parameters":{"a":1}}}]}`,
		`{"messages":[{"role":"a","role":"b","tool_calls":[{"id":"x"}],"tool_calls":[{"function":{"name":"n"}}]}]}`,
		// after the object: anything (Decode reads one value)
		req() + ` trailing`, req() + `{"messages":[]}`, req() + `]`, req() + "\x00\xff", `{"messages":[{"role":"a"}]}}}}`,
		`{"messages":[{"role":"a"}]} {`, `{"messages":[{"role":"a"}]}` + strings.Repeat("[", 100), `{"messages":[]}"`,
		// invalid inside the object
		`{"messages":[{"role":"a"},]}`, `{"messages":[{"role":"a"}]`, `{"messages":[{"role":"a"}],}`, `{"messages" [{"role":"a"}]}`,
		`{"messages":[{"role":"a"} {"role":"b"}]}`, `{"tools":[{"function":{"name":"f","parameters":{"a":01}}}]}`,
		`{"tools":[{"function":{"name":"f","parameters":{"a":1.}}}]}`, `{"tools":[{"function":{"name":"f","parameters":{"a":.5}}}]}`,
		`{"tools":[{"function":{"name":"f","parameters":{"a":+1}}}]}`, `{"tools":[{"function":{"name":"f","parameters":{"a":-}}}]}`,
		`{"tools":[{"function":{"name":"f","parameters":{"a":tru}}}]}`, "{\"messages\":[{\"role\":\"a\x01\"}]}",
		`{"messages":[{"role":"\x"}]}`, `{"x":"\u12G4","messages":[]}`, `{"messages":[]`, `{"messages":[],"x":nul}`, `{'messages':[]}`,
		`{messages:[]}`, `{"messages":[{"role":"a"}],"tools":[{"function":{"name":"f"}}]` + ` x`, `{"tools":[{"function":{"name":"f"}}],"x":[}`,
		// wrong types: encoding/json fails and sets nothing
		`{"messages":{},"tools":[{"function":{"name":"f"}}]}`, `{"messages":"x"}`, `{"messages":[1]}`, `{"messages":[[]]}`, `{"messages":true}`,
		`{"messages":[{"role":5}],"tools":[{"function":{"name":"f"}}]}`, `{"messages":[{"tool_calls":{}}]}`, `{"messages":[{"tool_calls":[null]}]}`,
		`{"messages":[{"role":"a"}],"tools":{}}`, `{"messages":[{"role":"a"}],"tools":[1]}`, `{"messages":[{"role":"a"}],"tools":"x"}`,
		`{"messages":[{"role":"a"}],"tools":[{"function":[]}]}`, `{"messages":[{"role":"a"}],"tools":[{"function":{"parameters":[]}}]}`,
		`{"messages":[{"role":"a"}],"tools":[{"function":{"parameters":"x"}}]}`, `{"messages":[{"role":"a"}],"tools":[{"function":{"name":5}}]}`,
		`{"messages":[{"role":"a"}],"tools":[{"function":{"parameters":{"a":1}}},{"function":{"name":{}}}]}`,
		`{"tools":[[]],"messages":[]}`, `{"tools":[{"function":{"name":"f","parameters":true}}]}`,
		// numbers of every form in the parameters (json.Number, the text as it is)
		`{"tools":[{"function":{"name":"f","parameters":{"a":0,"b":-0,"c":1.5e10,"d":1E+2,"e":-1e-400,"f":1e999,` +
			`"g":123456789012345678901234567890,"h":0.1,"i":[1,2.0,-3e-3,0e0,-0.0E-0],"j":{"k":9007199254740993}}}}]}`,
		`{"tools":[{"function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":-1.5e-7,"enum":[1,2,3e0]}}}}}]}`,
		// escapes and invalid UTF-8 in keys and values
		`{"tools":[{"function":{"name":"f\u00e9\n","parameters":{"\u0041":"\ud83d\ude00","\ud800":"\udfff x","a\"b":"c\\d"}}}]}`,
		"{\"tools\":[{\"function\":{\"name\":\"f\xff\",\"parameters\":{\"k\xc3\":\"v\xed\xa0\x80\",\"\xef\xbf\xbd\":1}}}]}",
		"{\"messages\":[{\"role\":\"a\xffb\",\"content\":\"\xfe\",\"tool_call_id\":\"\\ud83d x\"}]}",
		// not an object
		``, ` `, "\t\r\n", `null`, ` null `, `[]`, `[{"messages":[]}]`, `"messages"`, `5`, `-1e5`, `true`, `false`, `nul`, `}`, `{`,
		"\xef\xbb\xbf" + req(), "\xef\xbb\xbf{}", `{"messages":[{"role":"a"}]`, "\x00{}",
		// nested values
		`{"messages":[{"content":` + strings.Repeat("[", 50) + strings.Repeat("]", 50) + `}],"tools":[{"function":{"name":"f","parameters":` +
			strings.Repeat(`{"a":`, 50) + "1" + strings.Repeat("}", 50) + `}}]}`,
	}
	for _, s := range scenario() {
		seeds = append(seeds, s.RequestBody)
	}
	return seeds
}

// FuzzRequestMatchesEncodingJSON: request decodes every request body as
// decodeRequest (encoding/json) does, with a cache of tool declarations,
// shared by the inputs, and without; what the fast path accepts starts with
// a JSON object that encoding/json accepts, and its messages share no
// memory with the body.
func FuzzRequestMatchesEncodingJSON(f *testing.F) {
	for _, s := range requestSeeds() {
		f.Add(s)
	}
	decls := &declCache{}
	f.Fuzz(func(t *testing.T, body string) {
		checkRequest(t, body, decls)
	})
}

// checkRequest checks request on body against decodeRequest (see
// FuzzRequestMatchesEncodingJSON).
func checkRequest(t *testing.T, body string, decls *declCache) {
	t.Helper()
	wantMsgs, wantTools, wantSeen := decodeRequest(body)
	for i, c := range []*declCache{nil, decls, decls} { // decls: a miss (unless an earlier input declared the same), then a hit
		p := parsed{c: &export.Call{RequestBody: body}}
		p.request(c)
		if !reflect.DeepEqual(p.reqMsgs, wantMsgs) || !reflect.DeepEqual(p.tools, wantTools) || p.toolsSeen != wantSeen {
			t.Fatalf("%.300q (run %d):\nrequest       %#v\n              %#v %v\nencoding/json %#v\n              %#v %v",
				body, i, p.reqMsgs, p.tools, p.toolsSeen, wantMsgs, wantTools, wantSeen)
		}
	}
	msgs, _, ok := fastRequest(jsonscan.Bytes(body), nil)
	if !ok {
		return
	}
	if s := strings.TrimLeft(body, " \t\r\n"); strings.HasPrefix(s, "{") {
		var v json.RawMessage
		if err := json.NewDecoder(strings.NewReader(s)).Decode(&v); err != nil {
			t.Fatalf("%.300q: the fast path accepted an object that encoding/json rejects: %v", body, err)
		}
	}
	for _, m := range msgs {
		for _, s := range []string{m.Role, m.ToolCallID, jsonscan.String(m.Content)} {
			if jsonscan.Offset(body, s) >= 0 {
				t.Fatalf("%.300q: %q shares the body's memory", body, s)
			}
		}
		for _, tc := range m.ToolCalls {
			for _, s := range []string{tc.ID, tc.Function.Name, tc.Function.Arguments} {
				if jsonscan.Offset(body, s) >= 0 {
					t.Fatalf("%.300q: %q shares the body's memory", body, s)
				}
			}
		}
	}
}

// TestRequestDepth: encoding/json rejects a body nested deeper than 10000
// levels (nothing is read) and request with it, in messages and in tool
// declarations, and neither goes deep into the stack on many openings.
func TestRequestDepth(t *testing.T) {
	content := func(depth int) string { // the body, messages and the message are three levels
		return `{"messages":[{"role":"a","content":` + strings.Repeat("[", depth-3) + strings.Repeat("]", depth-3) + `}]}`
	}
	params := func(depth int) string { // the body, tools, a tool, its function and its parameters are five levels
		return `{"messages":[],"tools":[{"function":{"name":"f","parameters":{"a":` + strings.Repeat("[", depth-5) +
			strings.Repeat("]", depth-5) + `}}}]}`
	}
	decls := &declCache{}
	for _, s := range []string{
		content(maxDepth), content(maxDepth + 1), params(maxDepth), params(maxDepth + 1), params(maxDepth),
		`{"messages":[{"content":` + strings.Repeat("[", 1<<20), `{"tools":` + strings.Repeat("[", 1<<20),
		`{"messages":[{"role":"a"}]}` + strings.Repeat("[", maxDepth+1), `{"messages":[{"role":"a"}]}` + strings.Repeat("}", maxDepth+1),
		`{"x":"` + strings.Repeat(`\"[`, maxDepth+1) + `","messages":[{"content":` + strings.Repeat(`{"a":`, 100) + "1" + strings.Repeat("}", 100) + `}]}`,
	} {
		checkRequest(t, s, decls)
	}
	for s, want := range map[string]bool{content(maxDepth): true, content(maxDepth + 1): false, params(maxDepth): true, params(maxDepth + 1): false} {
		p := parsed{c: &export.Call{RequestBody: s}}
		p.request(decls)
		if got := p.reqMsgs != nil; got != want {
			t.Errorf("%.40q... (%d bytes): read %v, want %v", s, len(s), got, want)
		}
	}
}

// TestRequestFastPath: the usual bodies take the fast path, and what it
// sends to encoding/json it does send there.
func TestRequestFastPath(t *testing.T) {
	fast := []string{req(), req("c1", "ok"), `{"MESSAGES":[null,{"role":"a"}],"Tools":null,"x":{"messages":5}}`, `null`, `[1]`, `{"tools":[{}]}`}
	for _, r := range benchRequests() {
		fast = append(fast, r.body, r.body+" trailing")
	}
	for _, s := range fast {
		if _, _, ok := fastRequest(jsonscan.Bytes(s), nil); !ok {
			t.Errorf("%.80q: not the fast path", s)
		}
	}
	for _, s := range []string{
		`{"messages":[],"messages":[]}`, `{"tools":[],"Tools":[]}`, `{"m\u0065ssages":[]}`, `{"meſſageſ":[]}`, `{"messages":{}}`,
		`{"messages":[1]}`, `{"messages":[{"role":5}]}`, `{"tools":[1]}`, `{"tools":{}}`, `{"messages":[],}`, `{"messages":[]`,
	} {
		if _, _, ok := fastRequest(jsonscan.Bytes(s), nil); ok {
			t.Errorf("%q: the fast path took it", s)
		}
	}
}
