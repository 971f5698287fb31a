package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/gateway"
)

// TestStreamsWithPerConnectionBuffersReleased: the gateway's server gives
// a connection's read buffer back while it answers and its buffers back
// while it is idle (fasthttp's ReduceMemoryUsage), and a stream's output
// buffers go back between the backend's reads. Requests larger than every
// one of those buffers (a 7 KiB header line, a 24 KiB body), a second
// request on the same keep-alive connection, pipelined requests and a
// header over the 8 KiB read buffer are answered as before, and each stream
// reaches the client byte for byte as from the engine.
func TestStreamsWithPerConnectionBuffersReleased(t *testing.T) {
	store, _ := openSQLite(t)
	// A 7 KiB client key: a header line near the 8 KiB read buffer that the
	// gateway checks and does not forward (the engine's own buffer is 4 KiB).
	key := "sk-" + strings.Repeat("k", 7<<10)
	e := newEnv(t, store, func(c *gateway.Config) {
		c.InjectLogprobs = true
		c.ClientKeys = []gateway.ClientKey{{Name: "long", Key: key}}
	})
	// The client asks for everything the gateway would inject, so nothing is
	// stripped and the answer must equal the engine's own.
	pad := strings.Repeat("lorem ipsum ", 24<<10/12)
	body := `{"model":"mock-model","stream":true,"return_token_ids":true,"logprobs":true,"stream_options":{"include_usage":true},` +
		`"max_tokens":40,"messages":[{"role":"system","content":"` + pad + `"},{"role":"user","content":"Tell me a long story"}]}`
	direct := do(t, "POST", e.mockURL+"/chat/completions", body)
	if direct.status != 200 || !strings.Contains(string(direct.body), "[DONE]") {
		t.Fatalf("the engine's own answer: %d %.300s", direct.status, direct.body)
	}
	longHeader := "Authorization: Bearer " + key + "\r\n"
	call := func(rollout, extra string) string {
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			"x-rollout-id: %s\r\nx-attempt-id: 1\r\n%sContent-Length: %d\r\n\r\n%s", rollout, extra, len(body), body)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A guard against a hung test, not a timed assertion.
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReader(conn)
	send := func(s string) {
		t.Helper()
		if _, err := io.WriteString(conn, s); err != nil {
			t.Fatal(err)
		}
	}
	answer := func(what string) {
		t.Helper()
		status, got := readRaw(t, br, what)
		if status != 200 || string(got) != string(direct.body) {
			t.Fatalf("%s: %d, the stream differs from the engine's:\n gateway %.400s\n engine  %.400s", what, status, got, direct.body)
		}
	}

	send(call("mem-big", longHeader))
	answer("a 7 KiB header and a 24 KiB body")
	send(call("mem-big", longHeader))
	answer("the next request on the same connection")
	send(call("mem-big", longHeader) + call("mem-big", longHeader))
	answer("the first of two pipelined requests")
	answer("the second of two pipelined requests")
	rows := rolloutRows(t, e, "mem-big", 4)
	for _, r := range rows {
		if r.HTTPStatus != 200 || r.Error != "" || r.RequestBody != body || r.APIKeyName != "long" {
			t.Fatalf("captured row: status %d, error %q, request body of %d bytes (sent %d)", r.HTTPStatus, r.Error, len(r.RequestBody), len(body))
		}
	}

	// A header larger than the read buffer: 431.
	send(call("mem-big", longHeader+"x-pad: "+strings.Repeat("h", 2<<10)+"\r\n"))
	if status, msg := readRaw(t, br, "header over the read buffer"); status != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("header over the read buffer: %d %s, want 431", status, msg)
	}
}

// readRaw reads one HTTP response (a chunked body decoded) from br.
func readRaw(t *testing.T, br *bufio.Reader, what string) (status int, body []byte) {
	t.Helper()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	body, err = io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("%s: reading the body: %v", what, err)
	}
	return res.StatusCode, body
}
