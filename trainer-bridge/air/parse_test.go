package air

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

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
