package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/rewrite"
	"github.com/rollgate/rollgate/internal/openai"
	"github.com/rollgate/rollgate/tokenize"
)

// engineCell is one row of the table in docs/engines.md ("What rollgate captures,
// per engine"): for an engine, endpoint, streaming, tools and whether the client
// asked for logprobs itself, what the gateway injects, the status the client gets,
// and where the stored prompt and response ids come from.
type engineCell struct {
	engine                 string // vllm, sglang, llamacpp
	chat, stream, tools    bool
	clientLogprobs         bool
	inject                 string // rewrite.Injected.String()
	status                 int
	prompt, response, pair string // prompt_token_source, response_token_source, token_source
	check                  string // token_check
}

// engineTable is docs/engines.md's table, cell for cell. The mock flavours run with
// Config.EndOfTurn, so answers end on the end-of-turn token as real ones do.
var engineTable = func() []engineCell {
	const (
		eng, tok, none = export.TokenSourceEngine, export.TokenSourceTokenize, export.TokenSourceNone
		ids            = "return_token_ids"
		idsUsage       = "return_token_ids|include_usage"
		lpOmit         = "logprobs|omit_logprobs"
	)
	var t []engineCell
	for _, chat := range []bool{true, false} {
		for _, stream := range []bool{false, true} {
			for _, tools := range []bool{false, true} {
				if tools && !chat {
					continue
				}
				for _, lp := range []bool{false, true} {
					c := engineCell{chat: chat, stream: stream, tools: tools, clientLogprobs: lp, status: 200}
					// vLLM: ids asked for everywhere, usage on streams.
					v := c
					v.engine, v.inject, v.prompt, v.response, v.pair = "vllm", ids, eng, eng, eng
					if stream {
						v.inject = idsUsage
					}
					// SGLang: the same, except streamed chat, which refuses
					// return_token_ids: no ids at all there (no chat /tokenize).
					s := v
					s.engine = "sglang"
					s.inject += "|omit_ids"
					if chat && stream {
						s.inject, s.prompt, s.response, s.pair = "include_usage", none, none, none
					}
					// llama.cpp: ids only through logprobs; the prompt from
					// /apply-template + /tokenize.
					l := c
					l.engine, l.prompt, l.response, l.pair = "llamacpp", tok, tok, tok
					switch {
					case !lp && chat && stream && tools:
						l.inject = "none" // refused there: nothing injected
					case !lp && chat:
						l.inject = lpOmit
					case !lp:
						l.inject = "logprobs"
					default:
						l.inject = "none"
					}
					if chat && stream {
						// No chunk carries the end-of-turn token's logprobs: the
						// output ids are one short, only the prompt ids are kept.
						l.response, l.pair, l.check = none, none, tokenize.CheckCompletionCount
						if tools {
							l.check = tokenize.CheckCompletionMissing
						}
						if tools && lp {
							// The client's own logprobs with tools + stream:
							// llama.cpp's 400, passed through and captured.
							l.status, l.prompt, l.check = 400, none, ""
						}
					}
					t = append(t, v, s, l)
				}
			}
		}
	}
	return t
}()

func (c engineCell) name() string {
	ep := "completions"
	if c.chat {
		ep = "chat"
	}
	return fmt.Sprintf("%s/%s/stream=%v/tools=%v/client_logprobs=%v", c.engine, ep, c.stream, c.tools, c.clientLogprobs)
}

func (c engineCell) body() string {
	var b strings.Builder
	b.WriteString(`{"model":"mock-model"`)
	if c.chat {
		b.WriteString(`,"messages":[{"role":"user","content":"weather in Paris?"}]`)
		if c.tools {
			b.WriteString(`,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`)
		}
		if c.clientLogprobs {
			b.WriteString(`,"logprobs":true`)
		}
	} else {
		b.WriteString(`,"prompt":"hello the world"`)
		if c.clientLogprobs {
			b.WriteString(`,"logprobs":1`)
		}
	}
	if c.stream {
		b.WriteString(`,"stream":true`)
	}
	return b.String() + "}"
}

