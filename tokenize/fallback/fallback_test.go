package fallback_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/capture"
	"github.com/rollgate/rollgate/engines"
	_ "github.com/rollgate/rollgate/engines/llamacpp"
	"github.com/rollgate/rollgate/engines/sglang"
	_ "github.com/rollgate/rollgate/engines/vllm"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

func startMock(t *testing.T, cfg mock.Config) (*mock.Server, string) {
	t.Helper()
	s, base, err := mock.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Shutdown() })
	return s, base
}

func post(t *testing.T, url, body string) []byte {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
	return b
}

func jsonIDs(v gjson.Result) []uint32 {
	var ids []uint32
	for _, e := range v.Array() {
		ids = append(ids, uint32(e.Uint()))
	}
	return ids
}

// ssePayloads splits an SSE body into its data payloads.
func ssePayloads(body []byte) [][]byte {
	var out [][]byte
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		for _, line := range bytes.Split(ev, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				out = append(out, d)
			}
		}
	}
	return out
}

// captured is a call as the capture pipeline sees it.
type captured struct {
	rows     []export.Call
	request  []byte
	payloads [][]byte
}

func (c *captured) each(f func([]byte)) {
	for _, p := range c.payloads {
		f(p)
	}
}

// call sends request to the engine at base+path and assembles its rows with
// the real capture code.
func call(t *testing.T, base, path, request string) *captured {
	t.Helper()
	body := post(t, base+path, request)
	p := capture.AcquirePending()
	p.Meta = export.Call{RolloutID: "r", AttemptID: "a", SequenceID: 1, Endpoint: path, HTTPStatus: 200}
	p.Endpoint = openai.EndpointOf(path)
	p.Request = request
	c := &captured{request: []byte(request)}
	if gjson.Get(request, "stream").Bool() {
		c.payloads = ssePayloads(body)
		for _, d := range c.payloads {
			p.AddEvent(d)
		}
	} else {
		p.Body = body
		c.payloads = [][]byte{body}
	}
	var a capture.Assembler
	c.rows = capture.Rows(p, &a)
	return c
}

const (
	chatPath = "/chat/completions"
	cmplPath = "/completions"
	messages = `[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello the world"},` +
		`{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\": 1}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"42"}]`
	tools = `[{"type":"function","function":{"name":"f","description":"a tool","parameters":{"type":"object","properties":{"x":{"type":"integer"}}}}}]`
)

func chatRequest(stream bool, extra string) string {
	s := fmt.Sprintf(`{"model":"m","messages":%s,"tools":%s,"chat_template_kwargs":{"enable_thinking":false},`+
		`"return_token_ids":true,"max_tokens":12%s`, messages, tools, extra)
	if stream {
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return s + "}"
}

func TestPromptIDsVLLMChatEqualsEngine(t *testing.T) {
	_, base := startMock(t, mock.Config{})
	req := chatRequest(false, "")
	want := gjson.GetBytes(post(t, base+chatPath, req), "prompt_token_ids")
	c := engines.Filler(openai.KindVLLM, base)
	got, err := c.PromptIDs(context.Background(), "/v1/chat/completions", []byte(req))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !slices.Equal(got[0], jsonIDs(want)) {
		t.Fatalf("tokenize ids %v\nengine ids %s", got, want.Raw)
	}
	if len(got[0]) < 20 || got[0][0] != mock.TokenIMStart {
		t.Fatalf("implausible prompt ids %v", got[0])
	}
	// Without tools the prompt differs: the tools really are forwarded.
	noTools, err := c.PromptIDs(context.Background(), "/v1/chat/completions",
		[]byte(`{"model":"m","messages":`+messages+`}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(noTools[0]) >= len(got[0]) {
		t.Fatalf("tools not forwarded: %d >= %d ids", len(noTools[0]), len(got[0]))
	}
}

func TestPromptIDsCompletions(t *testing.T) {
	_, base := startMock(t, mock.Config{})
	c := engines.Filler(openai.KindVLLM, base) // base ends in /v1
	for _, tc := range []struct{ name, prompt string }{
		{"string", `"hello the world"`},
		{"list", `["hello the world","quick brown fox"]`},
		{"ids", `[1,2,300]`},
		{"list of ids", `[[1,2],[3]]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := `{"model":"m","prompt":` + tc.prompt + `,"max_tokens":2,"return_token_ids":true}`
			resp := gjson.ParseBytes(post(t, base+cmplPath, req))
			got, err := c.PromptIDs(context.Background(), cmplPath, []byte(req))
			if err != nil {
				t.Fatal(err)
			}
			chs := resp.Get("choices").Array()
			if len(got) != len(chs) {
				t.Fatalf("%d prompts, %d choices", len(got), len(chs))
			}
			for i, ch := range chs {
				if want := jsonIDs(ch.Get("prompt_token_ids")); !slices.Equal(got[i], want) {
					t.Fatalf("prompt %d: %v, engine %v", i, got[i], want)
				}
			}
		})
	}
}

