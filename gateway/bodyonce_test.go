package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/gateway"
)

// liveHeap is the live heap after the collector has run twice (the second
// run empties the pools the first one moved to their victim caches).
func liveHeap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestStreamHoldsOneCopyOfTheRequest: an agent's request body (a long
// multi-turn context: 20-200 KB) is held once for a stream's life, by
// capture (the row's request column); the client request's own buffer goes
// back once the engine has the call. 32 streams of a 200 KB request are
// held open against an engine that keeps no request (it lets each body go
// and sends one small chunk), so the live heap per open stream is the
// gateway's: it must stay under 1.6 bodies (one copy and the stream's
// fixed cost, ≈ 50 KiB). Before, the client request's buffer lived as long
// as the stream too: ≈ 2.3 bodies.
func TestStreamHoldsOneCopyOfTheRequest(t *testing.T) {
	const streams, bodyBytes = 32, 200 << 10
	var open, started atomic.Int64
	release := make(chan struct{})
	engine := &fasthttp.Server{ReduceMemoryUsage: true, MaxRequestBodySize: 1 << 20, Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.Request.ResetBody()
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":null}]}`+"\n\n")
			w.Flush()
			open.Add(1)
			<-release
			fmt.Fprint(w, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
		})
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go engine.Serve(ln) //nolint:errcheck // ends at Shutdown
	t.Cleanup(func() { engine.Shutdown() })
	s, _ := openSQLite(t)
	e := newEnv(t, s, func(c *gateway.Config) {
		c.Backends = []gateway.Backend{{Model: "*", Replicas: []gateway.Replica{{Name: "lean", URL: "http://" + ln.Addr().String() + "/v1", Kind: "openai"}}}}
		c.HealthInterval = -1
	})
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", bodyBytes) + `"}]}`

	base := liveHeap()
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", fmt.Sprintf("%s/rollout/ro-mem-%d/attempt/1/v1/chat/completions", e.url, i), strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 512)
			if n, err := resp.Body.Read(buf); resp.StatusCode != 200 || err != nil {
				errs <- fmt.Errorf("status %d, %v: %s", resp.StatusCode, err, buf[:n])
				return
			}
			// The stream stays open, read to its end: a client hanging up
			// here would end its stream and have its row built while the
			// heap is measured.
			started.Add(1)
			if rest, err := io.ReadAll(resp.Body); err != nil || !strings.Contains(string(rest), "[DONE]") {
				errs <- fmt.Errorf("the rest of the stream: %v: %q", err, rest)
			}
		}()
	}
	// Every stream open at the engine and its first chunk at the client:
	// the gateway is past the call's set-up (the client's body released,
	// the upstream request back in its pool), holding only the stream.
	waitFor(t, "32 streams open at the engine and at their clients", func() bool {
		if len(errs) > 0 {
			t.Fatal(<-errs)
		}
		return open.Load() == streams && started.Load() == streams
	})
	held := liveHeap()
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	perStream := (float64(held) - float64(base)) / streams
	t.Logf("live heap per open stream %.0f KiB with a %d KiB request: %.2f request bodies", perStream/1024, bodyBytes>>10, perStream/bodyBytes)
	if perStream > 1.6*bodyBytes {
		t.Errorf("%.0f KiB of live heap per open stream of a %d KiB request (%.2f bodies), want under 1.6 bodies: one copy (capture's) and the stream's fixed cost", perStream/1024, bodyBytes>>10, perStream/bodyBytes)
	}
}
