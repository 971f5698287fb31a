// Package sglang is everything rollgate knows about SGLang's
// OpenAI-compatible server (engine kind "sglang"): per-choice token ids
// through return_token_ids (refused on streamed chat; keys left out when
// not asked for), /models' owned_by "sglang", the prompt form of
// /tokenize, and its own pause modes. It registers itself with package
// engines.
package sglang

import (
	"context"
	"net/http"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/engines"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

func init() { engines.Register(Engine{}) }

// Engine is the SGLang engine kind.
type Engine struct{}

// Kind is openai.KindSGLang.
func (Engine) Kind() openai.Kind { return openai.KindSGLang }

// Inject: return_token_ids except on streamed chat; answers leave the id
// keys out when not asked for.
func (Engine) Inject() engines.Inject {
	return engines.Inject{ReturnTokenIDs: true, NoIDsOnStreamedChat: true, OmitsIDs: true}
}

// Probe: /models' owned_by "sglang".
func (Engine) Probe(d *engines.Docs) int {
	return engines.ProbeOwnedBy(d, "sglang")
}

// PromptTokenizer is the prompt form of POST /tokenize (SGLang's has no
// chat form). It is not capture's id fallback for SGLang replicas (the
// Engine is not engines.Tokenizing): SGLang returns ids on every form but
// streamed chat, which its /tokenize cannot render.
func PromptTokenizer(baseURL string, hc *http.Client) fallback.Tokenizer {
	return tokenizer{engines.NewClient(baseURL, hc)}
}

type tokenizer struct{ engines.Client }

// ChatIDs is ErrUnsupported: SGLang's /tokenize has no chat form.
func (tokenizer) ChatIDs(context.Context, gjson.Result) ([]uint32, error) {
	return nil, fallback.ErrUnsupported
}

// TextIDs is the prompt form, as on vLLM.
func (t tokenizer) TextIDs(ctx context.Context, req gjson.Result, text string) ([]uint32, error) {
	return t.PromptIDs(ctx, req, text)
}

// The pause routes (sgl-project/sglang python/sglang/srt/entrypoints/
// http_server.py pause_generation / continue_generation and
// srt/managers/io_struct.py PauseGenerationReqInput, read at commit
// f11d231c): POST /pause_generation {"mode": "abort"|"retract"|"in_place"}
// (abort: in-flight requests are aborted and returned; retract: they go
// back to the waiting queue, their KV cache may be flushed and recomputed;
// in_place: the scheduler stops with them in place, KV cache kept), POST
// /continue_generation {}.

// PauseModes are abort, retract and in_place.
func (Engine) PauseModes() []string { return []string{"abort", "retract", "in_place"} }

// PauseRequest is POST /pause_generation {"mode":MODE}.
func (Engine) PauseRequest(mode string) (string, []byte) {
	return "/pause_generation", []byte(`{"mode":"` + mode + `"}`) // mode is one of PauseModes
}

// ResumeRequest is POST /continue_generation {}.
func (Engine) ResumeRequest() (string, []byte) { return "/continue_generation", []byte(`{}`) }

// Interface guards.
var (
	_ engines.Engine  = Engine{}
	_ engines.Pausing = Engine{}
)
