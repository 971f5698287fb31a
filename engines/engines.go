// Package engines is the one place that says what rollgate knows about an
// inference engine kind: which request fields may be injected for capture
// and which the engine leaves out of its answers (Inject), how a replica of
// the kind is recognised (Probe), and the optional capabilities of the
// kind: its tokenizer endpoints (Tokenizing, Detokenizing), its token-in
// endpoints (TokenIn), its own pause modes (Pausing), and how its version
// decides where token ids come from (Versioned).
//
// Each kind is one package (engines/vllm, engines/sglang,
// engines/llamacpp, engines/openai) that registers itself from init;
// cmd/rollgate imports them all. Adding a kind is one new package calling
// Register (and openai.RegisterKind for its name). The gateway and capture
// look the engine of a replica up by its kind (Lookup) and use it through
// the interfaces below.
package engines

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize/fallback"
)

// Engine is one engine kind.
type Engine interface {
	// Kind is the kind the engine serves (its name is Kind().String(), as
	// users write it in --upstream and YAML).
	Kind() openai.Kind
	// Inject says what the gateway may add to a chat or completions
	// request towards this kind, and how the kind's answers look without
	// it.
	Inject() Inject
	// Probe rates how surely the probe documents d show a replica of this
	// kind: ProbeNo, ProbeNamed (e.g. /v1/models' owned_by names it) or
	// ProbeCertain (an endpoint only this kind has).
	Probe(d *Docs) int
}

// Probe ratings (Engine.Probe); the highest rating of all registered
// engines wins.
const (
	ProbeNo      = 0
	ProbeNamed   = 1
	ProbeCertain = 2
)

// Inject is what the gateway may inject into a chat or completions
// request towards an engine kind so that capture gets token ids (and
// usage), and what the kind's answers leave out when not asked for (so the
// client's copy is stripped right). The zero value injects usage on
// streams only.
type Inject struct {
	// Nothing: the kind rejects unknown fields (hosted APIs); nothing is
	// injected at all.
	Nothing bool
	// ReturnTokenIDs: "return_token_ids":true gives prompt and output ids.
	ReturnTokenIDs bool
	// NoIDsOnStreamedChat: the kind refuses return_token_ids on a streamed
	// chat request (SGLang).
	NoIDsOnStreamedChat bool
	// OmitsIDs: answers that did not ask for ids leave their keys out
	// (SGLang), so injected ids are deleted from the client's copy rather
	// than set to null.
	OmitsIDs bool
	// NoStreamUsage: stream_options.include_usage is never injected (on
	// llama.cpp the usage chunk takes the finish chunk's timings, which
	// capture reads the counts from).
	NoStreamUsage bool
	// IDsInLogprobs: output ids come only as the "id" of logprobs entries
	// (llama.cpp), so the sampled tokens' logprobs are always asked for
	// (chat: logprobs and top_logprobs 1, keys left out when not asked
	// for; completions: logprobs 1), except on a streamed chat request
	// with tools, which the kind refuses with logprobs.
	IDsInLogprobs bool
	// TokensAsIDs: old versions give ids only as "token_id:NNN" logprobs
	// tokens (return_tokens_as_token_ids; vLLM before 0.10.2, see
	// Versioned).
	TokensAsIDs bool
	// UsageFingerprint: a stream's trailing usage chunk carries the
	// system_fingerprint the finish chunks lack (vLLM), so when the
	// gateway drops the injected usage chunk it moves the fingerprint onto
	// the finish chunks.
	UsageFingerprint bool
}

// Docs are the documents a probe reads from one replica, each fetched at
// most once however many engines ask.
type Docs struct {
	// BasePath is the path of the replica's base URL, e.g. "/v1".
	BasePath string
	get      func(path string) (status int, body []byte)
	mu       sync.Mutex
	cache    map[string]doc
}

type doc struct {
	status int
	body   []byte
}

// NewDocs returns the probe documents of a replica whose base URL has path
// basePath; get fetches a path of the replica's origin.
func NewDocs(basePath string, get func(path string) (status int, body []byte)) *Docs {
	return &Docs{BasePath: basePath, get: get, cache: map[string]doc{}}
}

