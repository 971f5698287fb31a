package rewrite_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/openai"
)

// vllmStream is a vLLM chat stream of n tokens as the gateway receives it
// with return_token_ids and include_usage injected.
func vllmStream(n int) []byte {
	const hdr = `data: {"id":"chatcmpl-fb083a8dc525d769bd0ce24514205608","object":"chat.completion.chunk","created":1700000000,"model":"mock-model",`
	var sb strings.Builder
	sb.WriteString(hdr + `"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[257,262,10,104,105,258,10,257,263,10]}` + "\n\n")
	words := []string{" might", " all", " tower", " much", "\\n", " the"}
	for i := range n {
		fmt.Fprintf(&sb, hdr+`"choices":[{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":null,"token_ids":[%d]}]}`+"\n\n", words[i%len(words)], 300+i%500)
	}
	sb.WriteString(hdr + `"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[]}]}` + "\n\n")
	fmt.Fprintf(&sb, hdr+`"choices":[],"usage":{"prompt_tokens":10,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", 10+n, n)
	sb.WriteString("data: [DONE]\n\n")
	return []byte(sb.String())
}

// BenchmarkSSEStream256 is the gateway's per-stream work on a 256-token chat
// stream without the network: the body read in 4 KiB pieces, split into
// events, stripped of what was injected, handed to capture (Pending.AddEvent)
// and assembled into rows (capture.Rows), as gateway/streambody.go and the
// capture workers do it.
//
//	go test -run '^$' -bench BenchmarkSSEStream256 -benchmem ./gateway/rewrite/
func BenchmarkSSEStream256(b *testing.B) {
	stream := vllmStream(256)
	req := []byte(`{"model":"mock-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	inj := rewrite.ReturnTokenIDs | rewrite.IncludeUsage
	var sc capture.SSEScanner
	var a capture.Assembler
	out := make([]byte, 0, 8<<10)
	scratch := make([]byte, 0, 1<<10)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	for b.Loop() {
		p := capture.AcquirePending()
		p.Endpoint = openai.ChatCompletions
		p.Meta.HTTPStatus = 200
		p.Request = string(req)
		sc.Reset()
		for off := 0; off < len(stream); off += 4 << 10 {
			sc.Feed(stream[off:min(off+4<<10, len(stream))])
			out = out[:0]
			for {
				ev, ok := sc.Next()
				if !ok {
					break
				}
				p.AddEvent(ev.Data)
				o, drop := rewrite.StripEvent(scratch[:0], ev.Data, openai.ChatCompletions, inj)
				switch {
				case drop:
				case string(o) == string(ev.Data):
					out = append(out, ev.Raw...)
				default:
					out = append(out, "data: "...)
					out = append(out, o...)
					out = append(out, "\n\n"...)
				}
			}
		}
		rows := capture.Rows(p, &a)
		if len(rows) != 1 || len(rows[0].ResponseTokenIDs) != 256 || rows[0].TokenSource != "engine" {
			b.Fatalf("rows %+v", rows)
		}
	}
}
