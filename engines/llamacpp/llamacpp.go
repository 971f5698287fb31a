// Package llamacpp is everything rollgate knows about llama.cpp's server
// (engine kind "llamacpp", also written "llama.cpp"): it never returns
// token ids, but each logprobs entry carries the sampled token's "id", so
// calls are asked for logprobs (removed again from the client's copy); its
// answers leave out the keys of fields not asked for; /models' owned_by
// "llamacpp"; /apply-template then /tokenize. It registers itself with
// package engines.
package llamacpp

import (
	"context"
	"errors"
	"net/http"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

func init() { engines.Register(Engine{}) }

// Engine is the llama.cpp engine kind.
type Engine struct{}

// Kind is openai.KindLlamaCpp.
func (Engine) Kind() openai.Kind { return openai.KindLlamaCpp }

// Inject: ids from logprobs entries; no include_usage (docs/engines.md).
func (Engine) Inject() engines.Inject {
	return engines.Inject{IDsInLogprobs: true, NoStreamUsage: true}
}

// Probe: /models' owned_by "llamacpp".
func (Engine) Probe(d *engines.Docs) int {
	return engines.ProbeOwnedBy(d, "llamacpp")
}

// Tokenizer is /apply-template and /tokenize.
func (Engine) Tokenizer(baseURL string, hc *http.Client) fallback.Tokenizer {
	return tokenizer{engines.NewClient(baseURL, hc)}
}

type tokenizer struct{ engines.Client }

// ChatIDs renders with /apply-template, which runs the chat route's own
// parameter parsing on the whole body (tools, tool_choice,
// chat_template_kwargs, add_generation_prompt, ...): so the request goes
// as the client sent it. Then the text is tokenized the way the chat route
// does (special tokens added and parsed).
func (t tokenizer) ChatIDs(ctx context.Context, req gjson.Result) ([]uint32, error) {
	res, err := t.Post(ctx, "/apply-template", []byte(req.Raw))
	if err != nil {
		return nil, err
	}
	p := res.Get("prompt")
	if p.Type != gjson.String {
		return nil, errors.New("fallback: /apply-template returned no prompt")
	}
	return t.TextIDs(ctx, req, p.Str)
}

// TextIDs is POST /tokenize with special tokens added and parsed.
func (t tokenizer) TextIDs(ctx context.Context, _ gjson.Result, text string) ([]uint32, error) {
	return t.Tokenize(ctx, map[string]any{"content": text, "add_special": true, "parse_special": true})
}

// Interface guards.
var (
	_ engines.Engine     = Engine{}
	_ engines.Tokenizing = Engine{}
)
