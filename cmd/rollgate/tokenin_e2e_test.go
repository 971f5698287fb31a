package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// tiMessage is the part of a chat message the token-in agents send back.
type tiMessage struct {
	Role       string       `json:"role"`
	Content    any          `json:"content"`
	Reasoning  *string      `json:"reasoning,omitempty"` // sent back as received (Qwen3's thinking)
	ToolCalls  []tiToolCall `json:"tool_calls,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
}

type tiToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// tiTurn is one answer an agent got: what it would act on.
type tiTurn struct {
	content string
	calls   []string // name(arguments) of each tool call
	finish  string
}

// tiAgent runs one tool-using conversation against base (an attempt's
// /v1): the user asks for a city's weather, a forced tool call, the tool's
// answer, then two turns of text, each call carrying the whole history
// with the answers as returned. maxTokens bounds each answer.
func tiAgent(t *testing.T, base, model, city string, maxTokens int) []tiTurn {
	t.Helper()
	return tiAgentStreaming(t, base, model, city, maxTokens, nil)
}

// tiAgentStreaming is tiAgent with the turns for which stream(turn) is true
// streamed (stream_options.include_usage; the answer is assembled from the
// chunks as an SDK does, tiReadStream). stream nil: none.
func tiAgentStreaming(t *testing.T, base, model, city string, maxTokens int, stream func(turn int) bool) []tiTurn {
	t.Helper()
	return tiAgentWith(t, base, city, tiAgentOpts{Model: model, MaxTokens: maxTokens, Stream: stream})
}

// tiAgentOpts configures tiAgentWith's agent.
type tiAgentOpts struct {
	Model     string
	MaxTokens int
	// Stream says which turns are streamed (nil: none).
	Stream func(turn int) bool
	// Kwargs is the chat_template_kwargs JSON object sent on every call
	// (e.g. {"enable_thinking":false}); "" sends none.
	Kwargs string
}

// tiAgentWith is the tool-using agent of tiAgent (four turns: a forced tool
// call, the tool's result, text, another turn) configured by o; it sends
// back every assistant message as it received it (content, tool calls,
// reasoning). Reusable against any engine (the mock, a real vLLM).
func tiAgentWith(t *testing.T, base, city string, o tiAgentOpts) []tiTurn {
	t.Helper()
	model, maxTokens, stream := o.Model, o.MaxTokens, o.Stream
	msgs := []tiMessage{{Role: "user", Content: "What is the weather in " + city + "?"}}
	var turns []tiTurn
	for turn := range 4 {
		choice := `"auto"`
		if turn == 0 {
			choice = `"required"`
		}
		mj, _ := json.Marshal(msgs)
		streamed := stream != nil && stream(turn)
		extra := ""
		if o.Kwargs != "" {
			extra = `,"chat_template_kwargs":` + o.Kwargs
		}
		if streamed {
			extra += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		body := fmt.Sprintf(`{"model":%q,"messages":%s,"tools":%s,"tool_choice":%s,"max_tokens":%d,"temperature":0%s}`, model, mj, realTools, choice, maxTokens, extra)
		status, b, _ := postReal(t, base+"/chat/completions", body)
		if status != 200 {
			t.Fatalf("turn %d: %d %s\n%s", turn, status, b, body)
		}
		var ans struct {
			Choices []struct {
				Message      tiMessage `json:"message"`
				FinishReason string    `json:"finish_reason"`
			} `json:"choices"`
		}
		if streamed {
			m, finish := tiReadStream(t, b)
			ans.Choices = append(ans.Choices, struct {
				Message      tiMessage `json:"message"`
				FinishReason string    `json:"finish_reason"`
			}{m, finish})
		} else if err := json.Unmarshal(b, &ans); err != nil || len(ans.Choices) != 1 {
			t.Fatalf("turn %d: %v %s", turn, err, b)
		}
		var tt tiTurn
		msgs, tt = tiAnswered(msgs, ans.Choices[0].Message, ans.Choices[0].FinishReason)
		turns = append(turns, tt)
	}
	return turns
}

// tiAnswered is what an agent does with an answer m (finish reason finish):
// the turn it acts on, and the history with the answer appended as returned,
// then a tool result for each tool call, or a new user message when there
// is none.
func tiAnswered(msgs []tiMessage, m tiMessage, finish string) ([]tiMessage, tiTurn) {
	tt := tiTurn{finish: finish}
	tt.content, _ = m.Content.(string)
	for _, c := range m.ToolCalls {
		tt.calls = append(tt.calls, c.Function.Name+"("+c.Function.Arguments+")")
	}
	msgs = append(msgs, tiMessage{Role: "assistant", Content: m.Content, Reasoning: m.Reasoning, ToolCalls: m.ToolCalls})
	for _, c := range m.ToolCalls {
		msgs = append(msgs, tiMessage{Role: "tool", ToolCallID: c.ID, Content: "Sunny, 21 C"})
	}
	if len(m.ToolCalls) == 0 {
		msgs = append(msgs, tiMessage{Role: "user", Content: "Thanks. And tomorrow?"})
	}
	return msgs, tt
}

// tiRows waits for an attempt's n rows and returns them by sequence id.
func tiRows(t *testing.T, store export.Store, rollout, attempt string, n int, logs fmt.Stringer) []export.Call {
	t.Helper()
	var rows []export.Call
	testenv.WaitFor(t, time.Minute, func() string {
		return fmt.Sprintf("%d rows of %s/%s, want %d\n%s", len(rows), rollout, attempt, n, logs)
	}, func() bool {
		var err error
		rows, err = store.Calls(context.Background(), export.CallFilter{RolloutID: rollout, AttemptID: attempt})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) >= n
	})
	slices.SortFunc(rows, func(a, b export.Call) int { return int(a.SequenceID) - int(b.SequenceID) })
	return rows
}

// tokenInAgents runs the agents of cities through two gateways on one
// engine, one with --token-in and one without, and checks: every call of
// the token-in gateway is served token-in (its token_in column is not
// empty or passthrough); every extending call's prompt ids start with the
// previous prompt + response ids, and every call whose previous answer
// ended on the end-of-turn token extends; the first call of each
// conversation (the same prompt both ways) gets the same answer both
// ways; any later call whose prompt ids are the same both ways gets the
// same answer. It logs the passthrough break rate (turn_kind) beside.
func tokenInAgents(t *testing.T, upstream, kind, model string, cities []string, maxTokens int, stream func(turn int) bool) (tokenInGateways, tokenInCounts) {
	return tokenInAgentsWith(t, upstream, kind, cities, tiAgentOpts{Model: model, MaxTokens: maxTokens, Stream: stream})
}

// tokenInAgentsWith is tokenInAgents with the agents configured by o.
func tokenInAgentsWith(t *testing.T, upstream, kind string, cities []string, o tiAgentOpts) (tokenInGateways, tokenInCounts) {
	g := startTokenInGateways(t, upstream, kind)
	tiAddr, ptAddr, tiStore, ptStore, tiLogs, ptLogs := g.tiAddr, g.ptAddr, g.tiStore, g.ptStore, g.tiLogs, g.ptLogs

	var extended, later, ptBreaks, ptLater, same, comparable int
	for i, city := range cities {
		rollout := fmt.Sprintf("ti-%d", i)
		tiTurns := tiAgentWith(t, "http://"+tiAddr+"/rollout/"+rollout+"/attempt/a1/v1", city, o)
		ptTurns := tiAgentWith(t, "http://"+ptAddr+"/rollout/"+rollout+"/attempt/a1/v1", city, o)
		tiR := tiRows(t, tiStore, rollout, "a1", len(tiTurns), tiLogs)
		ptR := tiRows(t, ptStore, rollout, "a1", len(ptTurns), ptLogs)
		for k, r := range tiR {
			if r.TokenIn == "" || strings.HasPrefix(r.TokenIn, "passthrough:") {
				t.Errorf("%s call %d: token_in %q, want a token-in call\n%s", city, k, r.TokenIn, tiLogs)
			}
			if k == 0 {
				if r.TokenIn != "first" {
					t.Errorf("%s call 0: token_in %q, want first", city, r.TokenIn)
				}
				continue
			}
			later++
			prev := tiR[k-1]
			want := slices.Concat(prev.PromptTokenIDs, prev.ResponseTokenIDs)
			ended := prev.FinishReason == "stop" || prev.FinishReason == "tool_calls"
			switch {
			case r.TokenIn == "extended":
				extended++
				if !slices.Equal(r.PromptTokenIDs[:min(len(want), len(r.PromptTokenIDs))], want) || len(r.PromptTokenIDs) <= len(want) {
					t.Errorf("%s call %d: extended, but its %d prompt ids do not start with the previous %d prompt + %d response ids", city, k, len(r.PromptTokenIDs), len(prev.PromptTokenIDs), len(prev.ResponseTokenIDs))
				}
				if r.TurnKind != "prefix" {
					t.Errorf("%s call %d: extended, but capture's turn check says %q", city, k, r.TurnKind)
				}
			case ended:
				t.Errorf("%s call %d: the previous answer ended (%s) and the agent extends the history, but token_in is %q", city, k, prev.FinishReason, r.TokenIn)
			case r.TokenIn != "whole:not_ended":
				t.Errorf("%s call %d: the previous answer did not end (%s), token_in %q, want whole:not_ended", city, k, prev.FinishReason, r.TokenIn)
			}
		}
		for k := 1; k < len(ptR); k++ {
			ptLater++
			if ptR[k].TurnKind != "prefix" {
				ptBreaks++
			}
		}
		// The same prompt gets the same answer.
		for k := range min(len(tiR), len(ptR)) {
			if !slices.Equal(tiR[k].PromptTokenIDs, ptR[k].PromptTokenIDs) {
				if k == 0 {
					t.Errorf("%s: the first call's prompt ids differ: token-in %v, passthrough %v", city, tiR[k].PromptTokenIDs, ptR[k].PromptTokenIDs)
				}
				continue
			}
			comparable++
			a, b := tiTurns[k], ptTurns[k]
			if a.content != b.content || !slices.Equal(a.calls, b.calls) || a.finish != b.finish {
				t.Errorf("%s call %d, same prompt ids: token-in answered %+v, passthrough %+v", city, k, a, b)
				continue
			}
			if !slices.Equal(tiR[k].ResponseTokenIDs, ptR[k].ResponseTokenIDs) {
				t.Errorf("%s call %d, same prompt ids and answer, but other response ids", city, k)
			}
			if !slices.Equal(tiR[k].ResponseLogprobs, ptR[k].ResponseLogprobs) || len(tiR[k].ResponseLogprobs) != len(tiR[k].ResponseTokenIDs) {
				t.Errorf("%s call %d, same prompt ids and answer: token-in logprobs %v, passthrough %v (%d ids)", city, k, tiR[k].ResponseLogprobs, ptR[k].ResponseLogprobs, len(tiR[k].ResponseTokenIDs))
			}
			if tiR[k].Stream != ptR[k].Stream {
				t.Errorf("%s call %d: stream %v on token-in, %v on passthrough", city, k, tiR[k].Stream, ptR[k].Stream)
			}
			same++
		}
	}
	if extended == 0 {
		t.Errorf("no call was extended (%d later calls)", later)
	}
	t.Logf("token-in: %d of %d later calls extended (the others followed an answer cut by max_tokens); passthrough: %d of %d later calls broke the prefix (turn_kind != prefix); %d of %d calls with the same prompt ids both ways, all with the same answer",
		extended, later, ptBreaks, ptLater, same, comparable)
	return g, tokenInCounts{extended: extended, later: later, ptBreaks: ptBreaks, ptLater: ptLater}
}

// tokenInCounts is what tokenInAgents saw: the token-in gateway's later
// calls and those extended, the passthrough gateway's later calls and those
// whose prompt broke the previous prompt + response ids.
type tokenInCounts struct {
	extended, later, ptBreaks, ptLater int
}

// TestTokenInRealVLLM runs tool-using agents through --token-in and
// passthrough gateways on one real vLLM (testenv.StartVLLM: SmolLM2 with
// the hermes tool parser, --enable-scale-out), greedy decoding.
func TestTokenInRealVLLM(t *testing.T) {
	v, err := testenv.StartVLLM()
	if err != nil {
		t.Fatalf("TestTokenInRealVLLM needs a real vLLM (set %s, or let testenv.StartVLLM start one): %v", testenv.EnvVLLMURL, err)
	}
	t.Cleanup(v.Stop)
	g, n := tokenInAgents(t, v.URL, "vllm", testenv.VLLMModel, []string{"Paris", "Tokyo", "Lima"}, 48, nil)
	tokenInMerges(t, "real vLLM 0.32 (SmolLM2, hermes), whole answers", g, n)
}

// TestTokenInRefusedForOtherKinds: --token-in with a replica of a kind that
// has no token-in endpoints stops serve at start, naming the kind.
func TestTokenInRefusedForOtherKinds(t *testing.T) {
	for _, kind := range []string{"sglang", "llamacpp", "openai"} {
		addr := freeAddr(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a serve that starts is killed: the test fails
		out, err := exec.CommandContext(ctx, binary, "serve", "--listen", addr, "--db", filepath.Join(t.TempDir(), "db"),
			"--upstream", "http://127.0.0.1:1/v1", "--upstream-kind", kind, "--token-in").CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), `kind "`+kind+`" has no token-in endpoints`) {
			t.Errorf("--token-in with kind %s: err %v, output %s", kind, err, out)
		}
	}
}

// tokenInGateways are a --token-in gateway and a passthrough one in front
// of the same upstream, each with its own embedded store.
type tokenInGateways struct {
	tiAddr, ptAddr   string
	tiDB, ptDB       string // their SQLite files
	tiStore, ptStore *sqlite.Store
	tiLogs, ptLogs   *syncBuffer
}

// startTokenInGateways starts both gateways on upstream (of kind) and opens
// their stores.
func startTokenInGateways(t *testing.T, upstream, kind string) tokenInGateways {
	t.Helper()
	dir := t.TempDir()
	g := tokenInGateways{tiAddr: freeAddr(t), ptAddr: freeAddr(t)}
	tiDB, ptDB := filepath.Join(dir, "ti.db"), filepath.Join(dir, "pt.db")
	g.tiDB, g.ptDB = tiDB, ptDB
	_, g.tiLogs = start(t, g.tiAddr, "/readyz", "serve", "--listen", g.tiAddr, "--db", tiDB, "--upstream", upstream, "--upstream-kind", kind, "--token-in")
	_, g.ptLogs = start(t, g.ptAddr, "/readyz", "serve", "--listen", g.ptAddr, "--db", ptDB, "--upstream", upstream, "--upstream-kind", kind)
	for _, s := range []struct {
		db string
		to **sqlite.Store
	}{{tiDB, &g.tiStore}, {ptDB, &g.ptStore}} {
		st, err := sqlite.Open(s.db)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		*s.to = st
	}
	return g
}
