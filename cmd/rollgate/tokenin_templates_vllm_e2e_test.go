package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/gateway/tokenin"
	"github.com/rollgate/rollgate/testkit/testenv"
	"github.com/rollgate/rollgate/tokenize"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
)

// tplFamily is one real template family served by vLLM through a tiny
// randomly initialised model (scripts/tinymodel) with the real tokenizer.
type tplFamily struct {
	name  string   // scripts/tinymodel's name
	flags []string // vLLM's tool and reasoning parsers
	eot   uint32   // the end-of-turn id the agents bias the answers towards
	tools bool     // the template renders tools and tool calls
	// kwargs are the chat_template_kwargs variants the agents run with.
	kwargs []string
	// ended is how token-in serves a call after an answer that ended on
	// the end-of-turn token: tokenin.Extended, or the fallback a template
	// forces.
	ended string
}

var tplFamilies = []tplFamily{
	{name: "qwen2_5", flags: []string{"--enable-auto-tool-choice", "--tool-call-parser", "hermes"}, eot: 151645, tools: true, kwargs: []string{""}, ended: tokenin.Extended},
	{name: "qwen3", flags: []string{"--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"}, eot: 151645, tools: true,
		kwargs: []string{`{"enable_thinking":true}`, `{"enable_thinking":false}`}, ended: tokenin.Extended},
	// Llama 3.0's template (the @lenml package's) has no tools: it renders
	// every message as header + trimmed content + <|eot_id|>; and its
	// vocabulary has no <|python_tag|>, which vLLM's llama3_json tool
	// parser requires at start (parser_manager.py: TypeError). It writes
	// the assistant header after the last message whatever
	// add_generation_prompt says; tokenin.Join treats that tail as no join,
	// so later calls extend.
	{name: "llama3", eot: 128009, kwargs: []string{""}, ended: tokenin.Extended},
}

// tplAgentCfg is how one agent of TestTokenInRealTemplatesVLLM calls.
type tplAgentCfg struct {
	model, kwargs string
	tools, stream bool
	eot           uint32
	ended         string // tplFamily.ended
}

// The answers' lengths: every turn but tplCutTurn is biased towards the
// end-of-turn token after min_tokens (random weights rarely sample it), so
// it ends there; tplCutTurn has no bias and is cut by max_tokens.
// tplMaxTokens is not 16: vLLM 0.32's render leaves a max_tokens of 16 (the
// SamplingParams default) out of the sampling_params it returns, and
// generate then runs to the context length.
const (
	tplTurns     = 5
	tplCutTurn   = 2
	tplMinTokens = 6
	tplMaxTokens = 20
)

