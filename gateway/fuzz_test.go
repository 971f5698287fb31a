package gateway_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

// FuzzGatewayInput sends arbitrary bodies to arbitrary paths through the real
// gateway: it must always answer (never crash or hang), and every error it
// produces itself must be OpenAI-style JSON.
//
//	go test -run '^$' -fuzz FuzzGatewayInput -fuzztime 60s ./gateway/
func FuzzGatewayInput(f *testing.F) {
	seeds := []struct{ path, body string }{
		{"/v1/chat/completions", chatBody},
		{"/v1/chat/completions", withStream(chatBody, `"stream":true`)},
		{"/v1/chat/completions", `{"model":"mock-model","messages":[],"n":100000}`},
		{"/v1/chat/completions", `{"model":"mock-model","stream":"yes"}`},
		{"/v1/chat/completions", "{\"model\":\"\xff\xfe\",\"messages\":[]}"},
		{"/v1/completions", `{"model":"mock-model","prompt":[[1,2],[3]],"n":2,"stream":true}`},
		{"/v1/embeddings", `{"model":"mock-model","input":null}`},
		{"/v1/responses", `[1,2,3]`},
		{"/rollout//attempt//v1/chat/completions", chatBody},
		{"/rollout/a/attempt/b/v1/../../api/v1/backends", `{}`},
		{"/api/v1/rollouts/x/rewards", `{"value":1e999}`},
		{"/api/v1/backends", `{"backends":[{"model":"*","replicas":[]}]}`},
		{"/%00", ""},
	}
	for _, s := range seeds {
		f.Add(s.path, s.body)
	}
	s, _ := openSQLite(&testing.T{})
	e := newEnv(&testing.T{}, s, nil)
	c := &fasthttp.Client{ReadTimeout: 30 * time.Second, DisablePathNormalizing: true}
	f.Fuzz(func(t *testing.T, path, body string) {
		u, err := url.Parse("http://x" + path)
		if err != nil || u.Host != "x" || path == "" || path[0] != '/' {
			return
		}
		// Keep the routing table: a fuzzed PUT could replace the mock.
		if u.Path == "/api/v1/backends" {
			return
		}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(e.url + u.EscapedPath())
		req.Header.SetMethod("POST")
		req.Header.SetContentType("application/json")
		req.SetBodyString(body)
		if err := c.Do(req, resp); err != nil {
			t.Fatalf("POST %s %q: no answer: %v", path, body, err)
		}
		if st := resp.StatusCode(); st >= 400 && len(resp.Header.Peek("X-Request-Id")) > 0 {
			// Errors on LLM routes: either the gateway's or the engine's, both JSON with an error object.
			if !gjson.GetBytes(resp.Body(), "error").Exists() {
				t.Fatalf("POST %s %q: %d without an error object: %s", path, body, st, resp.Body())
			}
		}
	})
}
