package air

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// agenticTools are the tool declarations of agenticRequest (those of the
// trainer bridge's agentic benchmark data).
const agenticTools = `[{"type":"function","function":{"name":"run_shell","description":"Run a shell command in the repository and return its standard output and standard error.","parameters":{"type":"object","properties":{"command":{"type":"string","description":"the command line"}},"required":["command"]}}},` +
	`{"type":"function","function":{"name":"read_file","description":"Read a file of the repository, fifty lines from a line offset.","parameters":{"type":"object","properties":{"path":{"type":"string"},"offset":{"type":"integer"}},"required":["path"]}}}]`

// agenticRequest is the request body of turn turn (0..4) of a coding
// agent's conversation, as the trainer bridge's agentic benchmark data has
// them: a system and a user message, then per earlier turn the assistant's
// reasoning and tool call and the tool's result, the tools declared, and
// sampling options (turn 4: about 5 kB).
func agenticRequest(turn int) string {
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
	for t := range turn {
		id := "call_r000007_" + strconv.Itoa(t)
		args := `{\"command\":\"sed -n ` + strconv.Itoa(50*t+1) + `,` + strconv.Itoa(50*t+50) + `p src/util/config.py\"}`
		name := "run_shell"
		if t%2 == 1 {
			args, name = `{\"path\":\"src/main/handler.py\",\"offset\":`+strconv.Itoa(50*t)+`}`, "read_file"
		}
		msgs = append(msgs, `{"role":"assistant","content":"`+text(350)+`","tool_calls":[{"id":"`+id+
			`","type":"function","function":{"name":"`+name+`","arguments":"`+args+`"}}]}`,
			`{"role":"tool","tool_call_id":"`+id+`","content":"`+text(200)+`"}`)
	}
	return `{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[` + strings.Join(msgs, ",") + `],"tools":` + agenticTools +
		`,"temperature":1.0,"top_p":1.0,"max_tokens":2048,"logprobs":true}`
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

// BenchmarkRequest times request on each body of benchRequests, a new
// parsed value each time (request reads a body once per call).
func BenchmarkRequest(b *testing.B) {
	for _, r := range benchRequests() {
		c := &export.Call{RequestBody: r.body}
		b.Run(r.name, func(b *testing.B) {
			b.SetBytes(int64(len(r.body)))
			b.ReportAllocs()
			for b.Loop() {
				p := parsed{c: c}
				p.request()
			}
		})
	}
}

// TestBenchRequests: the benchmark's bodies are valid and of their sizes.
func TestBenchRequests(t *testing.T) {
	for _, r := range benchRequests() {
		p := parsed{c: &export.Call{RequestBody: r.body}}
		p.request()
		if !json.Valid([]byte(r.body)) || len(p.reqMsgs) < 3 || !p.toolsSeen || len(p.tools) != 2 {
			t.Errorf("%s: valid %v, %d messages, tools %v", r.name, json.Valid([]byte(r.body)), len(p.reqMsgs), p.tools)
		}
	}
	if n := len(agenticRequest(4)); n < 4800 || n > 5300 {
		t.Errorf("agentic request of %d bytes", n)
	}
}