// tplAgent runs one conversation of tplTurns calls against base (an
// attempt's /v1): a system prompt and a user question; with tools, the first
// call forces the get_weather tool (a named tool_choice) and every tool call
// is answered; otherwise a new user message follows each answer. Decoding
// is greedy: a per-request seed kills vLLM 0.32's CPU engine ("CPU
// Generator does not use offset", EngineDeadError). The agent sends each
// answer back as it got it (content and tool calls; reasoning dropped, as
// SDKs do).
func tplAgent(t *testing.T, base, city string, c tplAgentCfg) []tiTurn {
	t.Helper()
	msgs := []tiMessage{{Role: "system", Content: "You answer briefly."}, {Role: "user", Content: "What is the weather in " + city + "?"}}
	var turns []tiTurn
	for turn := range tplTurns {
		mj, _ := json.Marshal(msgs)
		body := fmt.Sprintf(`{"model":%q,"messages":%s,"max_tokens":%d,"temperature":0`, c.model, mj, tplMaxTokens)
		if turn != tplCutTurn {
			body += fmt.Sprintf(`,"min_tokens":%d,"logit_bias":{"%d":100}`, tplMinTokens, c.eot)
		}
		if c.tools {
			choice := `"auto"`
			if turn == 0 {
				choice = `{"type":"function","function":{"name":"get_weather"}}`
			}
			body += `,"tools":` + realTools + `,"tool_choice":` + choice
		}
		if c.kwargs != "" {
			body += `,"chat_template_kwargs":` + c.kwargs
		}
		if c.stream {
			body += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		body += "}"
		status, b, _ := postReal(t, base+"/chat/completions", body)
		if status != 200 {
			t.Fatalf("%s turn %d: %d %s\n%s", city, turn, status, b, body)
		}
		var m tiMessage
		var finish string
		if c.stream {
			m, finish = tiReadStream(t, b)
		} else {
			var ans struct {
				Choices []struct {
					Message      tiMessage `json:"message"`
					FinishReason string    `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(b, &ans); err != nil || len(ans.Choices) != 1 {
				t.Fatalf("%s turn %d: %v %s", city, turn, err, b)
			}
			m, finish = ans.Choices[0].Message, ans.Choices[0].FinishReason
		}
		var tt tiTurn
		m.Reasoning = nil // dropped, as SDKs do
		msgs, tt = tiAnswered(msgs, m, finish)
		turns = append(turns, tt)
	}
	return turns
}

// tplRow is one line of the merge table.
type tplRow struct {
	variant                      string
	calls, later, extended       int
	tiMerged, ptMerged           int
	eotEnded, cut, toolCalls     int
	whole, ptBreaks, renderMatch map[string]int
	ptLater                      int
}

// TestTokenInRealTemplatesVLLM: issue 31 item 2 with the real Qwen2.5,
// Qwen3 (thinking on and off) and Llama 3 templates and tokenizers, served by
// vLLM 0.32 on CPU through tiny random models (scripts/tinymodel; nothing
// from a model hub), one engine at a time. For each family, variant and
// streamed or not: two agents of tplTurns calls through a --token-in gateway
// and a passthrough one. Asserted: every later call on the token-in gateway
// whose previous answer ended on the end-of-turn token is extended, its
// prompt ids start with the previous prompt + response ids, and the bridge's
// --mode trajectories merges every extended call (tokenInMerges); the first
// call gets the same answer both ways; and vLLM's own rendering
// (/v1/chat/completions/render, the rows' prompt ids) equals the Go
// renderer's (tokenize/chattemplate over the same files) for every call the
// engine rendered whole. The table logs passthrough's breaks by
// tokenize.CompareTurn's kind.
func TestTokenInRealTemplatesVLLM(t *testing.T) {
	var table []tplRow
	for _, fam := range tplFamilies {
		t.Run(fam.name, func(t *testing.T) {
			dir, err := testenv.TinyModel(fam.name)
			if err != nil {
				t.Fatal(err)
			}
			retok, err := chattemplate.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			served := "tiny-" + fam.name
			v, err := testenv.StartVLLMModel(dir, served, append([]string{"--max-model-len", "4096"}, fam.flags...)...)
			if err != nil {
				t.Fatalf("TestTokenInRealTemplatesVLLM needs a real vLLM: %v", err)
			}
			defer func() { // one engine at a time: stopped before the next family starts
				if t.Failed() {
					l := v.Log()
					t.Logf("vLLM's log (its end):\n%s", l[max(0, len(l)-8000):])
				}
				v.Stop()
			}()
			for _, kw := range fam.kwargs {
				for _, stream := range []bool{false, true} {
					variant := fam.name
					if strings.Contains(kw, "true") {
						variant += " thinking"
					} else if strings.Contains(kw, "false") {
						variant += " no-thinking"
					}
					if stream {
						variant += ", streamed"
					}
					c := tplAgentCfg{model: served, kwargs: kw, tools: fam.tools, stream: stream, eot: fam.eot, ended: fam.ended}
					table = append(table, tplVariant(t, v.URL, variant, c, retok))
				}
			}
		})
	}
	var b strings.Builder
	b.WriteString("| model, mode | calls | later | extended (token-in) | merged (token-in) | token-in whole:REASON | turns ended on end-of-turn / cut by max_tokens | tool calls returned | passthrough later | passthrough merged | passthrough breaks (turn_kind) | vLLM render = Go render |\n|---|---:|---:|---:|---:|---|---|---:|---:|---:|---|---|\n")
	for _, r := range table {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %d / %d | %d | %d | %d | %s | %s |\n", r.variant, r.calls, r.later, r.extended, r.tiMerged, tplCounts(r.whole), r.eotEnded, r.cut, r.toolCalls, r.ptLater, r.ptMerged, tplCounts(r.ptBreaks), tplCounts(r.renderMatch))
	}
	t.Logf("merge table, real templates on vLLM 0.32 (tiny random models):\n%s", b.String())
}

// tplVariant runs the agents of one variant through a fresh pair of
// gateways on the engine at upstream and returns its table row.
func tplVariant(t *testing.T, upstream, variant string, c tplAgentCfg, retok *chattemplate.Retokenizer) tplRow {
	t.Helper()
	g := startTokenInGateways(t, upstream, "vllm")
	row := tplRow{variant: variant, whole: map[string]int{}, ptBreaks: map[string]int{}, renderMatch: map[string]int{}}
	var n tokenInCounts
	for i, city := range []string{"Paris", "Lima"} {
		rollout := fmt.Sprintf("tpl-%d", i)
		tiTurns := tplAgent(t, "http://"+g.tiAddr+"/rollout/"+rollout+"/attempt/a1/v1", city, c)
		ptTurns := tplAgent(t, "http://"+g.ptAddr+"/rollout/"+rollout+"/attempt/a1/v1", city, c)
		tiR := tiRows(t, g.tiStore, rollout, "a1", len(tiTurns), g.tiLogs)
		ptR := tiRows(t, g.ptStore, rollout, "a1", len(ptTurns), g.ptLogs)
		for _, tt := range tiTurns {
			row.calls++
			switch tt.finish {
			case "length":
				row.cut++
			default:
				row.eotEnded++
			}
			row.toolCalls += len(tt.calls)
		}
		if a, b := tiTurns[0], ptTurns[0]; a.content != b.content || !slices.Equal(a.calls, b.calls) || a.finish != b.finish {
			t.Errorf("%s %s: the first call (the same prompt both ways) answered token-in %+v, passthrough %+v", variant, city, a, b)
		}
		for k, r := range tiR {
			tplRenderCheck(t, variant, retok, r, row.renderMatch)
			if len(r.ResponseTokenIDs) > tplMaxTokens {
				t.Errorf("%s %s call %d: %d response ids on the token-in gateway, max_tokens is %d", variant, city, k, len(r.ResponseTokenIDs), tplMaxTokens)
			}
			if k == 0 {
				if r.TokenIn != tokenin.First {
					t.Errorf("%s %s call 0: token_in %q, want first", variant, city, r.TokenIn)
				}
				continue
			}
			row.later++
			n.later++
			prev := tiR[k-1]
			ended := prev.FinishReason == "stop" || prev.FinishReason == "tool_calls"
			switch {
			case r.TokenIn == tokenin.Extended:
				row.extended++
				n.extended++
				want := slices.Concat(prev.PromptTokenIDs, prev.ResponseTokenIDs)
				if len(r.PromptTokenIDs) <= len(want) || !slices.Equal(r.PromptTokenIDs[:len(want)], want) {
					t.Errorf("%s %s call %d: extended, but its %d prompt ids do not start with the previous %d prompt + %d response ids", variant, city, k, len(r.PromptTokenIDs), len(prev.PromptTokenIDs), len(prev.ResponseTokenIDs))
				}
			case ended && r.TokenIn == c.ended:
				row.whole[r.TokenIn]++
			case ended:
				row.whole[r.TokenIn]++
				t.Errorf("%s %s call %d: the previous answer ended (%s) and the agent extends the history, but token_in is %q\n%s", variant, city, k, prev.FinishReason, r.TokenIn, g.tiLogs)
			default:
				row.whole[r.TokenIn]++
			}
		}
		for k, r := range ptR {
			tplRenderCheck(t, variant, retok, r, row.renderMatch)
			if k == 0 {
				continue
			}
			row.ptLater++
			n.ptLater++
			if r.TurnKind != tokenize.TurnPrefix {
				n.ptBreaks++
				row.ptBreaks[r.TurnKind]++
			}
		}
	}
	if c.ended == tokenin.Extended {
		row.tiMerged, row.ptMerged = tokenInMerges(t, "real vLLM 0.32, "+variant, g, n)
		return row
	}
	if row.extended != 0 {
		t.Errorf("%s: %d calls extended, want every call after an ended answer served %s", variant, row.extended, c.ended)
	}
	_, row.tiMerged, _ = bridgeMerged(t, g.tiDB)
	_, row.ptMerged, _ = bridgeMerged(t, g.ptDB)
	return row
}

// tplRenderCheck compares the prompt ids vLLM rendered for a call (a row
// the engine rendered whole: passthrough, or token-in's first and whole:
// calls) with the Go renderer's over the same request, and counts the
// outcome in seen ("equal", or "differ" with the first difference reported).
func tplRenderCheck(t *testing.T, variant string, retok *chattemplate.Retokenizer, r export.Call, seen map[string]int) {
	t.Helper()
	if r.TokenIn == tokenin.Extended {
		return // the engine rendered only the new messages
	}
	got, err := retok.Retokenize(r.RequestBody, `{"role":"assistant","content":""}`, "stop")
	if err != nil {
		seen["go render failed"]++
		t.Errorf("%s %s call %d: the Go renderer failed: %v", variant, r.RolloutID, r.SequenceID, err)
		return
	}
	if slices.Equal(got.PromptIDs, r.PromptTokenIDs) {
		seen["equal"]++
		return
	}
	seen["differ"]++
	i := 0
	for i < min(len(got.PromptIDs), len(r.PromptTokenIDs)) && got.PromptIDs[i] == r.PromptTokenIDs[i] {
		i++
	}
	t.Errorf("%s %s call %d: vLLM rendered %d prompt ids, the Go renderer %d; first difference at %d: vLLM %v, Go %v\nGo text: %q",
		variant, r.RolloutID, r.SequenceID, len(r.PromptTokenIDs), len(got.PromptIDs), i,
		r.PromptTokenIDs[i:min(i+8, len(r.PromptTokenIDs))], got.PromptIDs[i:min(i+8, len(got.PromptIDs))], got.PromptText)
}

// tplCounts formats a reason → count map as "a 3, b 1" (sorted), or "-".
func tplCounts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
