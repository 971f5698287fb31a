// Package fallback obtains token ids for calls whose engine did not return
// them (vLLM before 0.10.2, SGLang streaming chat, llama.cpp's chat route) or
// returned them incompletely (chunks dropped by a tool or reasoning parser):
//
//   - prompt ids from the backend's own tokenizer endpoint, with the same
//     messages, tools and chat template arguments as the captured request,
//     so the engine's chat template is applied (a Tokenizer: each engine
//     kind's package under engines/ has its own, e.g. vLLM's POST /tokenize
//     chat form, llama.cpp's /apply-template then /tokenize);
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

// Tokenizer is one replica's tokenizer endpoints, as its engine kind
// calls them (engines/*: vLLM's /tokenize chat form, llama.cpp's
// /apply-template then /tokenize, ...).
type Tokenizer interface {
	// ChatIDs returns the prompt ids of a chat request (req is the whole
	// captured request), rendered with the engine's chat template;
	// ErrUnsupported when the engine cannot.
	ChatIDs(ctx context.Context, req gjson.Result) ([]uint32, error)
	// TextIDs returns the ids of one completions prompt text of req;
	// ErrUnsupported when the engine cannot.
	TextIDs(ctx context.Context, req gjson.Result, text string) ([]uint32, error)
}

// Client obtains token ids of captured calls through a replica's
// tokenizer endpoints and the logprobs its answers carried.
type Client struct {
	// Tok is the replica's tokenizer endpoints.
	Tok Tokenizer
}

// DefaultHTTP is the client tokenizer endpoints are called with unless one
// is given (a 30s timeout).
var DefaultHTTP = &http.Client{Timeout: 30 * time.Second}

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
		msgs := req.Get("messages")
		if !msgs.IsArray() {
			return nil, errors.New("fallback: chat request has no messages array")
		}
		ids, err := c.Tok.ChatIDs(ctx, req)
		if err != nil {
			return nil, err
		}
		return [][]uint32{ids}, nil
	}
	return c.completionIDs(ctx, req)
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
			ids, err := IDList(p, "prompt")
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
			ids, err = IDList(pr, "prompt")
		case pr.Type != gjson.String:
			err = fmt.Errorf("fallback: prompt %d is neither text nor ids", i)
		default:
			ids, err = c.Tok.TextIDs(ctx, req, pr.Str)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ids)
	}
	return out, nil
}

// Post sends a JSON body to url with hc (nil: DefaultHTTP) and returns the
// parsed JSON response; an answer other than 200 is an error quoting the
// engine's message.
func Post(ctx context.Context, hc *http.Client, url string, body []byte) (gjson.Result, error) {
	if hc == nil {
		hc = DefaultHTTP
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return gjson.Result{}, fmt.Errorf("fallback: POST %s: %w", url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
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

// IDList reads a JSON array of non-negative integers below 2^32 (what
// names the value in errors).
func IDList(v gjson.Result, what string) ([]uint32, error) {
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

// GJSONKey escapes a key for a gjson path.
func GJSONKey(k string) string {
	return strings.NewReplacer(".", `\.`, "*", `\*`, "?", `\?`).Replace(k)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