func TestPromptIDsErrors(t *testing.T) {
	_, base := startMock(t, mock.Config{})
	ctx := context.Background()
	c := engines.Filler(openai.KindVLLM, base)
	for _, tc := range []struct{ endpoint, req, want string }{
		{chatPath, `[]`, "not a JSON object"},
		{chatPath, `{"model":"m"}`, "no messages"},
		{cmplPath, `{"model":"m"}`, "no prompt"},
		{cmplPath, `{"prompt":[{"a":1}]}`, "neither text nor ids"},
		{cmplPath, `{"prompt":[1.5]}`, "not a token id"},
	} {
		if _, err := c.PromptIDs(ctx, tc.endpoint, []byte(tc.req)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.req, err, tc.want)
		}
	}
	sg := &fallback.Client{Tok: sglang.PromptTokenizer(base, nil)}
	if _, err := sg.PromptIDs(ctx, chatPath, []byte(`{"messages":[]}`)); err != fallback.ErrUnsupported {
		t.Fatalf("sglang chat: %v", err)
	}
	// The engine's 400 surfaces with its message.
	if _, err := c.PromptIDs(ctx, chatPath, []byte(`{"messages":{}}`)); err == nil {
		t.Fatal("messages object accepted")
	}
	down := engines.Filler(openai.KindVLLM, "http://127.0.0.1:1")
	if _, err := down.PromptIDs(ctx, cmplPath, []byte(`{"prompt":"x"}`)); err == nil || !strings.Contains(err.Error(), "127.0.0.1:1/tokenize") {
		t.Fatalf("unreachable backend: %v", err)
	}
}

// reference returns the rows of the same call on an engine that returns ids.
func reference(t *testing.T, path, req string) []export.Call {
	t.Helper()
	_, base := startMock(t, mock.Config{})
	c := call(t, base, path, req)
	if c.rows[0].TokenSource != export.TokenSourceEngine {
		t.Fatalf("reference engine: %s %s", c.rows[0].TokenSource, c.rows[0].TokenCheck)
	}
	return c.rows
}

// A Client is the capture pipeline's id filler; neither package imports the
// other outside tests.
var _ capture.IDFiller = (*fallback.Client)(nil)

func TestFill(t *testing.T) {
	const lp = `,"logprobs":true,"return_tokens_as_token_ids":true`
	const cmplLP = `,"logprobs":1,"return_tokens_as_token_ids":true`
	cmplReq := func(stream bool) string {
		s := `{"model":"m","prompt":["hello the world","quick brown fox jumps"],"n":2,"max_tokens":9,"return_token_ids":true` + cmplLP
		if stream {
			s += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		return s + "}"
	}
	for _, tc := range []struct {
		name      string
		cfg       mock.Config
		path, req string
		before    string // token_source before Fill
		check     string // token_check after Fill
		prompt    bool   // prompt ids fetched
	}{
		{"ids missing, chat", mock.Config{IgnoreReturnTokenIDs: true}, chatPath, chatRequest(false, lp), export.TokenSourceNone, "", true},
		{"ids missing, chat stream", mock.Config{IgnoreReturnTokenIDs: true}, chatPath, chatRequest(true, lp+`,"n":3`), export.TokenSourceNone, "", true},
		{"ids missing, completions n=2 x 2 prompts", mock.Config{IgnoreReturnTokenIDs: true}, cmplPath, cmplReq(false), export.TokenSourceNone, "", true},
		{"ids missing, completions stream", mock.Config{IgnoreReturnTokenIDs: true}, cmplPath, cmplReq(true), export.TokenSourceNone, "", true},
		{"ids dropped on some chunks", mock.Config{DropIDsEvery: 2}, chatPath, chatRequest(true, lp), tokenize.SourceMismatch, "completion_count,logprobs_count", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := reference(t, tc.path, tc.req)
			srv, base := startMock(t, tc.cfg)
			c := call(t, base, tc.path, tc.req)
			if got := c.rows[0].TokenSource; got != tc.before {
				t.Fatalf("before Fill: token_source %s (%s)", got, c.rows[0].TokenCheck)
			}
			before := srv.RequestsTo(mock.PathTokenize)
			cl := engines.Filler(openai.KindVLLM, base)
			out, err := cl.Fill(context.Background(), c.rows, c.request, c.each)
			if err != nil {
				t.Fatal(err)
			}
			if out.Prompt != tc.prompt || !out.Output || out.Skipped {
				t.Fatalf("outcome %+v", out)
			}
			if n := srv.RequestsTo(mock.PathTokenize) - before; (n > 0) != tc.prompt {
				t.Fatalf("%d /tokenize requests", n)
			}
			if len(c.rows) != len(want) {
				t.Fatalf("%d rows, reference %d", len(c.rows), len(want))
			}
			for i := range c.rows {
				r := &c.rows[i]
				if r.TokenSource != export.TokenSourceTokenize || r.TokenCheck != tc.check {
					t.Fatalf("row %d: %s %q", i, r.TokenSource, r.TokenCheck)
				}
				wantPrompt := export.TokenSourceTokenize
				if !tc.prompt {
					wantPrompt = export.TokenSourceEngine // the engine's, verified: kept
				}
				if r.PromptTokenSource != wantPrompt || r.ResponseTokenSource != export.TokenSourceTokenize {
					t.Fatalf("row %d: sources prompt %q response %q", i, r.PromptTokenSource, r.ResponseTokenSource)
				}
				if !slices.Equal(r.PromptTokenIDs, want[i].PromptTokenIDs) || !slices.Equal(r.ResponseTokenIDs, want[i].ResponseTokenIDs) {
					t.Fatalf("row %d ids\n got %v | %v\nwant %v | %v", i, r.PromptTokenIDs, r.ResponseTokenIDs,
						want[i].PromptTokenIDs, want[i].ResponseTokenIDs)
				}
				if len(r.ResponseTokenIDs) == 0 {
					t.Fatalf("row %d: no output ids", i)
				}
			}
		})
	}
}

