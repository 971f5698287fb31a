package gateway_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/rollgate/rollgate/gateway"
)

// closingBackend is an engine that, like uvicorn past its keep-alive
// timeout, closes every connection after answering on it, without saying
// `Connection: close`. It holds its first `hold` answers until that many
// requests are in, so the gateway opens that many connections, which all
// end up closed in the gateway's pool.
type closingBackend struct {
	ln       net.Listener
	hold     int
	mu       sync.Mutex
	arrived  int
	release  chan struct{}
	accepted int
}

func newClosingBackend(t *testing.T, hold int) *closingBackend {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &closingBackend{ln: ln, hold: hold, release: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.accepted++
			b.mu.Unlock()
			go b.serve(c)
		}
	}()
	return b
}

func (b *closingBackend) serve(c net.Conn) {
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil {
		return
	}
	req.Body.Close()
	b.mu.Lock()
	b.arrived++
	if b.arrived == b.hold {
		close(b.release)
	}
	b.mu.Unlock()
	<-b.release
	body := `{"id":"c","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Closed here, after the answer: the gateway's pool keeps the
	// connection as idle and finds out only when it sends on it again.
}

func (b *closingBackend) connections() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.accepted
}

// TestStaleKeepAliveConnectionsRetriedAfresh: vLLM's server (uvicorn)
// closes a kept-alive connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE),
// so after a pause longer than that, every idle connection of the gateway's
// pool to it is dead. A call must not fail by meeting them one after another
// on its retries: the first stale one empties the pool and the retry dials a
// new connection. Seen with a real vLLM: 16 agents, a training step, then
// "502 … the server closed connection before returning the first response
// byte (after 3 attempts)".
func TestStaleKeepAliveConnectionsRetriedAfresh(t *testing.T) {
	const parallel = 4 // more stale connections than the call has attempts (Retries 2: 3)
	b := newClosingBackend(t, parallel)
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.HealthInterval = -1 // no health checks opening connections of their own
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "ka", URL: "http://" + b.ln.Addr().String() + "/v1", Kind: "openai"}}}}
	})
	var wg sync.WaitGroup
	errs := make(chan string, parallel)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r := do(t, "POST", e.url+"/v1/chat/completions", chatBody); r.status != 200 {
				errs <- fmt.Sprintf("%d %s", r.status, r.body)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for msg := range errs {
		t.Fatalf("a first-round call failed: %s", msg)
	}
	if n := b.connections(); n != parallel {
		t.Fatalf("the first round opened %d connections, want %d (one per concurrent call)", n, parallel)
	}
	// Every pooled connection is now closed by the backend.
	r := do(t, "POST", e.url+"/v1/chat/completions", chatBody)
	if r.status != 200 {
		t.Fatalf("a call after the backend closed its idle connections: %d %s", r.status, r.body)
	}
	if n := b.connections(); n != parallel+1 {
		t.Fatalf("%d connections in all, want %d: the retry should dial one new connection", n, parallel+1)
	}
}
