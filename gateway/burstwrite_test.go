package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway"
)

// lateBurstBackend answers a chat stream with one event, then, once next
// is signalled (the client has that event), with n more events, a finish
// event and [DONE] in one write: a burst of tens of KiB reaching the
// gateway together after the first token.
func lateBurstBackend(t *testing.T, n int, next <-chan struct{}) string {
	t.Helper()
	chunk := func(w *strings.Builder, s string) { fmt.Fprintf(w, "%x\r\n%s\r\n", len(s), s) }
	event := func(i int) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"t` +
			strconv.Itoa(i) + ` "},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	}
	var head, burst strings.Builder
	head.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk(&head, event(0))
	for i := 1; i <= n; i++ {
		chunk(&burst, event(i))
	}
	chunk(&burst, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	chunk(&burst, "data: [DONE]\n\n")
	burst.WriteString("0\r\n\r\n")
	return rawBackend(t, func(c net.Conn, _ *http.Request) bool {
		if _, err := io.WriteString(c, head.String()); err != nil {
			return false
		}
		<-next
		_, err := io.WriteString(c, burst.String())
		return err == nil
	})
}

// TestLateBurstCoalesced: the first event is forwarded alone, at once (the
// backend sends the rest only after the client has it); the burst that
// follows leaves in chunks larger than fasthttp's 4 KiB copy buffer (one
// write each, see streamBody.writeChunk) rather than one per 4 KiB, and the
// client gets every byte in order, the call captured whole.
func TestLateBurstCoalesced(t *testing.T) {
	sizes, out := lateBurstChunks(t, 0)
	big := 0
	for _, s := range sizes[1:] {
		if s > 4096 {
			big++
		}
		if s > 8<<10 {
			t.Fatalf("a chunk of %d bytes from an 8 KiB backend read buffer (chunks %v)", s, sizes[1:])
		}
	}
	if big == 0 {
		t.Fatalf("burst of %d bytes written in chunks of %v: none larger than fasthttp's 4 KiB copy buffer", len(out), sizes[1:])
	}
	t.Logf("burst of %d bytes in %d chunks: %v", len(out), len(sizes)-1, sizes[1:])
}

// TestBackendReadBufferWidensBurst: with --backend-read-buffer 64 KiB the
// same burst leaves in chunks larger than the default 8 KiB read buffer
// allows (a fill takes what one read buffered, up to 32 KiB).
func TestBackendReadBufferWidensBurst(t *testing.T) {
	sizes, out := lateBurstChunks(t, 64<<10)
	largest := slices.Max(sizes[1:])
	if largest <= 8<<10 {
		t.Fatalf("burst of %d bytes written in chunks of %v: none larger than 8 KiB with a 64 KiB read buffer", len(out), sizes[1:])
	}
	t.Logf("burst of %d bytes in %d chunks: %v", len(out), len(sizes)-1, sizes[1:])
}

// lateBurstChunks runs lateBurstBackend's stream through a gateway whose
// backend read buffer is readBuffer bytes (0: the default) and returns the
// sizes of the chunks the client got and what it read; it checks the
// events and the captured row.
func lateBurstChunks(t *testing.T, readBuffer int) ([]int, string) {
	t.Helper()
	const n = 300 // ≈ 40 KiB of events
	next := make(chan struct{})
	url := lateBurstBackend(t, n, next)
	store, err := sqlite.Open(t.TempDir() + "/burst.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	e := newEnv(t, store, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "burst", URL: url, Kind: "openai"}}}}
		c.BackendReadBuffer = readBuffer
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != 200 || len(res.TransferEncoding) == 0 {
		t.Fatalf("status %d, transfer encoding %v", res.StatusCode, res.TransferEncoding)
	}
	var sizes []int
	out := readChunks(t, br, func(data string, size int) {
		sizes = append(sizes, size)
		if len(sizes) == 1 {
			if !strings.Contains(data, `"t0 "`) || strings.Count(data, "data: ") != 1 {
				t.Fatalf("first chunk %q, want the first event alone", data)
			}
			close(next)
		}
	})
	if events := strings.Count(out, "data: "); events != n+3 || !strings.HasSuffix(out, "data: [DONE]\n\n") {
		t.Fatalf("client got %d events, want %d", events, n+3)
	}
	for i := range n + 1 {
		if !strings.Contains(out, `"t`+strconv.Itoa(i)+` "`) {
			t.Fatalf("event %d missing", i)
		}
	}
	rows := e.waitCalls(res.Header.Get("x-request-id"), 1)
	if !strings.Contains(rows[0].ResponseMessage, "t0 t1 t2 ") || !strings.Contains(rows[0].ResponseMessage, "t300 ") ||
		rows[0].FinishReason != "stop" || rows[0].Error != "" {
		t.Fatalf("captured %q finish %q error %q", rows[0].ResponseMessage, rows[0].FinishReason, rows[0].Error)
	}
	return sizes, out
}

// readChunks reads a chunked body by hand, calling each (when not nil) with
// the body so far and the size of the chunk just read, and returns the body.
func readChunks(t *testing.T, br *bufio.Reader, each func(data string, size int)) string {
	t.Helper()
	var got strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		size, err := strconv.ParseInt(strings.TrimSpace(line), 16, 64)
		if err != nil {
			t.Fatalf("chunk size %q: %v", line, err)
		}
		if size == 0 {
			return got.String()
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			t.Fatal(err)
		}
		if string(buf[size:]) != "\r\n" {
			t.Fatalf("chunk not followed by CRLF: %q", buf[size:])
		}
		got.Write(buf[:size])
		if each != nil {
			each(got.String(), int(size))
		}
	}
}
