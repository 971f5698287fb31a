package capture

import (
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
)

// TestTooDeepResponse: an upstream answer, or a stream event, nested deeper
// than jsonscan.MaxDepth is captured as an error row that names the limit,
// without the body, and nothing reads it further (issue 36: SetBody's
// gjson.Valid overflowed the stack on 5 million '[', and with a WAL every
// restart replayed the call and died again). Events around a deep event are
// still assembled.
func TestTooDeepResponse(t *testing.T) {
	deep := []byte(`{"id":"x","choices":` + strings.Repeat("[", 10<<20))
	for _, noIndex := range []bool{false, true} {
		p := AcquirePending()
		p.Meta = export.Call{SpanID: "s", SequenceID: 1, HTTPStatus: 200, Endpoint: "/v1/chat/completions"}
		p.Endpoint = openai.ChatCompletions
		p.Body = append(p.Body[:0], deep...)
		var a Assembler
		a.noIndex = noIndex
		rows := Rows(p, &a)
		if len(rows) != 1 || !strings.Contains(rows[0].Error, "512 levels") || rows[0].ResponseBody != "" {
			t.Fatalf("noIndex %v: rows %+v", noIndex, rows[0].Error)
		}

		s := AcquirePending()
		s.Meta = export.Call{SpanID: "t", SequenceID: 2, HTTPStatus: 200, Endpoint: "/v1/chat/completions"}
		s.Endpoint = openai.ChatCompletions
		s.asm.noIndex = noIndex
		s.AddEvent([]byte(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}`))
		s.AddEvent(deep)
		s.AddEvent([]byte(`{"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"stop"}]}`))
		s.AddEvent([]byte(`[DONE]`))
		if len(s.events) != 0 {
			t.Fatalf("noIndex %v: the deep event was kept for the id fallback", noIndex)
		}
		rows = Rows(s, &a)
		if len(rows) != 1 || !strings.Contains(rows[0].Error, "stream event not captured") || !strings.Contains(rows[0].Error, "512 levels") ||
			!strings.Contains(rows[0].ResponseMessage, "hi!") {
			t.Fatalf("noIndex %v: stream rows %+v", noIndex, rows)
		}
	}
}
