package mock

import (
	"flag"
	"strings"
	"time"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultModel        = "mock-model"
	DefaultVersion      = "0.10.2"
	DefaultCreated      = 1700000000
	DefaultMaxTokens    = 16
	DefaultMaxModelLen  = 32768
	DefaultEmbeddingDim = 8
	DefaultHangTimeout  = 60 * time.Second
	// MaxN caps the "n" request field, to keep a fuzzed or hostile request cheap.
	MaxN = 128
	// MaxLogprobs is the largest logprobs / top_logprobs accepted (vLLM's default max_logprobs).
	MaxLogprobs = 20
)

// Config configures a mock server. Every zero value means "use the default".
type Config struct {
	// Flavor is the engine imitated: FlavorVLLM, FlavorSGLang or FlavorLlamaCpp (see Flavor).
	// New panics on any other value; Start and the -flavor flag return an error. Default vllm.
	Flavor Flavor
	// Model is the served model name listed first by /v1/models. Requests may name any
	// model; responses echo the requested name (or Model when the request names none).
	// Default "mock-model".
	Model string
	// ExtraModels are more names listed by /v1/models. Default none.
	ExtraModels []string
	// Version is what GET /version reports. Default "0.10.2".
	Version string
	// Created is the fixed "created" timestamp of every response. Default 1700000000.
	Created int64
	// TTFT is the delay before the first token (streams) or before the response
	// (non-streaming; which then also waits ITL per further token). Default 0.
	TTFT time.Duration
	// ITL is the delay between consecutive tokens. Default 0.
	ITL time.Duration
	// MaxTokens is the natural output length in tokens: a choice ends with finish_reason
	// "stop" after this many tokens unless the request's max_tokens is lower ("length").
	// The x-mock-tokens header overrides it per request. Default 16.
	MaxTokens int
	// MaxModelLen is the context length reported by /tokenize and /v1/models and enforced
	// on prompts. Default 32768.
	MaxModelLen int
	// EmbeddingDim is the length of /v1/embeddings vectors. Default 8.
	EmbeddingDim int
	// IgnoreReturnTokenIDs makes the server behave like vLLM < 0.10.2: return_token_ids is
	// accepted and ignored, so no token ids appear anywhere. Default false.
	IgnoreReturnTokenIDs bool
	// DropIDsEvery, when k > 0, omits the "token_ids" of every k-th content chunk of each
	// choice in streams (vLLM's tool-parser bug); usage still counts those tokens. Default 0.
	DropIDsEvery int
	// Seed is mixed into every generated text, so two mocks with different seeds answer
	// differently. Default 0.
	Seed uint64
	// HangTimeout bounds how long x-mock-fail: hang waits for the client to go away.
	// Default 60s.
	HangTimeout time.Duration
	// PrefixCacheBlocks > 0 turns on the prefix-cache model (see prefixcache.go):
	// an LRU of this many prompt blocks of PrefixBlockSize tokens, like vLLM's
	// automatic prefix caching; hits are reported as
	// usage.prompt_tokens_details.cached_tokens. Default 0: off.
	PrefixCacheBlocks int
	// SplitChars, when n > 0, replaces every n-th generated word by an emoji that the
	// toy tokenizer splits into four byte tokens (splitchar.go): vLLM returns them all
	// (text only with the last); llama.cpp leaves the first three out of logprobs and
	// streams. Not with stop strings. Default 0: off.
	SplitChars int
	// EndOfTurn ends every answer that stops on its own (finish_reason "stop", or
	// "tool_calls") with the end-of-turn token <|im_end|>, as a real model does: the
	// token is generated, counted in usage.completion_tokens and, like the engines,
	// left out of the text. Where its id and logprob appear follows the flavour
	// (docs/engines.md): vLLM puts it in token_ids and logprobs (on the finish chunk
	// of a stream); llama.cpp in the logprobs of non-streamed answers and completion
	// streams, but not of chat streams (no chunk carries it). SGLang's output ids were
	// not read from its source: the flavour ignores the knob. Default false.
	EndOfTurn bool
	// PrefillPerToken is added to the time to first token for every prompt
	// token not served from the prefix cache (every prompt token when the
	// model is off). Default 0.
	PrefillPerToken time.Duration
	// ScaleOut serves vLLM 0.32's token-in endpoints (render, generate,
	// derender: tokenin.go), as vllm serve --enable-scale-out does; off,
	// they answer 403 as vLLM's do. Default false.
	ScaleOut bool
	// DevMode serves vLLM's dev-mode pause routes /pause, /resume and
	// /is_paused (VLLM_SERVER_DEV_MODE=1; enginepause.go). Default false
	// (404, as vLLM).
	DevMode bool
	// ModelDir, when set, is a Hugging Face model folder (tokenizer.json and
	// tokenizer_config.json, or chat_template.jinja): real-template mode
	// (vocab.go). Its chat template and tokenizer replace the toy ones
	// everywhere (chat prompts with chat_template_kwargs, /tokenize,
	// /detokenize, the token-in endpoints, token ids and logprobs); answers
	// are the tokenizer's encoding of the text the mock says, end on the
	// template's end-of-turn token (EndOfTurn is implied), and are parsed as
	// vLLM 0.32 parses them for the model: Qwen3's <think> block as
	// reasoning, tool calls as the hermes parser (Qwen) or llama3_json
	// (a template without <tool_call>) reads them. vLLM flavour only, not
	// with SplitChars. Default "": the toy tokenizer and template.
	ModelDir string
}