func TestFillLeavesRowsAlone(t *testing.T) {
	ctx := context.Background()
	// Engine ids verified: nothing to do, no request.
	srv, base := startMock(t, mock.Config{})
	c := call(t, base, chatPath, chatRequest(false, ""))
	cl := engines.Filler(openai.KindVLLM, base)
	before := srv.RequestsTo(mock.PathTokenize)
	if out, err := cl.Fill(ctx, c.rows, c.request, c.each); err != nil || !out.Skipped {
		t.Fatalf("engine ids: %+v %v", out, err)
	}
	if srv.RequestsTo(mock.PathTokenize) != before {
		t.Fatal("tokenize called for verified ids")
	}
	if out, err := cl.Fill(ctx, nil, nil, nil); err != nil || !out.Skipped {
		t.Fatalf("no rows: %+v %v", out, err)
	}

	// No ids and no logprobs: an error; the output side stays empty and the
	// pair unusable (token_source none), but the verified prompt ids are
	// kept, marked on their own (prompt_token_source tokenize).
	_, base = startMock(t, mock.Config{IgnoreReturnTokenIDs: true})
	c = call(t, base, chatPath, chatRequest(false, ""))
	want := reference(t, chatPath, chatRequest(false, ""))
	orig := slices.Clone(c.rows)
	cl = engines.Filler(openai.KindVLLM, base)
	out, err := cl.Fill(ctx, c.rows, c.request, c.each)
	if err == nil || !strings.Contains(err.Error(), "return_tokens_as_token_ids") || !out.Prompt || out.Output {
		t.Fatalf("no logprobs: %+v %v", out, err)
	}
	if r := c.rows[0]; r.TokenSource != orig[0].TokenSource || len(r.ResponseTokenIDs) != 0 ||
		!slices.Equal(r.PromptTokenIDs, want[0].PromptTokenIDs) || r.PromptTokenSource != export.TokenSourceTokenize ||
		r.ResponseTokenSource != export.TokenSourceNone || r.TokenCheck != tokenize.CheckCompletionMissing {
		t.Fatalf("rows: %+v", c.rows[0])
	}

	// Logprobs as text (no token ids): unusable.
	c = call(t, base, chatPath, chatRequest(false, `,"logprobs":true`))
	if _, err := cl.Fill(ctx, c.rows, c.request, c.each); err == nil {
		t.Fatal("text logprobs accepted")
	}

	// Ids that disagree with usage are not applied: a backend whose
	// /tokenize renders another template.
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"count":2,"tokens":[1,2]}`)
	}))
	defer other.Close()
	c = call(t, base, chatPath, chatRequest(false, `,"logprobs":true,"return_tokens_as_token_ids":true`))
	cl = engines.Filler(openai.KindVLLM, other.URL)
	out, err = cl.Fill(ctx, c.rows, c.request, c.each)
	if err == nil || !slices.Contains(out.Failed, tokenize.CheckPromptCount) {
		t.Fatalf("wrong template accepted: %+v %v", out, err)
	}
	if c.rows[0].TokenSource != export.TokenSourceNone || c.rows[0].PromptTokenIDs != nil {
		t.Fatalf("rows changed: %+v", c.rows[0])
	}
	// The output side, complete in the logprobs, is kept on its own.
	if r := c.rows[0]; !out.Output || r.ResponseTokenSource != export.TokenSourceTokenize ||
		!slices.Equal(r.ResponseTokenIDs, want[0].ResponseTokenIDs) || r.PromptTokenSource != export.TokenSourceNone || r.TokenCheck != tokenize.CheckPromptCount {
		t.Fatalf("output side: %+v", r)
	}

	// A failed call is skipped.
	c.rows[0].HTTPStatus = 500
	if out, err := cl.Fill(ctx, c.rows, c.request, c.each); err != nil || !out.Skipped {
		t.Fatalf("failed call: %+v %v", out, err)
	}
}

// fakeLlamaCpp serves /apply-template and /tokenize like llama.cpp's server,
// with a one-byte-per-id tokenizer.
func fakeLlamaCpp(t *testing.T) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		j := gjson.ParseBytes(body)
		switch r.URL.Path {
		case "/apply-template":
			// Like llama.cpp, the whole chat body is read: tools and
			// chat_template_kwargs change the rendered prompt.
			var b strings.Builder
			if tools := j.Get("tools"); tools.IsArray() {
				fmt.Fprintf(&b, "<tools>%d", len(tools.Array()))
			}
			if kw := j.Get("chat_template_kwargs.enable_thinking"); kw.Exists() {
				fmt.Fprintf(&b, "<think>%s", kw.Raw)
			}
			j.Get("messages").ForEach(func(_, m gjson.Result) bool {
				fmt.Fprintf(&b, "<%s>%s", m.Get("role").Str, m.Get("content").Str)
				return true
			})
			fmt.Fprintf(w, `{"prompt":%q}`, b.String())
		case "/tokenize":
			if !j.Get("add_special").Bool() || !j.Get("parse_special").Bool() {
				http.Error(w, `{"error":{"message":"flags"}}`, 400)
				return
			}
			ids := []string{"1"} // BOS
			for _, c := range []byte(j.Get("content").Str) {
				ids = append(ids, fmt.Sprint(c))
			}
			fmt.Fprintf(w, `{"tokens":[%s]}`, strings.Join(ids, ","))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func TestLlamaCpp(t *testing.T) {
	s := fakeLlamaCpp(t)
	c := engines.Filler(openai.KindLlamaCpp, s.URL+"/v1/")
	ctx := context.Background()
	got, err := c.PromptIDs(ctx, chatPath, []byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{1, '<', 'u', 's', 'e', 'r', '>', 'h', 'i'}; !slices.Equal(got[0], want) {
		t.Fatalf("chat ids %v", got)
	}
	// Tools and template arguments reach /apply-template (the whole body).
	got, err = c.PromptIDs(ctx, chatPath, []byte(`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"chat_template_kwargs":{"enable_thinking":false},"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]uint32{1}, u32s([]byte("<tools>1<think>false<user>hi"))...); !slices.Equal(got[0], want) {
		t.Fatalf("chat ids with tools %v, want %v", got[0], want)
	}
	got, err = c.PromptIDs(ctx, cmplPath, []byte(`{"prompt":"ab"}`))
	if err != nil || !slices.Equal(got[0], []uint32{1, 'a', 'b'}) {
		t.Fatalf("completion ids %v %v", got, err)
	}

	// A llama.cpp chat response: ids only in logprobs' "id".
	resp := `{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop",` +
		`"logprobs":{"content":[{"id":888,"token":"o","logprob":-0.1,"bytes":[111],"top_logprobs":[]},` +
		`{"id":74,"token":"k","logprob":-0.2,"bytes":[107],"top_logprobs":[]}]}}],` +
		`"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}`
	req := `{"model":"m","messages":[{"role":"user","content":"hi"}],"logprobs":true}`
	p := capture.AcquirePending()
	p.Meta = export.Call{Endpoint: "/v1/chat/completions", HTTPStatus: 200}
	p.Endpoint = openai.ChatCompletions
	p.Request, p.Body = req, []byte(resp)
	var a capture.Assembler
	rows := capture.Rows(p, &a)
	if rows[0].TokenSource != export.TokenSourceNone {
		t.Fatalf("before: %s", rows[0].TokenSource)
	}
	out, err := c.Fill(ctx, rows, []byte(req), func(f func([]byte)) { f([]byte(resp)) })
	if err != nil || !out.Prompt || !out.Output {
		t.Fatalf("%+v %v", out, err)
	}
	if !slices.Equal(rows[0].ResponseTokenIDs, []uint32{888, 74}) || len(rows[0].PromptTokenIDs) != 9 ||
		rows[0].TokenSource != export.TokenSourceTokenize {
		t.Fatalf("row %+v", rows[0])
	}
}

