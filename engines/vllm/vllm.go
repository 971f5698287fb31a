// Package vllm is everything rollgate knows about vLLM's OpenAI-compatible
// server (engine kind "vllm"): return_token_ids (>= 0.10.2; older versions
// give ids as "token_id:NNN" logprobs tokens), GET /version for probing,
// /tokenize and /detokenize, the token-in endpoints (render, generate,
// derender, abort) and its own pause modes. It registers itself with
// package engines.
package vllm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

func init() { engines.Register(Engine{}) }

// Engine is the vLLM engine kind.
type Engine struct{}

// Kind is openai.KindVLLM.
func (Engine) Kind() openai.Kind { return openai.KindVLLM }

// Inject: return_token_ids; "token_id:NNN" logprobs on old versions; the
// usage chunk of a stream carries the system_fingerprint.
func (Engine) Inject() engines.Inject {
	return engines.Inject{ReturnTokenIDs: true, TokensAsIDs: true, UsageFingerprint: true}
}

// Probe: GET /version answers a version only on vLLM; else /models'
// owned_by "vllm".
func (Engine) Probe(d *engines.Docs) int {
	if st, body := d.Get(versionPath); st == http.StatusOK && gjson.GetBytes(body, "version").Exists() {
		return engines.ProbeCertain
	}
	return engines.ProbeOwnedBy(d, "vllm")
}

const versionPath = "/version"

// VersionPath is GET /version.
func (Engine) VersionPath() string { return versionPath }

// IDsFromLogprobs: versions before 0.10.2 ignore return_token_ids.
func (Engine) IDsFromLogprobs(doc []byte) (old, ok bool) {
	v := gjson.GetBytes(doc, "version")
	if !v.Exists() {
		return false, false
	}
	return versionBefore(v.String(), 0, 10, 2), true
}

// versionBefore reports whether a version string such as "0.9.2",
// "0.10.1.1" or "0.11.0.dev12+gabc" is older than major.minor.patch. An
// unreadable version counts as new.
func versionBefore(v string, major, minor, patch int) bool {
	var nums [3]int
	for i := range nums {
		j := 0
		for j < len(v) && v[j] >= '0' && v[j] <= '9' {
			nums[i] = nums[i]*10 + int(v[j]-'0')
			j++
		}
		if j == 0 {
			if i == 0 {
				return false // not a version number
			}
			break
		}
		v = v[j:]
		if i < 2 {
			if len(v) == 0 || v[0] != '.' {
				break
			}
			v = v[1:]
		}
	}
	want := [3]int{major, minor, patch}
	for i := range nums {
		if nums[i] != want[i] {
			return nums[i] < want[i]
		}
	}
	return false
}

// Tokenizer is vLLM's POST /tokenize (chat and prompt forms).
func (Engine) Tokenizer(baseURL string, hc *http.Client) fallback.Tokenizer {
	return tokenizer{engines.NewClient(baseURL, hc)}
}

type tokenizer struct{ engines.Client }

// ChatIDs uses vLLM's chat form; every template-relevant field of the
// request is forwarded as it is, so /tokenize renders the same prompt.
func (t tokenizer) ChatIDs(ctx context.Context, req gjson.Result) ([]uint32, error) {
	var b bytes.Buffer
	b.WriteString(`{"messages":`)
	b.WriteString(req.Get("messages").Raw)
	for _, k := range []string{"model", "tools", "chat_template", "chat_template_kwargs", "documents",
		"add_generation_prompt", "continue_final_message", "mm_processor_kwargs"} {
		if v := req.Get(fallback.GJSONKey(k)); v.Exists() && v.Type != gjson.Null {
			fmt.Fprintf(&b, `,%q:%s`, k, v.Raw)
		}
	}
	if !req.Get("add_special_tokens").Exists() {
		b.WriteString(`,"add_special_tokens":false`)
	} else {
		fmt.Fprintf(&b, `,"add_special_tokens":%s`, req.Get("add_special_tokens").Raw)
	}
	b.WriteByte('}')
	res, err := t.Post(ctx, "/tokenize", b.Bytes())
	if err != nil {
		return nil, err
	}
	return fallback.IDList(res.Get("tokens"), "tokens")
}

// TextIDs uses the prompt form of /tokenize.
func (t tokenizer) TextIDs(ctx context.Context, req gjson.Result, text string) ([]uint32, error) {
	return t.PromptIDs(ctx, req, text)
}

// Detokenizer is vLLM's POST /detokenize.
func (Engine) Detokenizer(baseURL string, hc *http.Client) func(ctx context.Context, ids []uint32) ([]byte, error) {
	c := engines.NewClient(baseURL, hc)
	return func(ctx context.Context, ids []uint32) ([]byte, error) {
		body, err := json.Marshal(map[string]any{"tokens": ids})
		if err != nil {
			return nil, fmt.Errorf("fallback: detokenize: %w", err)
		}
		res, err := c.Post(ctx, "/detokenize", body)
		if err != nil {
			return nil, err
		}
		p := res.Get("prompt")
		if p.Type != gjson.String {
			return nil, errors.New("fallback: /detokenize answered without a prompt string")
		}
		return []byte(p.String()), nil
	}
}

// The pause routes, vLLM 0.32.0 (vllm/entrypoints/rl/online/api_router.py,
// registered only with VLLM_SERVER_DEV_MODE=1 by
// entrypoints/launchers/api_server/routers.py; elsewhere 404): POST
// /pause?mode=abort|wait|keep (abort: in-flight requests end with
// finish_reason "abort"; wait: returns once they finished; keep: they are
// frozen in the scheduler and go on after /resume; default abort; a bad
// mode is 422), POST /resume, GET /is_paused.

// PauseModes are abort, wait and keep.
func (Engine) PauseModes() []string { return []string{"abort", "wait", "keep"} }

// PauseRequest is POST /pause?mode=MODE.
func (Engine) PauseRequest(mode string) (string, []byte) {
	return "/pause?mode=" + url.QueryEscape(mode), nil
}

// ResumeRequest is POST /resume.
func (Engine) ResumeRequest() (string, []byte) { return "/resume", nil }

// Interface guards.
var (
	_ engines.Engine       = Engine{}
	_ engines.Tokenizing   = Engine{}
	_ engines.Detokenizing = Engine{}
	_ engines.Pausing      = Engine{}
	_ engines.TokenIn      = Engine{}
	_ engines.Versioned    = Engine{}
)
