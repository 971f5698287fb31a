package gateway

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http/httputil"
	"testing"

	"github.com/valyala/fasthttp"
)

// errWouldBlock is what the fake socket returns once its bytes are read:
// a real one would block there.
var errWouldBlock = errors.New("would block")

// socket is a connection whose bytes have all arrived: reading past them
// fails with errWouldBlock.
type socket struct {
	net.Conn // nil: only Read is called
	r        *bytes.Reader
}

func (s *socket) Read(p []byte) (int, error) {
	if s.r.Len() == 0 {
		return 0, errWouldBlock
	}
	return s.r.Read(p)
}

// testStream is an engineStream over the chunked body bytes, all arrived.
func testStream(body []byte, reused *bool) *engineStream {
	hc := &fasthttp.HostClient{ReadBufferSize: 8 << 10}
	conn := &socket{r: bytes.NewReader(body)}
	return &engineStream{hc: hc, conn: conn, br: hc.AcquireReader(conn), chunked: true, keep: true,
		end: func(reuse bool) { *reused = reuse }}
}

// FuzzEngineStreamReady: whenever engineStream says the next chunk is
// buffered, its Read, given exactly the bytes that arrived, returns it
// without asking the socket for more (the opposite mistake only costs a
// separate write). And whatever the bytes, the data it returns is what
// Go's own chunked reader (net/http/internal, through httputil) decodes, and
// the connection is reused only after a whole, well-formed body.
func FuzzEngineStreamReady(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), 1)
	f.Add([]byte("5\r\nhel"), 0)
	f.Add([]byte("5;ext=1\r\nhello\r\n5\r\nhello"), 2)
	f.Add([]byte("A\r\n0123456789\r\n"), 1)
	f.Add([]byte("5\r\nhello\r\n0\r\n"), 3)
	f.Add([]byte("5\nhello\r\n"), 1)
	f.Add([]byte("5\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\nextra"), 1)
	f.Fuzz(func(t *testing.T, body []byte, reads int) {
		var reused bool
		es := testStream(body, &reused)
		buf := make([]byte, 64)
		var got []byte
		var err error
		for i := 0; i < reads%8 && err == nil; i++ { // first reads as fill makes them
			var n int
			n, err = es.Read(buf)
			got = append(got, buf[:n]...)
		}
		for range 32 {
			if err != nil || !es.ready() {
				break
			}
			var n int
			n, err = es.Read(buf)
			got = append(got, buf[:n]...)
			if errors.Is(err, errWouldBlock) {
				t.Fatalf("ready, but the read needed bytes that had not arrived (body %q)", body)
			}
		}
		for err == nil {
			var n int
			n, err = es.Read(buf)
			got = append(got, buf[:n]...)
		}
		es.CloseWithError(nil)
		want, werr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(body)))
		if err == io.EOF {
			if werr != nil {
				t.Fatalf("engineStream read %q to its end, Go's chunked reader fails: %v (body %q)", got, werr, body)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("engineStream read %q, Go's chunked reader %q (body %q)", got, want, body)
			}
		} else if !bytes.HasPrefix(want, got) {
			t.Fatalf("engineStream read %q before failing (%v), not a prefix of Go's %q (body %q)", got, err, want, body)
		}
		if reused && (err != io.EOF || !bytes.HasSuffix(body, []byte("\r\n\r\n"))) {
			t.Fatalf("connection reused after %v (body %q)", err, body)
		}
	})
}

// BenchmarkEngineStreamReady: one ready() on a stream with a whole next
// chunk buffered (the question fill asks after every chunk it reads).
func BenchmarkEngineStreamReady(b *testing.B) {
	var reused bool
	es := testStream([]byte("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"), &reused)
	if _, err := es.br.Peek(1); err != nil {
		b.Fatal(err)
	}
	if !es.ready() {
		b.Fatal("the buffered chunk not seen")
	}
	b.ReportAllocs()
	for b.Loop() {
		if !es.ready() {
			b.Fatal("not ready")
		}
	}
}