// TestEngineTable runs every cell of the table against the mock flavour of its
// engine, through the gateway: the client's copy equals a direct call's (whatever
// was injected is gone, an engine error passes as sent), and the stored row's
// provenance is the table's.
func TestEngineTable(t *testing.T) {
	s, _ := openSQLite(t)
	envs := map[string]*env{}
	for _, fl := range []mock.Flavor{mock.FlavorVLLM, mock.FlavorSGLang, mock.FlavorLlamaCpp} {
		envs[string(fl)] = newEnvWith(t, s, mock.Config{Flavor: fl, EndOfTurn: true}, func(c *gateway.Config) {
			c.Backends[0].Replicas[0].Kind = string(fl)
		})
	}
	for _, c := range engineTable {
		t.Run(c.name(), func(t *testing.T) {
			e := envs[c.engine]
			body := c.body()
			ep, path := openai.Completions, "/completions"
			if c.chat {
				ep, path = openai.ChatCompletions, "/chat/completions"
			}
			kind, err := openai.ParseKind(c.engine)
			if err != nil {
				t.Fatal(err)
			}
			// What the gateway injects for this cell (its own rewrite).
			if _, _, inj, err := rewrite.Rewrite(nil, []byte(body), ep, kind, rewrite.Options{}); err != nil || inj.String() != c.inject {
				t.Fatalf("injects %s (%v), table says %s", inj, err, c.inject)
			}
			direct := do(t, "POST", e.mockURL+path, body)
			got := do(t, "POST", e.url+"/v1"+path, body)
			if got.status != c.status || direct.status != c.status || string(got.body) != string(direct.body) {
				t.Fatalf("status gateway %d direct %d (table %d)\n gateway: %s\n direct:  %s", got.status, direct.status, c.status, got.body, direct.body)
			}
			row := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
			if row.PromptTokenSource != c.prompt || row.ResponseTokenSource != c.response || row.TokenSource != c.pair || row.TokenCheck != c.check {
				t.Fatalf("row: prompt %q response %q token_source %q token_check %q; table: %q %q %q %q",
					row.PromptTokenSource, row.ResponseTokenSource, row.TokenSource, row.TokenCheck, c.prompt, c.response, c.pair, c.check)
			}
			if (c.prompt != export.TokenSourceNone) != (len(row.PromptTokenIDs) > 0) ||
				(c.response != export.TokenSourceNone) != (len(row.ResponseTokenIDs) > 0) {
				t.Fatalf("ids: %d prompt, %d response", len(row.PromptTokenIDs), len(row.ResponseTokenIDs))
			}
			if c.status >= 400 && row.HTTPStatus != uint16(c.status) {
				t.Fatalf("row status %d", row.HTTPStatus)
			}
		})
	}
}

// TestCompletionsLogprobsTrue: "logprobs": true on /v1/completions (Agent Lightning
// sends it) is read as 1 by vLLM and llama.cpp alike: the call succeeds through the
// gateway as it does directly, the client sees its logprobs, and the ids are stored.
func TestCompletionsLogprobsTrue(t *testing.T) {
	s, _ := openSQLite(t)
	for _, fl := range []mock.Flavor{mock.FlavorVLLM, mock.FlavorLlamaCpp} {
		e := newEnvWith(t, s, mock.Config{Flavor: fl, EndOfTurn: true}, func(c *gateway.Config) {
			c.Backends[0].Replicas[0].Kind = string(fl)
		})
		for _, body := range []string{`{"model":"mock-model","prompt":"hello the world","logprobs":true}`,
			`{"model":"mock-model","prompt":"hello the world","logprobs":true,"stream":true}`} {
			direct := do(t, "POST", e.mockURL+"/completions", body)
			got := do(t, "POST", e.url+"/v1/completions", body)
			if got.status != 200 || string(got.body) != string(direct.body) || !strings.Contains(string(got.body), `"top_logprobs"`) {
				t.Fatalf("%s %s: %d\n gateway: %s\n direct:  %s", fl, body, got.status, got.body, direct.body)
			}
			row := e.waitCalls(got.header.Get("x-request-id"), 1)[0]
			want := export.TokenSourceEngine
			if fl == mock.FlavorLlamaCpp {
				want = export.TokenSourceTokenize
			}
			if row.TokenSource != want || row.ResponseTokenSource != want || len(row.ResponseTokenIDs) == 0 || len(row.ResponseLogprobs) != len(row.ResponseTokenIDs) {
				t.Fatalf("%s %s row: %q %q %d ids %d logprobs", fl, body, row.TokenSource, row.ResponseTokenSource, len(row.ResponseTokenIDs), len(row.ResponseLogprobs))
			}
		}
	}
}