func (c *Config) setDefaults() {
	if c.Flavor == "" {
		c.Flavor = FlavorVLLM
	}
	if c.Model == "" {
		c.Model = DefaultModel
	}
	if c.Version == "" {
		c.Version = DefaultVersion
	}
	if c.Created == 0 {
		c.Created = DefaultCreated
	}
	if c.MaxTokens <= 0 {
		c.MaxTokens = DefaultMaxTokens
	}
	if c.MaxModelLen <= 0 {
		c.MaxModelLen = DefaultMaxModelLen
	}
	if c.EmbeddingDim <= 0 {
		c.EmbeddingDim = DefaultEmbeddingDim
	}
	if c.HangTimeout <= 0 {
		c.HangTimeout = DefaultHangTimeout
	}
}

// RegisterFlags registers flags for c's fields on fs, with c's current values (or the
// defaults) as flag defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.setDefaults()
	fs.Func("flavor", flavorFlagHelp+" (default vllm)", func(v string) error {
		f, err := ParseFlavor(strings.TrimSpace(v))
		if err == nil {
			c.Flavor = f
		}
		return err
	})
	fs.StringVar(&c.Model, "model", d.Model, "served model name listed by /v1/models; requests may name any model")
	fs.Func("extra-models", "comma-separated extra model names listed by /v1/models (default none)", func(s string) error {
		c.ExtraModels = nil
		for _, m := range strings.Split(s, ",") {
			if m = strings.TrimSpace(m); m != "" {
				c.ExtraModels = append(c.ExtraModels, m)
			}
		}
		return nil
	})
	fs.StringVar(&c.Version, "version", d.Version, "vLLM version reported by GET /version (flavor vllm only)")
	fs.Int64Var(&c.Created, "created", d.Created, "fixed \"created\" unix timestamp of every response")
	fs.DurationVar(&c.TTFT, "ttft", d.TTFT, "delay before the first token, e.g. 50ms (per request: header x-mock-ttft-ms)")
	fs.DurationVar(&c.ITL, "itl", d.ITL, "delay between tokens, e.g. 10ms (per request: header x-mock-itl-ms)")
	fs.IntVar(&c.MaxTokens, "max-tokens", d.MaxTokens, "natural output length in tokens when the request's max_tokens is not lower (per request: header x-mock-tokens)")
	fs.IntVar(&c.MaxModelLen, "max-model-len", d.MaxModelLen, "context length in tokens, enforced on prompts")
	fs.IntVar(&c.EmbeddingDim, "embedding-dim", d.EmbeddingDim, "length of /v1/embeddings vectors")
	fs.BoolVar(&c.IgnoreReturnTokenIDs, "ignore-return-token-ids", d.IgnoreReturnTokenIDs, "behave like vLLM < 0.10.2: ignore return_token_ids (no ids anywhere)")
	fs.IntVar(&c.DropIDsEvery, "drop-ids-every", d.DropIDsEvery, "k > 0: omit token_ids of every k-th streamed content chunk (vLLM tool-parser bug); 0 disables")
	fs.Uint64Var(&c.Seed, "seed", d.Seed, "seed mixed into all generated text")
	fs.DurationVar(&c.HangTimeout, "hang-timeout", d.HangTimeout, "how long x-mock-fail: hang holds a connection")
	fs.IntVar(&c.PrefixCacheBlocks, "prefix-cache-blocks", d.PrefixCacheBlocks, "n > 0: model vLLM's automatic prefix caching with an LRU of n prompt blocks of 16 tokens (cached prompt tokens skip --prefill-per-token and are reported as usage.prompt_tokens_details.cached_tokens and on GET /metrics); 0 = off")
	fs.IntVar(&c.SplitChars, "split-chars", d.SplitChars, "n > 0: every n-th generated word is an emoji split over four byte tokens (how each engine reports those tokens: docs/engines.md); 0 = off")
	fs.BoolVar(&c.EndOfTurn, "end-of-turn", d.EndOfTurn, "end answers that stop on their own with the end-of-turn token <|im_end|> (counted in usage; in token_ids and logprobs where each engine puts it, see docs/engines.md)")
	fs.BoolVar(&c.ScaleOut, "enable-scale-out", d.ScaleOut, "serve vLLM 0.32's token-in endpoints POST /v1/chat/completions/render, /inference/v1/generate and /v1/chat/completions/derender (flavor vllm; off: 403 as vLLM); with rollgate --token-in also set --end-of-turn, since the gateway takes a stopped answer's last id for its end-of-turn token")
	fs.BoolVar(&c.DevMode, "dev-mode", d.DevMode, "serve vLLM's dev-mode pause routes POST /pause?mode=abort|wait|keep, POST /resume and GET /is_paused (vLLM with VLLM_SERVER_DEV_MODE=1; flavor vllm; off: 404 as vLLM)")
	fs.StringVar(&c.ModelDir, "model-dir", d.ModelDir, "real-template mode: a Hugging Face model folder whose tokenizer.json and chat template (tokenizer_config.json or chat_template.jinja) replace the toy ones in chat prompts (chat_template_kwargs honoured), /tokenize, /detokenize and the token-in endpoints; answers are that tokenizer's ids, end on the template's end-of-turn token (implies --end-of-turn) and are parsed as vLLM 0.32 does for Qwen (qwen3 reasoning, hermes tool calls) and Llama 3 (llama3_json); flavor vllm only; empty = the toy tokenizer")
	fs.DurationVar(&c.PrefillPerToken, "prefill-per-token", d.PrefillPerToken, "time to first token added per prompt token not served from the prefix cache, e.g. 20us (see --prefix-cache-blocks); 0 = none")
}
