package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"testing"

	"github.com/valyala/fasthttp"
)

// errWouldBlock is what the fake socket returns once its bytes are read:
// a real one would block there.
var errWouldBlock = errors.New("would block")

type socket struct{ r *bytes.Reader }

func (s *socket) Read(p []byte) (int, error) {
	if s.r.Len() == 0 {
		return 0, errWouldBlock
	}
	return s.r.Read(p)
}

// FuzzChunkPeekReady: whenever chunkPeek says the next chunk is buffered,
// fasthttp's own chunked body reader, given exactly the bytes that arrived,
// reads it without asking the socket for more. (The opposite mistake only
// costs a separate write.)
func FuzzChunkPeekReady(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), 1)
	f.Add([]byte("5\r\nhel"), 0)
	f.Add([]byte("5;ext=1\r\nhello\r\n5\r\nhello"), 2)
	f.Add([]byte("A\r\n0123456789\r\n"), 1)
	f.Add([]byte("5\r\nhello\r\n0\r\n"), 3)
	f.Add([]byte("5\nhello\r\n"), 1)
	f.Fuzz(func(t *testing.T, body []byte, reads int) {
		head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
		br := bufio.NewReaderSize(&socket{bytes.NewReader(append([]byte(head), body...))}, 8<<10)
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		resp.StreamBody = true
		if err := resp.Read(br); err != nil {
			return
		}
		stream := resp.BodyStream()
		p, ok := streamPeeker(stream)
		if !ok {
			t.Fatalf("no chunkPeek for fasthttp's body stream %T", stream)
		}
		buf := make([]byte, 64)
		for i := 0; i < reads%8; i++ { // first reads as fill makes them
			if _, err := stream.Read(buf); err != nil {
				return
			}
		}
		for range 32 {
			if !p.ready() {
				return
			}
			_, err := stream.Read(buf)
			if errors.Is(err, errWouldBlock) {
				t.Fatalf("ready, but the read needed bytes that had not arrived (body %q)", body)
			}
			if err != nil {
				return
			}
		}
	})
}

// BenchmarkChunkPeekReady: one ready() on a stream with a whole next chunk
// buffered (the question fill asks after every chunk it reads).
func BenchmarkChunkPeekReady(b *testing.B) {
	body := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
	br := bufio.NewReaderSize(&socket{bytes.NewReader([]byte(body))}, 8<<10)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.StreamBody = true
	if err := resp.Read(br); err != nil {
		b.Fatal(err)
	}
	p, ok := streamPeeker(resp.BodyStream())
	if !ok || !p.ready() {
		b.Fatal("no peek, or the buffered chunk not seen")
	}
	b.ReportAllocs()
	for b.Loop() {
		if !p.ready() {
			b.Fatal("not ready")
		}
	}
}