// Get returns the status and body of GET path on the replica's origin
// (status 0 when the request failed).
func (d *Docs) Get(path string) (status int, body []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.cache[path]; ok {
		return c.status, c.body
	}
	st, b := d.get(path)
	d.cache[path] = doc{st, b}
	return st, b
}

// Tokenizing is an engine kind with tokenizer endpoints: capture's token-id
// fallback renders and tokenizes a captured request with them.
type Tokenizing interface {
	// Tokenizer returns the client of the tokenizer endpoints of the
	// replica at baseURL (with or without "/v1"), sending with hc.
	Tokenizer(baseURL string, hc *http.Client) fallback.Tokenizer
}

// Detokenizing is an engine kind that turns ids back into text (the
// detokenisation check, --detok-check engine).
type Detokenizing interface {
	// Detokenizer returns the decoder of the replica at baseURL.
	Detokenizer(baseURL string, hc *http.Client) func(ctx context.Context, ids []uint32) ([]byte, error)
}

// Pausing is an engine kind with its own pause routes (POST
// /api/v1/pause?engine=MODE calls them on every replica of the kind, and
// /resume undoes them).
type Pausing interface {
	// PauseModes are the kind's own mode names.
	PauseModes() []string
	// PauseRequest is the path (with the query, from the origin) and body
	// of the pause request in mode, one of PauseModes.
	PauseRequest(mode string) (path string, body []byte)
	// ResumeRequest is the path and body that undo the pause.
	ResumeRequest() (path string, body []byte)
}

// TokenInPaths are an engine's token-in endpoints. Render and Derender are
// relative to the replica's base URL (after its "/v1"), Generate and Abort
// to its origin.
type TokenInPaths struct {
	Render, Derender, Generate, Abort string
}

// Versioned is an engine kind whose version decides where token ids come
// from (Inject.TokensAsIDs).
type Versioned interface {
	// VersionPath is the path (from the origin) of the version document.
	VersionPath() string
	// IDsFromLogprobs reads the version document: old says the version
	// gives ids only through logprobs; ok is false when the document names
	// no version.
	IDsFromLogprobs(doc []byte) (old, ok bool)
}

var (
	registryMu sync.Mutex
	byKind     [256]Engine
	injects    [256]Inject
	order      []Engine
)

func init() {
	for i := range injects {
		injects[i] = Inject{Nothing: true}
	}
}

// Register adds an engine kind. Engine packages call it from init; it
// panics when the kind is registered already.
func Register(e Engine) {
	registryMu.Lock()
	defer registryMu.Unlock()
	k := e.Kind()
	if byKind[k] != nil {
		panic(fmt.Sprintf("engines: kind %s registered twice", k))
	}
	byKind[k] = e
	injects[k] = e.Inject()
	order = append(order, e)
}

// Lookup returns the engine of kind; nil when no package registered it
// (cmd/rollgate imports them all).
func Lookup(kind openai.Kind) Engine { return byKind[kind] }

// InjectOf is Lookup(kind).Inject() without the interface call, for the
// hot path; a kind nobody registered injects nothing.
func InjectOf(kind openai.Kind) Inject { return injects[kind] }

// All lists the registered engines in the order of their kinds (the
// built-in ones first: vllm, sglang, openai, llamacpp).
func All() []Engine {
	registryMu.Lock()
	defer registryMu.Unlock()
	out := append([]Engine(nil), order...)
	slices.SortFunc(out, func(a, b Engine) int { return int(a.Kind()) - int(b.Kind()) })
	return out
}

// Identify names the kind of the replica the probe documents d describe:
// the registered engine rating them highest. With no engine naming them,
// a replica whose /models answers is an OpenAI-compatible server (ok true);
// one that answers nothing is not known yet (ok false).
func Identify(d *Docs) (kind openai.Kind, ok bool) {
	best, bestRate := openai.KindOpenAI, ProbeNo
	for _, e := range All() {
		if r := e.Probe(d); r > bestRate {
			best, bestRate = e.Kind(), r
			if r == ProbeCertain {
				break // as the probe always did: vLLM's /version, then nothing else
			}
		}
	}
	if bestRate > ProbeNo {
		return best, true
	}
	if st, _ := d.Get(d.BasePath + "/models"); st != http.StatusOK {
		return openai.KindOpenAI, false
	}
	return openai.KindOpenAI, true
}

