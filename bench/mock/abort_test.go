package mock

import (
	"bufio"
	"github.com/rollgate/rollgate/testkit/testenv"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// waitUntil polls cond until it holds or 15 s pass.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, 15*time.Second, func() string { return what }, cond)
}

// TestNonStreamingAbortOnDisconnect: a non-streaming request whose client closes the
// connection while it generates is aborted, as vLLM aborts it; bytes of a pipelined
// request arriving meanwhile are no disconnect, and both requests are answered.
func TestNonStreamingAbortOnDisconnect(t *testing.T) {
	s, base := startT(t, Config{})
	addr := strings.TrimPrefix(strings.TrimSuffix(base, "/v1"), "http://")
	request := func(extra string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + extra +
			"Content-Length: " + itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	}

	t.Run("client closes", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(conn, request("x-mock-ttft-ms: 60000\r\n")); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the request to generate", func() bool { return s.Generating() == 1 })
		conn.Close()
		waitUntil(t, "the abort", func() bool { return s.Aborted() == 1 && s.Generating() == 0 })
	})

	t.Run("pipelined request", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		aborted := s.Aborted()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // guard against a hung test
		if _, err := io.WriteString(conn, request("x-mock-ttft-ms: 300\r\n")); err != nil {
			t.Fatal(err)
		}
		waitUntil(t, "the request to generate", func() bool { return s.Generating() == 1 })
		if _, err := io.WriteString(conn, request("")); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		for i := range 2 {
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != 200 || !strings.Contains(string(body), `"choices"`) {
				t.Fatalf("response %d: %d %s", i, res.StatusCode, body)
			}
		}
		if a := s.Aborted(); a != aborted {
			t.Fatalf("aborted %d requests of a client that stayed", a-aborted)
		}
	})
}
