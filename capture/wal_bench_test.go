package capture

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/internal/openai"
)

// BenchmarkWALCommit is the hot-path cost of the WAL per call: encoding
// the finished call and one write(2) (no fsync), for a non-streamed call
// and for a stream of 256 chunks (every payload is in the record).
func BenchmarkWALCommit(b *testing.B) {
	stream := func() *Pending {
		p := AcquirePending()
		p.keepRaw = true
		p.Endpoint = openai.ChatCompletions
		p.Request = `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`
		for i := range 256 {
			p.AddEvent(fmt.Appendf(nil, `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok%d "},"logprobs":{"content":[{"token":"tok","logprob":-0.5,"bytes":[116]}]},"token_ids":[%d],"finish_reason":null}]}`, i, i))
		}
		return p
	}
	red, err := NewRedactor([]RedactRule{{Name: "key", Pattern: `sk-[A-Za-z0-9]{20,}`, Replacement: "[REDACTED_KEY]"}})
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    *Pending
		red  *Redactor
	}{{"non-streamed", pending(1), nil}, {"stream-256", stream(), nil},
		// With a redaction rule the record holds the redacted rows, built
		// here instead of in a capture worker (see walVersionRows).
		{"non-streamed-redacted", pending(1), red}, {"stream-256-redacted", stream(), red}} {
		b.Run(tc.name, func(b *testing.B) {
			w := openTestWAL(&testing.T{}, b.TempDir(), WALConfig{})
			defer w.Close()
			var s walScratch
			var a Assembler
			var buf []byte
			refs := make([]walRef, 0, 64)
			b.ReportAllocs()
			for b.Loop() {
				if tc.red != nil {
					tc.p.asm.built = false // a stream's result is built once per call: here
					buf = appendWALRows(buf[:0], tc.p, &a, tc.red, &s)
				} else {
					buf = appendWALRecord(buf[:0], tc.p, &s)
				}
				ref, err := w.append(buf)
				if err != nil {
					b.Fatal(err)
				}
				if refs = append(refs, ref); len(refs) == cap(refs) {
					w.ack(refs) // as the batcher does, so segments are deleted
					refs = refs[:0]
				}
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}
