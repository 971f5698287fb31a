package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// templateCase is one model (template and tokenizer) the token-in agents
// run over: the mock in real-template mode (--model-dir) or the toy.
type templateCase struct {
	name   string
	model  string // chattemplatetest.ModelDir's name; "" for the toy template
	kwargs string // chat_template_kwargs
}

var templateCases = []templateCase{
	{name: "qwen2_5", model: "qwen2_5"},
	{name: "qwen3 thinking on", model: "qwen3"},
	{name: "qwen3 thinking off", model: "qwen3", kwargs: `{"enable_thinking":false}`},
	{name: "llama3", model: "llama3"},
	{name: "toy (mock-model)"},
}

// startTemplateMock starts a mock serving vLLM's token-in endpoints with
// c's template and tokenizer and returns its /v1 base URL.
func startTemplateMock(t *testing.T, c templateCase) string {
	t.Helper()
	addr := freeAddr(t)
	args := []string{"mock", "--listen", addr, "--enable-scale-out", "--end-of-turn"}
	if c.model != "" {
		args = append(args, "--model-dir", chattemplatetest.ModelDir(t, c.model))
	}
	start(t, addr, "/health", args...)
	return "http://" + addr + "/v1"
}

// templateAgents runs tokenInAgentsWith's agents (one per city) over a
// mock with c's template, through a --token-in and a passthrough gateway.
func templateAgents(t *testing.T, c templateCase, cities []string, maxTokens int, stream func(turn int) bool) (tokenInGateways, tokenInCounts) {
	t.Helper()
	return tokenInAgentsWith(t, startTemplateMock(t, c), "vllm", cities, tiAgentOpts{Model: "mock-model", MaxTokens: maxTokens, Kwargs: c.kwargs, Stream: stream})
}

// turnKinds counts the later calls' turn_kind (tokenize.CompareTurn's
// classification) in a store's rows, and how many are not "prefix".
func turnKinds(t *testing.T, rows []export.Call) (kinds map[string]int, breaks int) {
	t.Helper()
	kinds = map[string]int{}
	for _, r := range rows {
		if r.TurnKind == "" || r.TurnKind == "first" {
			continue
		}
		kinds[r.TurnKind]++
		if r.TurnKind != "prefix" {
			breaks++
		}
	}
	return kinds, breaks
}

func formatCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// TestTokenInTemplatesMock is issue 31 item 2 on the mock with the real
// Qwen2.5, Qwen3 (thinking on and off) and Llama-3 templates and tokenizers
// (rollgate mock --model-dir) and the toy one: the tool-using agents of
// tiAgentWith (a forced tool call, the tool's result, text, another tool
// call; turns 0, 1 and 3 streamed, 2 whole) through a --token-in gateway
// and a passthrough one. With --token-in every later call extends the
// previous one ("extended", its prompt ids starting with the previous
// prompt + response ids: tokenInAgentsWith) and the bridge's
// --mode trajectories merges every one of them (tokenInMerges);
// passthrough's break rate and turn kinds are logged beside, as a markdown
// table.
func TestTokenInTemplatesMock(t *testing.T) {
	var table strings.Builder
	table.WriteString("| template | later calls | token-in extended | token-in merged | passthrough merged | passthrough breaks (turn_kind) |\n|---|---:|---:|---:|---:|---|\n")
	for _, c := range templateCases {
		t.Run(c.name, func(t *testing.T) {
			g, n := templateAgents(t, c, []string{"Paris", "Tokyo", "Lima"}, 96, func(turn int) bool { return turn != 2 })
			if n.extended != n.later || n.later == 0 {
				t.Errorf("%s: %d of %d later calls extended, want all", c.name, n.extended, n.later)
			}
			tokenInMerges(t, c.name, g, n)
			_, tiMerged, _ := bridgeMerged(t, g.tiDB)
			_, ptMerged, _ := bridgeMerged(t, g.ptDB)
			if tiMerged != n.later {
				t.Errorf("%s: the bridge merged %d of the %d later token-in calls, want all", c.name, tiMerged, n.later)
			}
			rows, err := g.ptStore.Calls(t.Context(), export.CallFilter{})
			if err != nil {
				t.Fatal(err)
			}
			kinds, breaks := turnKinds(t, rows)
			// The answers the agents acted on: tool calls (hermes for Qwen
			// and the toy, llama3_json for Llama 3) and, for Qwen3 with
			// thinking, reasoning, on both gateways.
			tiRowsAll, err := g.tiStore.Calls(t.Context(), export.CallFilter{})
			if err != nil {
				t.Fatal(err)
			}
			for gw, rs := range map[string][]export.Call{"token-in": tiRowsAll, "passthrough": rows} {
				calls, reasoning := 0, 0
				for _, r := range rs {
					m := gjson.Parse(r.ResponseMessage)
					calls += len(m.Get("tool_calls").Array())
					if m.Get("reasoning").String() != "" {
						reasoning++
					}
				}
				wantReasoning := c.model == "qwen3" && c.kwargs == ""
				if calls < 2*3 || (reasoning == len(rs)) != wantReasoning || (reasoning > 0) != wantReasoning {
					t.Errorf("%s, %s: %d tool calls and %d of %d answers with reasoning; want 2 tool calls per agent and reasoning in every answer exactly when Qwen3 thinks", c.name, gw, calls, reasoning, len(rs))
				}
			}
			fmt.Fprintf(&table, "| %s | %d | %d | %d (100 %%) | %d | %d of %d (%.0f %%): %s |\n", c.name, n.later, n.extended, tiMerged,
				ptMerged, breaks, n.ptLater, 100*float64(breaks)/float64(max(n.ptLater, 1)), formatCounts(kinds))
		})
	}
	t.Logf("merge table (mock, real templates; 3 agents x 4 turns each, turns 0, 1, 3 streamed):\n%s", table.String())
}

