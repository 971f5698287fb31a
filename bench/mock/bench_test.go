package mock

import (
	"testing"

	"github.com/valyala/fasthttp"
)

func benchHandler(b *testing.B, path, body string) {
	s := New(Config{})
	h := s.Handler()
	var ctx fasthttp.RequestCtx
	req := []byte(body)
	b.ReportAllocs()
	b.SetBytes(int64(len(req)))
	for b.Loop() {
		out := serveInMemory(h, &ctx, path, req)
		if ctx.Response.StatusCode() != 200 || len(out) == 0 {
			b.Fatalf("status %d: %s", ctx.Response.StatusCode(), out)
		}
	}
}

func BenchmarkChatNonStream(b *testing.B) {
	benchHandler(b, PathChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hello there, how are you?"}],"return_token_ids":true,"max_tokens":64}`)
}

func BenchmarkChatStream(b *testing.B) {
	benchHandler(b, PathChat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hello there, how are you?"}],"return_token_ids":true,"stream":true,"stream_options":{"include_usage":true}}`)
}

func BenchmarkCompletionsNonStream(b *testing.B) {
	benchHandler(b, PathCompletions, `{"model":"m","prompt":"hello the world","return_token_ids":true}`)
}

func BenchmarkEncode(b *testing.B) {
	text := RenderChat([]byte(`[{"role":"system","content":"be brief"},{"role":"user","content":"Hello there, how are you? the quick brown fox jumps over the lazy dog"}]`), nil, true)
	var dst []uint32
	b.ReportAllocs()
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		dst = appendEncode(dst[:0], text)
	}
}
