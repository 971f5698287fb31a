package main

import (
	"fmt"
	"slices"
	"testing"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
)

// TestTokenInMock runs tool-using agents (a forced tool call, the tool's
// result, text turns, another tool call) through a --token-in gateway and a
// passthrough gateway on one mock engine serving vLLM's token-in endpoints
// (rollgate mock --enable-scale-out --end-of-turn), and checks:
//   - every call of an attempt after the first is "extended", its prompt
//     ids starting with the previous prompt + response ids (and capture's
//     turn check agrees); after an answer cut by max_tokens the template's
//     closing (<|im_end|>) follows them (tokenin.JoinCut);
//   - token-in and passthrough give the same answers (content, tool calls,
//     finish reason) and response ids on every turn: the mock samples from
//     the prompt's text, the same both ways;
//   - an edited history is rendered whole ("whole:edited"); a history the
//     template cannot render (an unknown role) and messages that are not
//     objects go the ordinary way with the reason ("passthrough:render",
//     "passthrough:bad_messages");
//   - rollgate_token_in_calls_total counts each outcome as the rows say.
func TestTokenInMock(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr, "--enable-scale-out", "--end-of-turn")
	upstream := "http://" + mockAddr + "/v1"
	g := startTokenInGateways(t, upstream, "vllm")
	tiAddr, ptAddr, tiStore, ptStore, tiLogs, ptLogs := g.tiAddr, g.ptAddr, g.tiStore, g.ptStore, g.tiLogs, g.ptLogs

	want := map[string]int{}
	var toolCalls, ptBreaks, ptLater, samePrompt, cut, later int
	cities := []string{"Paris", "Tokyo", "Lima", "Oslo"}
	for i, city := range cities {
		maxTokens := 48
		if i == len(cities)-1 {
			maxTokens = 8 // every answer is cut: the next call extends it with the template's closing
		}
		rollout := fmt.Sprintf("tim-%d", i)
		tiTurns := tiAgent(t, "http://"+tiAddr+"/rollout/"+rollout+"/attempt/a1/v1", "mock-model", city, maxTokens)
		ptTurns := tiAgent(t, "http://"+ptAddr+"/rollout/"+rollout+"/attempt/a1/v1", "mock-model", city, maxTokens)
		tiR := tiRows(t, tiStore, rollout, "a1", len(tiTurns), tiLogs)
		ptR := tiRows(t, ptStore, rollout, "a1", len(ptTurns), ptLogs)
		for k := range tiTurns {
			// Same prompt ids, same answer. After a tool call the prompts
			// differ: the client sends back the arguments as vLLM's hermes
			// parser re-wrote them (json.dumps), which passthrough's
			// template renders as new text, token-in never.
			if !slices.Equal(tiR[k].PromptTokenIDs, ptR[k].PromptTokenIDs) {
				if k == 0 {
					t.Errorf("%s call 0: token-in and passthrough prompts differ:\n%v\n%v", city, tiR[k].PromptTokenIDs, ptR[k].PromptTokenIDs)
				}
				continue
			}
			samePrompt++
			a, b := tiTurns[k], ptTurns[k]
			if a.content != b.content || !slices.Equal(a.calls, b.calls) || a.finish != b.finish {
				t.Errorf("%s call %d: token-in answered %+v, passthrough %+v", city, k, a, b)
			}
			if !slices.Equal(tiR[k].ResponseTokenIDs, ptR[k].ResponseTokenIDs) {
				t.Errorf("%s call %d: response ids differ: token-in %v, passthrough %v", city, k, tiR[k].ResponseTokenIDs, ptR[k].ResponseTokenIDs)
			}
		}
		for _, a := range tiTurns {
			toolCalls += len(a.calls)
		}
		for k := 1; k < len(ptR); k++ {
			ptLater++
			if ptR[k].TurnKind != "prefix" {
				ptBreaks++
			}
		}
		for k, r := range tiR {
			want[r.TokenIn]++
			if k == 0 {
				if r.TokenIn != "first" {
					t.Errorf("%s call 0: token_in %q, want first", city, r.TokenIn)
				}
				continue
			}
			later++
			prev := tiR[k-1]
			ended := prev.FinishReason == "stop" || prev.FinishReason == "tool_calls"
			if r.TokenIn != "extended" {
				t.Errorf("%s call %d: the previous answer finished %s, token_in %q, want extended\n%s", city, k, prev.FinishReason, r.TokenIn, tiLogs)
				continue
			}
			head := slices.Concat(prev.PromptTokenIDs, prev.ResponseTokenIDs)
			if len(r.PromptTokenIDs) <= len(head) || !slices.Equal(r.PromptTokenIDs[:len(head)], head) {
				t.Errorf("%s call %d: extended, but its %d prompt ids do not start with the previous %d prompt + %d response ids", city, k, len(r.PromptTokenIDs), len(prev.PromptTokenIDs), len(prev.ResponseTokenIDs))
			} else if !ended && r.PromptTokenIDs[len(head)] != mock.TokenIMEnd {
				// A cut answer: the template's closing follows the sampled ids.
				t.Errorf("%s call %d: the previous answer was cut (%s), but the id after it is %d, want the template's closing <|im_end|> (%d)", city, k, prev.FinishReason, r.PromptTokenIDs[len(head)], mock.TokenIMEnd)
			}
			if !ended {
				cut++
			}
			if r.TurnKind != "prefix" {
				t.Errorf("%s call %d: extended, but capture's turn check says %q", city, k, r.TurnKind)
			}
		}
	}
	// Every later call is extended, also after the last agent's answers cut
	// by max_tokens (before JoinCut they were rendered whole: "whole:not_ended").
	if want["extended"] != later || cut < 3 || toolCalls < 2*(len(cities)-1) {
		t.Errorf("outcomes %v, %d after a cut answer, with %d tool calls: want every later call extended (the last agent's after cut answers) and tool calls", want, cut, toolCalls)
	}
	if samePrompt < len(cities) {
		t.Errorf("%d calls had the same prompt ids both ways, want at least every first call (%d)", samePrompt, len(cities))
	}
	t.Logf("token-in: outcomes %v; passthrough: %d of %d later calls broke the prefix (turn_kind != prefix); %d calls compared on equal prompts", want, ptBreaks, ptLater, samePrompt)

	// An edited history, a role the template cannot render, messages that
	// are not objects.
	chat := func(attempt, messages string) (int, []byte) {
		status, b, _ := postReal(t, "http://"+tiAddr+"/rollout/edits/attempt/"+attempt+"/v1/chat/completions",
			`{"model":"mock-model","messages":`+messages+`,"max_tokens":48}`)
		return status, b
	}
	status, b := chat("edit", `[{"role":"user","content":"Hi"}]`)
	if status != 200 {
		t.Fatalf("edit call 0: %d %s", status, b)
	}
	answer := gjson.GetBytes(b, "choices.0.message.content").Raw
	if status, b = chat("edit", `[{"role":"user","content":"Hi, edited"},{"role":"assistant","content":`+answer+`},{"role":"user","content":"More"}]`); status != 200 {
		t.Fatalf("edit call 1: %d %s", status, b)
	}
	if status, b = chat("hostile", `[{"role":"user","content":"Hi"},{"role":"wizard","content":"abracadabra"}]`); status != 200 {
		t.Fatalf("unknown role through passthrough: %d %s", status, b)
	}
	chat("bad", `[1,2]`) // the engine's 400 reaches the client; counted below
	rows := tiRows(t, tiStore, "edits", "edit", 2, tiLogs)
	if rows[0].TokenIn != "first" || rows[1].TokenIn != "whole:edited" {
		t.Errorf("edited history: token_in %q then %q, want first then whole:edited", rows[0].TokenIn, rows[1].TokenIn)
	}
	if r := tiRows(t, tiStore, "edits", "hostile", 1, tiLogs); r[0].TokenIn != "passthrough:render" {
		t.Errorf("unknown role: token_in %q, want passthrough:render", r[0].TokenIn)
	}
	want["first"]++
	want["whole:edited"]++
	want["passthrough:render"]++
	want["passthrough:bad_messages"]++
	for outcome, n := range want {
		if got := metricSum(t, tiAddr, `rollgate_token_in_calls_total{outcome="`+outcome+`"}`); got != float64(n) {
			t.Errorf("rollgate_token_in_calls_total{outcome=%q} = %v, want %d", outcome, got, n)
		}
	}
	if got := metricSum(t, ptAddr, "rollgate_token_in_calls_total"); got != 0 {
		t.Errorf("the passthrough gateway counted %v token-in calls", got)
	}
}
