package mock

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"github.com/rollgate/rollgate/testkit/testenv"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

func TestFailStatus(t *testing.T) {
	s, base := startT(t, Config{})
	for _, code := range []int{429, 500, 503} {
		r := post(t, base+"/chat/completions", chatBody, "x-mock-fail", "status="+itoa(code))
		e := gjson.ParseBytes(r.body)
		if r.status != code || e.Get("error.code").Int() != int64(code) || e.Get("error.type").Str == "" {
			t.Fatalf("status=%d: %d %s", code, r.status, r.body)
		}
	}
	if e := gjson.ParseBytes(post(t, base+"/chat/completions", chatBody, "x-mock-fail", "status=503").body); e.Get("error.type").Str != "ServiceUnavailableError" {
		t.Fatalf("type %s", e.Raw)
	}
	if r := post(t, base+"/chat/completions", chatBody, "x-mock-fail", "status=abc"); r.status != 400 {
		t.Fatalf("bad status value: %d", r.status)
	}
	if r := post(t, base+"/chat/completions", chatBody, "x-mock-fail", "explode"); r.status != 400 {
		t.Fatalf("unknown mode: %d", r.status)
	}
	for _, h := range []string{"x-mock-ttft-ms", "x-mock-itl-ms", "x-mock-tokens"} {
		if r := post(t, base+"/chat/completions", chatBody, h, "-1"); r.status != 400 || !strings.Contains(string(r.body), h) {
			t.Fatalf("%s: %d %s", h, r.status, r.body)
		}
	}
	if s.Requests() != 9 || s.RequestsTo(PathChat) != 9 {
		t.Fatalf("requests %d / %d", s.Requests(), s.RequestsTo(PathChat))
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestFailMidstream(t *testing.T) {
	_, base := startT(t, Config{})
	for _, path := range []string{"/chat/completions", "/completions", "/responses"} {
		body := `{"messages":[{"role":"user","content":"x"}],"prompt":"x","input":"x","stream":true,"return_token_ids":true}`
		r := post(t, base+path, body, "x-mock-fail", "midstream")
		evs := parseSSE(t, r.body)
		last := evs[len(evs)-1]
		if r.status != 200 || strings.Contains(string(r.body), "[DONE]") || len(evs) < 3 {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
		if path == "/responses" {
			if last.name != "error" || gjson.Get(last.data, "message").Str == "" {
				t.Fatalf("responses error event %v", last)
			}
			continue
		}
		if last.data != midstreamError || gjson.Get(last.data, "error.code").Int() != 500 {
			t.Fatalf("%s: last event %s", path, last.data)
		}
		// Some tokens came first.
		if !strings.Contains(string(r.body), `"token_ids":[`) {
			t.Fatalf("%s: no tokens before the error", path)
		}
		nr := post(t, base+path, strings.Replace(body, `"stream":true`, `"stream":false`, 1), "x-mock-fail", "midstream")
		if nr.status != 500 {
			t.Fatalf("%s non-stream midstream: %d", path, nr.status)
		}
	}
}

func TestFailDisconnect(t *testing.T) {
	_, base := startT(t, Config{})
	req, _ := http.NewRequest(http.MethodPost, base+"/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("x-mock-fail", "disconnect")
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	_, err := (&http.Client{Transport: tr}).Do(req)
	if err == nil || !(errors.Is(err, io.EOF) || strings.Contains(err.Error(), "EOF") || strings.Contains(err.Error(), "reset")) {
		t.Fatalf("want a closed connection, got %v", err)
	}
}

func TestFailHang(t *testing.T) {
	s, base := startT(t, Config{HangTimeout: time.Minute})
	conn, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(base, "/v1"), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-mock-fail: hang\r\nContent-Type: application/json\r\nContent-Length: " +
		itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	if _, err := conn.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	// Nothing arrives while the server holds the connection.
	_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var buf [64]byte
	n, err := conn.Read(buf[:])
	var ne net.Error
	if n != 0 || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %d bytes %q, err %v; want a timeout", n, buf[:n], err)
	}
	// Shutdown releases the held connection: the client sees EOF.
	if err := s.Shutdown(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err = conn.Read(buf[:])
	if n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after shutdown: %d %v", n, err)
	}
}

func TestTTFTHeadersAccepted(t *testing.T) {
	_, base := startT(t, Config{})
	a := mustOK(t, post(t, base+"/chat/completions", chatBody))
	b := mustOK(t, post(t, base+"/chat/completions", chatBody, "x-mock-ttft-ms", "5", "x-mock-itl-ms", "1"))
	if a.Raw != b.Raw {
		t.Fatalf("delays changed the answer")
	}
	r := post(t, base+"/chat/completions", inject(t, chatBody, "stream", true), "x-mock-ttft-ms", "5", "x-mock-itl-ms", "1", "x-mock-tokens", "3")
	if sc := collectChat(t, parseSSE(t, r.body)); len(Encode(sc.text[0])) == 0 || !sc.doneSeen || sc.finish[0] != "stop" {
		t.Fatalf("delayed stream %s", r.body)
	}
}

func TestClientGoneStopsStream(t *testing.T) {
	// A long slow stream: the client reads one event and leaves; shutdown must not hang on it.
	s, base := startT(t, Config{})
	req, _ := http.NewRequest(http.MethodPost, base+"/chat/completions", strings.NewReader(inject(t, chatBody, "stream", true)))
	req.Header.Set("x-mock-tokens", "100000")
	req.Header.Set("x-mock-itl-ms", "20")
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(r.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first line %q %v", line, err)
	}
	if s.ActiveStreams() != 1 {
		t.Fatalf("active streams %d, want 1", s.ActiveStreams())
	}
	r.Body.Close()
	// The server notices the closed connection at its next write and stops the stream.
	testenv.WaitFor(t, 30*time.Second, func() string { return "the stream to stop after the client left" },
		func() bool { return s.ActiveStreams() == 0 })
}

func TestDeterminism(t *testing.T) {
	_, a := startT(t, Config{})
	_, b := startT(t, Config{})
	_, c := startT(t, Config{Seed: 7})
	bodies := []struct{ path, body string }{
		{"/chat/completions", inject(t, chatBody, "n", 2, "logprobs", true, "top_logprobs", 2, "return_token_ids", true)},
		{"/chat/completions", inject(t, chatBody, "stream", true, "return_token_ids", true, "stream_options.include_usage", true)},
		{"/chat/completions", toolsReq},
		{"/completions", `{"prompt":["x","y"],"n":2,"logprobs":1,"stream":true}`},
		{"/responses", `{"input":"hi","stream":true}`},
		{"/embeddings", `{"input":"hi"}`},
	}
	for _, tc := range bodies {
		ra, rb, rc := post(t, a+tc.path, tc.body), post(t, b+tc.path, tc.body), post(t, c+tc.path, tc.body)
		if ra.status != 200 || !bytes.Equal(ra.body, rb.body) {
			t.Fatalf("%s: answers differ:\n%s\n%s", tc.path, ra.body, rb.body)
		}
		if bytes.Equal(ra.body, rc.body) {
			t.Fatalf("%s: Seed did not change the answer", tc.path)
		}
	}
	// Text and id depend on content, not on injected observability fields.
	x := mustOK(t, post(t, a+"/chat/completions", chatBody))
	y := mustOK(t, post(t, a+"/chat/completions", inject(t, chatBody, "logprobs", true, "return_token_ids", true)))
	if x.Get("id").Str != y.Get("id").Str || x.Get("choices.0.message.content").Str != y.Get("choices.0.message.content").Str {
		t.Fatalf("injected fields changed the answer")
	}
	z := mustOK(t, post(t, a+"/chat/completions", inject(t, chatBody, "seed", 1)))
	if z.Get("choices.0.message.content").Str == x.Get("choices.0.message.content").Str || z.Get("id").Str == x.Get("id").Str {
		t.Fatalf("seed did not change the answer")
	}
}

func TestRecording(t *testing.T) {
	s, base := startT(t, Config{})
	post(t, base+"/chat/completions", chatBody, "X-Trace", "abc")
	if string(s.LastRequest()) != chatBody || s.LastPath() != PathChat || s.LastHeader("x-trace") != "abc" {
		t.Fatalf("last request %q %q %q", s.LastRequest(), s.LastPath(), s.LastHeader("x-trace"))
	}
	do(t, http.MethodGet, base+"/models", "")
	if s.Requests() != 2 || s.RequestsTo(PathModels) != 1 || s.RequestsTo("/x") != 0 || s.LastPath() != PathModels {
		t.Fatalf("counts %d %d", s.Requests(), s.RequestsTo(PathModels))
	}
}

func TestRegisterFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"-model", "q", "-extra-models", "a, b", "-ttft", "5ms", "-itl", "1ms", "-max-tokens", "9",
		"-ignore-return-token-ids", "-drop-ids-every", "3", "-seed", "4", "-created", "5"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Model != "q" || len(c.ExtraModels) != 2 || c.ExtraModels[1] != "b" || c.TTFT != 5*time.Millisecond || c.ITL != time.Millisecond ||
		c.MaxTokens != 9 || !c.IgnoreReturnTokenIDs || c.DropIDsEvery != 3 || c.Seed != 4 || c.Created != 5 {
		t.Fatalf("config %+v", c)
	}
	var d Config
	d.RegisterFlags(flag.NewFlagSet("d", flag.ContinueOnError))
	if d.Model != DefaultModel || d.MaxTokens != DefaultMaxTokens || d.Version != DefaultVersion {
		t.Fatalf("defaults %+v", d)
	}
}

// serveInMemory runs the handler on one request without a network, draining streams.
func serveInMemory(h fasthttp.RequestHandler, ctx *fasthttp.RequestCtx, path string, body []byte) []byte {
	ctx.Request.Reset()
	ctx.Response.Reset()
	ctx.Request.Header.SetMethod(fasthttp.MethodPost)
	ctx.Request.SetRequestURI(path)
	ctx.Request.SetBody(body)
	h(ctx)
	return ctx.Response.Body()
}

var fuzzPaths = []string{PathChat, PathCompletions, PathResponses, PathEmbeddings, PathTokenize, PathDetokenize, PathApplyTemplate}

// FuzzHandler sends any body to every route of every flavour (route picks the path, and
// route/len(fuzzPaths) the flavour): the answer is a 200 with valid JSON or SSE, or an
// error in the flavour's shape whose code is the status.
func FuzzHandler(f *testing.F) {
	for _, s := range []string{chatBody, toolsReq, `{"prompt":[[1,2],[3]],"n":2,"stream":true,"logprobs":3}`,
		`{"input":"x","stream":true}`, `{"messages":[{"role":"user","content":"x"}],"stream":true,"logprobs":true,"top_logprobs":2,"n":2,"return_token_ids":true}`,
		`{"tokens":[1,2,300]}`, `{"messages":[{"role":"user"}],"tools":[{"function":{"name":"f","parameters":{"properties":{"a":{"type":"array","items":{"type":"object","properties":{"b":{"type":"number"}}}}}}}}]}`,
		`{"content":"<|im_start|>x","with_pieces":true,"parse_special":false}`, `{"prompt":["a","b"],"return_token_ids":true,"stream":true}`,
		`{`, `null`, `{"n":1e300}`} {
		for i := 0; i < len(fuzzPaths)*len(Flavors); i++ {
			f.Add(uint8(i), []byte(s))
		}
	}
	var hs []fasthttp.RequestHandler
	for _, fl := range Flavors {
		hs = append(hs, New(Config{Flavor: fl}).Handler())
	}
	f.Fuzz(func(t *testing.T, route uint8, body []byte) {
		var ctx fasthttp.RequestCtx
		r := int(route)
		fl := (r / len(fuzzPaths)) % len(Flavors)
		out := serveInMemory(hs[fl], &ctx, fuzzPaths[r%len(fuzzPaths)], body)
		status := ctx.Response.StatusCode()
		switch {
		case status != 200:
			e := gjson.ParseBytes(out)
			if Flavors[fl] != FlavorSGLang {
				e = e.Get("error")
			}
			if !gjson.ValidBytes(out) || e.Get("message").Str == "" || e.Get("code").Int() != int64(status) {
				t.Fatalf("%s: status %d with body %q", Flavors[fl], status, out)
			}
		case bytes.HasPrefix(ctx.Response.Header.ContentType(), []byte("text/event-stream")):
			evs := parseSSE(t, out)
			if len(evs) == 0 {
				t.Fatalf("empty stream")
			}
		default:
			if !gjson.ValidBytes(out) {
				t.Fatalf("invalid JSON %q", out)
			}
		}
	})
}

// TestFailBrokenStreams: badjson, junk and truncate break chat and
// completion streams the way a faulty engine or proxy would.
func TestFailBrokenStreams(t *testing.T) {
	_, base := startT(t, Config{})
	for _, path := range []string{"/chat/completions", "/completions"} {
		body := `{"messages":[{"role":"user","content":"x"}],"prompt":"x","stream":true,"return_token_ids":true}`
		r := post(t, base+path, body, "x-mock-fail", "badjson")
		if r.status != 200 || !strings.Contains(string(r.body), "data: {\"id\":\"chatcmpl-broken\"") || !strings.Contains(string(r.body), "data: [DONE]") {
			t.Fatalf("%s badjson: %d %s", path, r.status, r.body)
		}
		r = post(t, base+path, body, "x-mock-fail", "junk")
		if r.status != 200 || !strings.Contains(string(r.body), "\nthis line is not server-sent events\n") || !strings.Contains(string(r.body), "data: [DONE]") {
			t.Fatalf("%s junk: %d %s", path, r.status, r.body)
		}
		r = post(t, base+path, body, "x-mock-fail", "truncate")
		if r.status != 200 || strings.Contains(string(r.body), "[DONE]") || strings.Contains(string(r.body), `"finish_reason":"`) || !strings.Contains(string(r.body), `"token_ids":[`) {
			t.Fatalf("%s truncate: %d %s", path, r.status, r.body)
		}
		nb := strings.Replace(body, `"stream":true`, `"stream":false`, 1)
		for _, knob := range []string{"badjson", "junk", "truncate"} {
			if r := post(t, base+path, nb, "x-mock-fail", knob); r.status != 200 || gjson.ValidBytes(r.body) {
				t.Fatalf("%s non-stream %s: %d %s", path, knob, r.status, r.body)
			}
		}
	}
}
