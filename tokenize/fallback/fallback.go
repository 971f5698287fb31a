// Package fallback obtains token ids for calls whose engine did not return
// them (vLLM before 0.10.2, SGLang streaming chat, llama.cpp's chat route) or
// returned them incompletely (chunks dropped by a tool or reasoning parser):
//
//   - prompt ids from the backend's own tokenizer endpoint, with the same
//     messages, tools and chat template arguments as the captured request,
//     so the engine's chat template is applied (vLLM's POST /tokenize chat
//     form; llama.cpp's /apply-template then /tokenize);
//   - output ids from the logprobs the engine returned: vLLM's
//     "token_id:NNN" tokens (request field return_tokens_as_token_ids) and
//     llama.cpp's non-standard "id" on each logprobs entry.
//
// Rows completed this way are marked token_source "tokenize". Everything
// here runs in the capture pipeline's workers, off the agent's hot path.
package fallback

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/jsonscan"
	"github.com/rollgate/rollgate/internal/openai"
)

// ErrUnsupported is returned when the backend kind has no tokenizer endpoint
// for the request's form (e.g. SGLang's chat form, hosted APIs).
var ErrUnsupported = errors.New("fallback: no tokenizer endpoint for this backend and request form")

// maxResponse bounds a tokenizer endpoint's response body.
const maxResponse = 64 << 20

// Client calls a backend's tokenizer endpoints.
type Client struct {
	// BaseURL is the backend's URL, with or without the OpenAI "/v1" suffix
	// (tokenizer endpoints have no /v1 prefix, which is stripped).
	BaseURL string
	// Kind is the backend's engine; the zero value is vLLM.
	Kind openai.Kind
	// HTTP is the client used (default: one with a 30s timeout).
	HTTP *http.Client
}

var defaultHTTP = &http.Client{Timeout: 30 * time.Second}

func (c *Client) root() string {
	u := strings.TrimRight(c.BaseURL, "/")
	return strings.TrimSuffix(u, "/v1")
}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

// PromptIDs returns the prompt ids of a captured request as the backend
// tokenizes them: one list for a chat request (endpoint containing "chat"),
// one per prompt for a completions request (a string or a list of strings;
// prompts given as ids are returned as they are).
func (c *Client) PromptIDs(ctx context.Context, endpoint string, request []byte) ([][]uint32, error) {
	req := gjson.ParseBytes(request)
	if !req.IsObject() {
		return nil, errors.New("fallback: request body is not a JSON object")
	}
	if openai.ChatShaped(endpoint) {
		ids, err := c.chatIDs(ctx, req)
		if err != nil {
			return nil, err
		}
		return [][]uint32{ids}, nil
	}
	return c.completionIDs(ctx, req)
}

func (c *Client) chatIDs(ctx context.Context, req gjson.Result) ([]uint32, error) {
	msgs := req.Get("messages")
	if !msgs.IsArray() {
		return nil, errors.New("fallback: chat request has no messages array")
	}
	switch c.Kind {
	case openai.KindVLLM:
		// vLLM's chat form; every template-relevant field of the request is
		// forwarded as it is, so /tokenize renders the same prompt.
		var b bytes.Buffer
		b.WriteString(`{"messages":`)
		b.WriteString(msgs.Raw)
		for _, k := range []string{"model", "tools", "chat_template", "chat_template_kwargs", "documents",
			"add_generation_prompt", "continue_final_message", "mm_processor_kwargs"} {
			if v := req.Get(gjsonKey(k)); v.Exists() && v.Type != gjson.Null {
				fmt.Fprintf(&b, `,%q:%s`, k, v.Raw)
			}
		}
		if !req.Get("add_special_tokens").Exists() {
			b.WriteString(`,"add_special_tokens":false`)
		} else {
			fmt.Fprintf(&b, `,"add_special_tokens":%s`, req.Get("add_special_tokens").Raw)
		}
		b.WriteByte('}')
		res, err := c.post(ctx, "/tokenize", b.Bytes())
		if err != nil {
			return nil, err
		}
		return idList(res.Get("tokens"), "tokens")
	case openai.KindLlamaCpp:
		// llama.cpp renders with /apply-template, which runs the chat
		// route's own parameter parsing on the whole body (tools,
		// tool_choice, chat_template_kwargs, add_generation_prompt, ...):
		// so the request goes as the client sent it. Then the text is
		// tokenized the way the chat route does (special tokens added and
		// parsed).
		res, err := c.post(ctx, "/apply-template", []byte(req.Raw))
		if err != nil {
			return nil, err
		}
		p := res.Get("prompt")
		if p.Type != gjson.String {
			return nil, errors.New("fallback: /apply-template returned no prompt")
		}
		return c.llamaTokenize(ctx, p.Str)
	default:
		return nil, ErrUnsupported
	}
}

