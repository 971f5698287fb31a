// Command bareproxy is the floor of bench/compare: a reverse proxy built of
// the same parts as rollgate's forward path (a fasthttp server, a fasthttp
// HostClient with keep-alive, SSE streamed chunk by chunk) and nothing else:
// no parsing of requests or events, no capture, no metrics. What rollgate adds
// beyond it is rollgate's own work; what it adds beyond direct is what a Go
// proxy built on fasthttp costs on the machine at hand (one more process on
// the path: two more socket hops and the scheduling that goes with them).
//
//	go run ./bench/bareproxy --listen 127.0.0.1:8002 --upstream 127.0.0.1:8001
//
// Not part of rollgate; used only by bench/compare (target "bareproxy").
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8002", "address to serve on")
	upstream := flag.String("upstream", "127.0.0.1:8001", "host:port of the engine")
	flag.Parse()
	srv := newServer(*upstream)
	slog.Info("bareproxy listening", "listen", *listen, "upstream", *upstream)
	if err := srv.ListenAndServe(*listen); err != nil {
		slog.Error("serve", "err", err)
		os.Exit(1)
	}
}

// newServer returns the proxy's server, forwarding to upstream (host:port).
func newServer(upstream string) *fasthttp.Server {
	hc := &fasthttp.HostClient{
		Addr:                          upstream,
		MaxConns:                      16384,
		MaxIdleConnDuration:           90 * time.Second,
		ReadBufferSize:                8 << 10,
		WriteBufferSize:               4 << 10,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
	}
	return &fasthttp.Server{
		Handler:               func(ctx *fasthttp.RequestCtx) { forward(hc, ctx) },
		NoDefaultServerHeader: true,
		ReadBufferSize:        8 << 10,
		Concurrency:           1 << 20,
	}
}

// forward sends the request on as it came and the answer back as it comes.
func forward(hc *fasthttp.HostClient, ctx *fasthttp.RequestCtx) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	ctx.Request.CopyTo(req)
	req.Header.Del("Connection")
	resp := fasthttp.AcquireResponse()
	resp.StreamBody = true
	if err := hc.Do(req, resp); err != nil {
		fasthttp.ReleaseResponse(resp)
		msg, _ := json.Marshal("bareproxy: " + err.Error())
		ctx.SetStatusCode(fasthttp.StatusBadGateway)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":` + string(msg) + `,"type":"upstream_error"}}`)
		return
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.SetContentTypeBytes(resp.Header.ContentType())
	if bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		ctx.SetBodyStream(&release{Reader: resp.BodyStream(), resp: resp}, -1)
		return
	}
	ctx.SetBody(resp.Body())
	fasthttp.ReleaseResponse(resp)
}

// release hands the backend response (and its connection) back once
// fasthttp has written the whole stream.
type release struct {
	io.Reader
	resp *fasthttp.Response
}

func (r *release) Close() error {
	fasthttp.ReleaseResponse(r.resp)
	return nil
}