// OwnedBy returns /models' data[0].owned_by, lower case ("" when absent): the
// engine name most OpenAI-compatible servers put there.
func OwnedBy(d *Docs) string {
	st, body := d.Get(d.BasePath + "/models")
	if st != http.StatusOK {
		return ""
	}
	return ownedBy(body)
}

// Root is a replica's base URL without a trailing "/" or "/v1": where its
// engine-specific (non-OpenAI) endpoints are.
func Root(baseURL string) string {
	return strings.TrimSuffix(strings.TrimRight(baseURL, "/"), "/v1")
}

// Filler is the token-id filler of a replica of kind at baseURL (capture's
// IDFiller): nil when the kind has no tokenizer endpoints.
func Filler(kind openai.Kind, baseURL string) *fallback.Client {
	t, ok := Lookup(kind).(Tokenizing)
	if !ok || baseURL == "" {
		return nil
	}
	return &fallback.Client{Tok: t.Tokenizer(baseURL, nil)}
}

// Detokenizer is the decoder of a replica of kind at baseURL (the
// detokenisation check): nil when the kind has none.
func Detokenizer(kind openai.Kind, baseURL string) func(ctx context.Context, ids []uint32) ([]byte, error) {
	d, ok := Lookup(kind).(Detokenizing)
	if !ok || baseURL == "" {
		return nil
	}
	return d.Detokenizer(baseURL, nil)
}

// ProbeOwnedBy is the probe of a kind that /models' owned_by names:
// ProbeNamed when it is name, else ProbeNo.
func ProbeOwnedBy(d *Docs, name string) int {
	if OwnedBy(d) == name {
		return ProbeNamed
	}
	return ProbeNo
}

// Client is one replica's engine-specific endpoints: its Root (Root of the
// base URL) and the HTTP client to call them with (nil: fallback.DefaultHTTP).
type Client struct {
	Root string
	HC   *http.Client
}

// NewClient is the Client of the replica at baseURL.
func NewClient(baseURL string, hc *http.Client) Client { return Client{Root: Root(baseURL), HC: hc} }

// Post sends a JSON body to path under Root (fallback.Post).
func (c Client) Post(ctx context.Context, path string, body []byte) (gjson.Result, error) {
	return fallback.Post(ctx, c.HC, c.Root+path, body)
}

func ownedBy(body []byte) string {
	return strings.ToLower(gjson.GetBytes(body, "data.0.owned_by").String())
}

// PromptIDs tokenizes one completions prompt text of req with the prompt
// form of POST /tokenize, which vLLM and SGLang share.
func (c Client) PromptIDs(ctx context.Context, req gjson.Result, text string) ([]uint32, error) {
	body := map[string]any{"prompt": text, "add_special_tokens": true}
	if m := req.Get("model"); m.Type == gjson.String {
		body["model"] = m.Str
	}
	if a := req.Get("add_special_tokens"); a.IsBool() {
		body["add_special_tokens"] = a.Bool()
	}
	return c.Tokenize(ctx, body)
}

// Tokenize POSTs body (JSON-encoded) to /tokenize and reads the "tokens"
// of the answer, as vLLM, SGLang and llama.cpp all answer.
func (c Client) Tokenize(ctx context.Context, body any) ([]uint32, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("fallback: encoding tokenize request: %w", err)
	}
	res, err := c.Post(ctx, "/tokenize", b)
	if err != nil {
		return nil, err
	}
	return fallback.IDList(res.Get("tokens"), "tokens")
}

// Replica is one replica as capture needs it: its engine kind and base URL
// (with "/v1"). The zero value (BaseURL "") is no known replica.
type Replica struct {
	Kind    openai.Kind
	BaseURL string
}