// TestTokenInCutAnswersMock is the whole:not_ended join (tokenin.JoinCut)
// on the mock with each template: agents whose every answer is cut by
// max_tokens. A cut answer is extended with the closing the template
// renders after it when the history with the answer re-renders to exactly
// the previous prompt + the sampled ids; otherwise the call is rendered
// whole ("whole:not_ended"). Qwen3 with thinking cuts inside the think
// block: the agent sends it back as reasoning, which the template renders
// as the sampled text followed by "\n</think>\n\n<|im_end|>", the closing:
// exact. A streamed cut tool call reaches the agent as nothing (the parser
// holds the unfinished call back), so its history lacks the sampled text:
// not exact, rendered whole. Every other later call is extended, its prompt the
// previous prompt + the sampled ids + the closing (tokenInAgentsWith), and
// the bridge merges it (tokenInMerges).
func TestTokenInCutAnswersMock(t *testing.T) {
	var table strings.Builder
	table.WriteString("| template | later calls after a cut answer | token_in | merged by the bridge |\n|---|---:|---|---:|\n")
	for _, c := range templateCases {
		t.Run(c.name, func(t *testing.T) {
			g, n := templateAgents(t, c, []string{"Paris", "Tokyo"}, 6, func(turn int) bool { return turn%2 == 1 })
			rows, err := g.tiStore.Calls(t.Context(), export.CallFilter{})
			if err != nil {
				t.Fatal(err)
			}
			slices.SortFunc(rows, func(a, b export.Call) int {
				return cmp.Or(cmp.Compare(a.RolloutID, b.RolloutID), cmp.Compare(a.SequenceID, b.SequenceID))
			})
			outcomes := map[string]int{}
			for k, r := range rows {
				if r.TokenIn == "first" {
					continue
				}
				outcomes[r.TokenIn]++
				prev := rows[k-1]
				if prev.FinishReason != "length" {
					t.Errorf("%s: an answer of 6 tokens at most finished %s: the test cuts every answer", c.name, prev.FinishReason)
				}
				// A streamed cut tool call reaches the client as nothing
				// (the parser holds the unfinished call back): the history
				// the agent sends lacks the sampled text, and the call is
				// rightly rendered whole.
				m := gjson.Parse(prev.ResponseMessage)
				lost := prev.Stream && m.Get("content").String() == "" && m.Get("reasoning").String() == "" && !m.Get("tool_calls.0").Exists()
				want := "extended"
				if lost {
					want = "whole:not_ended"
				}
				if r.TokenIn != want {
					t.Errorf("%s %s call %d (previous answer streamed %v, message %s): token_in %q, want %q", c.name, r.RolloutID, r.SequenceID, prev.Stream, prev.ResponseMessage, r.TokenIn, want)
				}
			}
			if outcomes["extended"] == 0 {
				t.Errorf("%s: no call extended after a cut answer: %v", c.name, outcomes)
			}
			if n.extended > 0 {
				tokenInMerges(t, c.name+", cut answers", g, n)
			}
			_, merged, _ := bridgeMerged(t, g.tiDB)
			fmt.Fprintf(&table, "| %s | %d | %s | %d |\n", c.name, n.later, formatCounts(outcomes), merged)
		})
	}
	t.Logf("answers cut by max_tokens (6), --token-in:\n%s", table.String())
}
