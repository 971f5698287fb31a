package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
)

// message is one chat message of an agent's conversation.
type message struct {
	Role       string     `json:"role"`
	Content    string     `json:"content"`
	ToolCalls  []toolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
}

type toolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatRequest struct {
	Model         string          `json:"model"`
	Messages      []message       `json:"messages"`
	MaxTokens     int             `json:"max_tokens,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	StreamOptions *streamOptions  `json:"stream_options,omitempty"`
	Tools         json.RawMessage `json:"tools,omitempty"`
	// ReturnTokenIDs is vLLM's return_token_ids.
	ReturnTokenIDs bool `json:"return_token_ids,omitempty"`
	// Logprobs asks for the sampled tokens' logprobs (no alternatives).
	Logprobs bool `json:"logprobs,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// weatherTool is the tool offered on tool turns.
var weatherTool = json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Current weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`)

// agent runs rollouts one call at a time; it is not safe for concurrent use.
type agent struct {
	cfg    *Config
	system string // the system message (see Config.SystemBytes)
	body   bytes.Buffer
	timer  *time.Timer // Config.ThinkTime's
}

func newAgent(cfg *Config) *agent { return &agent{cfg: cfg, system: systemPrompt(cfg.SystemBytes)} }

// systemPrompt is the system message: a short instruction, padded to about
// n bytes with sentences (some with quotes, escaped in JSON) when n is larger.
func systemPrompt(n int) string {
	const base = "You are a helpful agent solving a task step by step."
	if n <= len(base) {
		return base
	}
	var b strings.Builder
	b.Grow(n + 64)
	b.WriteString(base)
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, " Context note %d: the \"weather\" service returns JSON, and tools must be called with valid arguments.", i)
	}
	return b.String()
}

// rolloutContext is about n bytes of text of rollout's own (see
// Config.ContextBytes): "" when n is 0.
func rolloutContext(rollout string, n int) string {
	var b strings.Builder
	b.Grow(n + 96)
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, " Observation %d of %s: the service answered with record %d and asked for the next step.", i, rollout, i*7919%1000)
	}
	return b.String()
}

// rollout runs cfg.Turns calls of one rollout (attempt "1"), appending them to
// calls. It stops early when ctx ends or a call fails; a call in flight is
// allowed to finish.
func (a *agent) rollout(ctx context.Context, rolloutID string, calls []Call) []Call {
	msgs := []message{{Role: "system", Content: a.system}}
	for turn := 0; turn < a.cfg.Turns && ctx.Err() == nil; turn++ {
		last := msgs[len(msgs)-1]
		if last.Role != "tool" {
			content := fmt.Sprintf("Step %d of rollout %s: what should we do next?", turn+1, rolloutID)
			if turn == 0 {
				content += rolloutContext(rolloutID, a.cfg.ContextBytes)
			}
			msgs = append(msgs, message{Role: "user", Content: content})
		}
		tools := a.cfg.ToolEvery > 0 && (turn%a.cfg.ToolEvery == 0 || last.Role == "tool")
		c, reply := a.send(context.WithoutCancel(ctx), rolloutID, turn, msgs, tools, time.Now())
		calls = append(calls, c)
		if !c.OK() {
			break
		}
		msgs = append(msgs, reply)
		for _, tc := range reply.ToolCalls {
			msgs = append(msgs, message{Role: "tool", ToolCallID: tc.ID, Content: `{"city":"Paris","temperature_c":21}`})
		}
		if a.cfg.ThinkTime > 0 && turn+1 < a.cfg.Turns {
			a.think(ctx)
		}
	}
	return calls
}

// think waits Config.ThinkTime, or until ctx ends.
func (a *agent) think(ctx context.Context) {
	if a.timer == nil {
		a.timer = time.NewTimer(a.cfg.ThinkTime)
	} else {
		a.timer.Reset(a.cfg.ThinkTime)
	}
	select {
	case <-a.timer.C:
	case <-ctx.Done():
		a.timer.Stop()
	}
}

// call makes the i-th call of an open-loop run, a single-turn rollout due at
// at; every ToolEvery-th call offers a tool.
func (a *agent) call(ctx context.Context, rolloutID string, i int, at time.Time) Call {
	msgs := []message{
		{Role: "system", Content: a.system},
		{Role: "user", Content: fmt.Sprintf("Step 1 of rollout %s: what should we do next?", rolloutID)},
	}
	c, _ := a.send(ctx, rolloutID, 0, msgs, a.cfg.ToolEvery > 0 && i%a.cfg.ToolEvery == 0, at)
	return c
}

func (a *agent) url(rolloutID string) string {
	if a.cfg.PathStyle == PathPlain {
		return a.cfg.BaseURL + "/v1/chat/completions"
	}
	return a.cfg.BaseURL + "/rollout/" + rolloutID + "/attempt/1/v1/chat/completions"
}

// send makes one call; start is when it was due (latency counts from there).
func (a *agent) send(ctx context.Context, rolloutID string, turn int, msgs []message, tools bool, start time.Time) (Call, message) {
	c := Call{RolloutID: rolloutID, AttemptID: "1", Turn: turn, Stream: a.cfg.Stream, Start: start, CompletionTokens: -1}
	req := chatRequest{Model: a.cfg.Model, Messages: msgs, MaxTokens: a.cfg.MaxTokens, Stream: a.cfg.Stream, ReturnTokenIDs: a.cfg.ReturnTokenIDs, Logprobs: a.cfg.Logprobs}
	if a.cfg.Stream && a.cfg.IncludeUsage {
		req.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if tools {
		req.Tools = weatherTool
	}
	a.body.Reset()
	if err := json.NewEncoder(&a.body).Encode(&req); err != nil {
		c.Err = "encoding request: " + err.Error()
		return c, message{}
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url(rolloutID), bytes.NewReader(a.body.Bytes()))
	if err != nil {
		c.Err = "building request: " + err.Error()
		return c, message{}
	}
	hr.Header.Set("Content-Type", "application/json")
	for k, vs := range a.cfg.Header {
		for _, v := range vs {
			hr.Header.Add(k, v)
		}
	}
	resp, err := a.cfg.Client.Do(hr)
	if err != nil {
		c.Err = "transport: " + err.Error()
		c.Latency = time.Since(start)
		return c, message{}
	}
	defer resp.Body.Close()
	c.Status = resp.StatusCode
	c.RequestID = resp.Header.Get("x-request-id")
	c.SequenceID = resp.Header.Get("x-sequence-id")
	var reply message
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		c.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	} else if a.cfg.Stream {
		reply, err = readStream(resp.Body, start, &c)
	} else {
		reply, err = readJSON(resp.Body, &c)
	}
	c.Latency = time.Since(start)
	if err != nil && c.Err == "" {
		c.Err = err.Error()
	}
	c.ToolCall = len(reply.ToolCalls) > 0
	return c, reply
}

// readJSON reads a non-streaming chat completion.
func readJSON(r io.Reader, c *Call) (message, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return message{}, fmt.Errorf("reading body: %w", err)
	}
	if jsonscan.Validate(b) != nil {
		return message{}, fmt.Errorf("body is not JSON: %.80q", b)
	}
	res := gjson.ParseBytes(b)
	if u := res.Get("usage.completion_tokens"); u.Exists() {
		c.CompletionTokens = int(u.Int())
	}
	m := res.Get("choices.0.message")
	if !m.Exists() {
		return message{}, fmt.Errorf("no choices[0].message in %.80q", b)
	}
	reply := message{Role: "assistant", Content: m.Get("content").String()}
	m.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
		reply.ToolCalls = append(reply.ToolCalls, toolCall{
			ID: tc.Get("id").String(), Type: "function",
			Function: toolFunction{Name: tc.Get("function.name").String(), Arguments: tc.Get("function.arguments").String()},
		})
		return true
	})
	return reply, nil
}

// maxToolCalls bounds the tool calls of one streamed message.
const maxToolCalls = 128

// readStream reads an SSE chat completion stream to its [DONE], assembling
// choice 0's message and recording the time to the first token.
func readStream(r io.Reader, start time.Time, c *Call) (message, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 16<<10), 16<<20)
	var (
		content []byte
		tools   []toolCall
		done    bool
	)
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[5:])
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			continue
		}
		if jsonscan.Validate(data) != nil {
			return message{}, fmt.Errorf("stream event is not JSON: %.80q", data)
		}
		ev := gjson.ParseBytes(data)
		if u := ev.Get("usage.completion_tokens"); u.Exists() {
			c.CompletionTokens = int(u.Int())
		}
		d := ev.Get("choices.0.delta")
		if !d.Exists() {
			continue
		}
		text := d.Get("content").String()
		tcs := d.Get("tool_calls")
		if c.TTFT == 0 && (text != "" || tcs.Exists()) {
			c.TTFT = time.Since(start)
		}
		content = append(content, text...)
		var bad error
		tcs.ForEach(func(_, tc gjson.Result) bool {
			i := int(tc.Get("index").Int())
			if i < 0 || i >= maxToolCalls {
				bad = fmt.Errorf("stream event: tool call index %d out of range", i)
				return false
			}
			for len(tools) <= i {
				tools = append(tools, toolCall{Type: "function"})
			}
			if id := tc.Get("id").String(); id != "" {
				tools[i].ID = id
			}
			if n := tc.Get("function.name").String(); n != "" {
				tools[i].Function.Name = n
			}
			tools[i].Function.Arguments += tc.Get("function.arguments").String()
			return true
		})
		if bad != nil {
			return message{}, bad
		}
	}
	if err := sc.Err(); err != nil {
		return message{}, fmt.Errorf("reading stream: %w", err)
	}
	if !done {
		return message{}, fmt.Errorf("stream ended without [DONE]")
	}
	return message{Role: "assistant", Content: string(content), ToolCalls: tools}, nil
}