func (c *Client) llamaTokenize(ctx context.Context, text string) ([]uint32, error) {
	body, err := json.Marshal(map[string]any{"content": text, "add_special": true, "parse_special": true})
	if err != nil {
		return nil, fmt.Errorf("fallback: encoding tokenize request: %w", err)
	}
	res, err := c.post(ctx, "/tokenize", body)
	if err != nil {
		return nil, err
	}
	return idList(res.Get("tokens"), "tokens")
}

func (c *Client) completionIDs(ctx context.Context, req gjson.Result) ([][]uint32, error) {
	p := req.Get("prompt")
	var prompts []gjson.Result
	switch {
	case p.Type == gjson.String:
		prompts = []gjson.Result{p}
	case p.IsArray():
		arr := p.Array()
		if len(arr) > 0 && arr[0].Type == gjson.Number {
			ids, err := idList(p, "prompt")
			return [][]uint32{ids}, err
		}
		prompts = arr
	default:
		return nil, errors.New("fallback: completions request has no prompt")
	}
	out := make([][]uint32, 0, len(prompts))
	for i, pr := range prompts {
		var ids []uint32
		var err error
		switch {
		case pr.IsArray():
			ids, err = idList(pr, "prompt")
		case pr.Type != gjson.String:
			err = fmt.Errorf("fallback: prompt %d is neither text nor ids", i)
		case c.Kind == openai.KindLlamaCpp:
			ids, err = c.llamaTokenize(ctx, pr.Str)
		case c.Kind == openai.KindVLLM || c.Kind == openai.KindSGLang:
			body := map[string]any{"prompt": pr.Str, "add_special_tokens": true}
			if m := req.Get("model"); m.Type == gjson.String {
				body["model"] = m.Str
			}
			if a := req.Get("add_special_tokens"); a.IsBool() {
				body["add_special_tokens"] = a.Bool()
			}
			var b []byte
			if b, err = json.Marshal(body); err == nil {
				var res gjson.Result
				if res, err = c.post(ctx, "/tokenize", b); err == nil {
					ids, err = idList(res.Get("tokens"), "tokens")
				}
			}
		default:
			err = ErrUnsupported
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ids)
	}
	return out, nil
}

// Detokenize turns ids into text with the backend's own tokenizer (vLLM's
// POST /detokenize), for the detokenisation check.
func (c *Client) Detokenize(ctx context.Context, ids []uint32) ([]byte, error) {
	body, err := json.Marshal(map[string]any{"tokens": ids})
	if err != nil {
		return nil, fmt.Errorf("fallback: detokenize: %w", err)
	}
	res, err := c.post(ctx, "/detokenize", body)
	if err != nil {
		return nil, err
	}
	p := res.Get("prompt")
	if p.Type != gjson.String {
		return nil, errors.New("fallback: /detokenize answered without a prompt string")
	}
	return []byte(p.String()), nil
}

// post sends a JSON body and returns the parsed JSON response.
func (c *Client) post(ctx context.Context, path string, body []byte) (gjson.Result, error) {
	url := c.root() + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return gjson.Result{}, fmt.Errorf("fallback: POST %s: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return gjson.Result{}, fmt.Errorf("fallback: POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return gjson.Result{}, fmt.Errorf("fallback: POST %s: reading response: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		msg := gjson.GetBytes(data, "error.message").String()
		if msg == "" {
			msg = gjson.GetBytes(data, "message").String()
		}
		if msg == "" {
			msg = truncate(string(data), 200)
		}
		return gjson.Result{}, fmt.Errorf("fallback: POST %s: HTTP %d: %s", url, resp.StatusCode, msg)
	}
	if err := jsonscan.Validate(data); err != nil {
		return gjson.Result{}, fmt.Errorf("fallback: POST %s: response is not usable JSON: %w", url, err)
	}
	return gjson.ParseBytes(data), nil
}

// idList reads a JSON array of non-negative integers below 2^32.
func idList(v gjson.Result, what string) ([]uint32, error) {
	if !v.IsArray() {
		return nil, fmt.Errorf("fallback: %s is not a list of ids", what)
	}
	var ids []uint32
	var bad bool
	v.ForEach(func(_, e gjson.Result) bool {
		id, ok := u32(e)
		if !ok {
			bad = true
			return false
		}
		ids = append(ids, id)
		return true
	})
	if bad {
		return nil, fmt.Errorf("fallback: %s holds a value that is not a token id", what)
	}
	if ids == nil {
		ids = []uint32{}
	}
	return ids, nil
}

func u32(e gjson.Result) (uint32, bool) {
	if e.Type != gjson.Number || strings.ContainsAny(e.Raw, ".eE-") {
		return 0, false
	}
	n := e.Uint()
	if n > 1<<32-1 {
		return 0, false
	}
	return uint32(n), true
}

// gjsonKey escapes a key for a gjson path.
func gjsonKey(k string) string {
	return strings.NewReplacer(".", `\.`, "*", `\*`, "?", `\?`).Replace(k)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