// u32s widens bytes to ids (the fake tokenizer's one id per byte).
func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b))
	for i, c := range b {
		out[i] = uint32(c)
	}
	return out
}

func TestLogprobIDs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		payloads []string
		index    uint32
		want     []uint32
		ok       bool
	}{
		{"vllm chat", []string{`{"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:5","logprob":-1},{"token":"token_id:4294967295","logprob":-1}]}}]}`},
			0, []uint32{5, 4294967295}, true},
		{"vllm chat stream, two choices", []string{
			`{"choices":[{"index":1,"delta":{"content":"a"},"logprobs":{"content":[{"token":"token_id:7"}]}}]}`,
			`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"token_id:1"}]}}]}`,
			`{"choices":[{"index":1,"delta":{"content":"a"},"logprobs":{"content":[{"token":"token_id:8"}]}}]}`,
			`{"choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`,
			`{"choices":[],"usage":{"prompt_tokens":1}}`, `[DONE]`}, 1, []uint32{7, 8}, true},
		{"completions", []string{`{"choices":[{"index":0,"logprobs":{"tokens":["token_id:3","token_id:0"],"token_logprobs":[-1,-2]}}]}`},
			0, []uint32{3, 0}, true},
		{"llama.cpp id wins over token", []string{`{"choices":[{"index":0,"logprobs":{"content":[{"id":9,"token":"token_id:1"}]}}]}`},
			0, []uint32{9}, true},
		{"text tokens", []string{`{"choices":[{"index":0,"logprobs":{"content":[{"token":"hi"}]}}]}`}, 0, nil, false},
		{"one entry without id", []string{`{"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:1"},{"token":"x"}]}}]}`}, 0, nil, false},
		{"overflow", []string{`{"choices":[{"index":0,"logprobs":{"tokens":["token_id:4294967296"]}}]}`}, 0, nil, false},
		{"signs and junk", []string{`{"choices":[{"index":0,"logprobs":{"tokens":["token_id:+1","token_id:-1","token_id:"]}}]}`}, 0, nil, false},
		{"negative llama id", []string{`{"choices":[{"index":0,"logprobs":{"content":[{"id":-1}]}}]}`}, 0, nil, false},
		{"no logprobs", []string{`{"choices":[{"index":0,"logprobs":null}]}`}, 0, nil, false},
		{"other choice", []string{`{"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:1"}]}}]}`}, 2, nil, false},
		{"empty content", []string{`{"choices":[{"index":0,"logprobs":{"content":[]}}]}`}, 0, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l fallback.LogprobIDs
			for _, p := range tc.payloads {
				l.Add([]byte(p))
			}
			got, ok := l.IDs(tc.index)
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Fatalf("IDs = %v %v, want %v %v", got, ok, tc.want, tc.ok)
			}
			l.Reset()
			if _, ok := l.IDs(tc.index); ok || len(l.Choices()) != 0 {
				t.Fatal("Reset kept data")
			}
		})
	}
}

func FuzzLogprobIDs(f *testing.F) {
	f.Add([]byte(`{"choices":[{"index":0,"logprobs":{"content":[{"token":"token_id:5"}]}}]}`))
	f.Add([]byte(`{"choices":[{"index":3,"logprobs":{"tokens":["token_id:3"]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"logprobs":{"content":[{"id":1e3}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var l fallback.LogprobIDs
		l.Add(data)
		l.Add(data)
		for _, i := range l.Choices() {
			ids, ok := l.IDs(i)
			if ok && len(ids)%2 != 0 {
				t.Fatalf("same payload twice gave %d ids", len(ids))
			}
		}
	})
}

func BenchmarkLogprobIDs(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"choices":[{"index":0,"logprobs":{"content":[`)
	for i := range 256 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprintf(&sb, `{"token":"token_id:%d","logprob":-0.5,"bytes":[1],"top_logprobs":[]}`, i)
	}
	sb.WriteString(`]}}]}`)
	body := []byte(sb.String())
	b.ReportAllocs()
	var l fallback.LogprobIDs
	for b.Loop() {
		l.Reset()
		l.Add(body)
	}
}
