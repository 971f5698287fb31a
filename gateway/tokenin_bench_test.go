package gateway_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/gateway"
)

// BenchmarkTokenIn measures a chat call served token-in (render, generate,
// derender against the mock's vLLM token-in endpoints), non-streamed and
// streamed, each call the first of a new attempt. Allocations include the
// client and the mock in this process.
//
//	go test -run '^$' -bench BenchmarkTokenIn -benchmem ./gateway/
func BenchmarkTokenIn(b *testing.B) {
	_, addr := benchGateway(b, mock.Config{ScaleOut: true, EndOfTurn: true}, gateway.Config{TokenIn: true})
	run := 0 // each run of a sub-benchmark has rollouts of its own: every call is an attempt's first
	for _, mode := range []string{"nonstream", "stream"} {
		body := chatBody
		if mode == "stream" {
			body = withStream(chatBody, `"stream":true`)
		}
		b.Run(mode, func(b *testing.B) {
			run++
			rollout := "/rollout/bench-" + mode + "-" + strconv.Itoa(run) + "/attempt/"
			c := &fasthttp.HostClient{Addr: addr, MaxConns: 64}
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.Header.SetMethod("POST")
			req.Header.SetContentType("application/json")
			req.SetBodyString(body)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				req.SetRequestURI("http://" + addr + rollout + strconv.Itoa(i) + "/v1/chat/completions")
				if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 || !strings.Contains(string(resp.Body()), "content") {
					b.Fatalf("%v %d %s", err, resp.StatusCode(), resp.Body())
				}
			}
		})
	}
}
