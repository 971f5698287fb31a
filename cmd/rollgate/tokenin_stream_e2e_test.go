package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/bench/mock"
	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/gateway/tokenin"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// tiReadStream assembles a streamed chat answer of one choice as an SDK
// does; see tiReadChoices.
func tiReadStream(t *testing.T, b []byte) (tiMessage, string) {
	t.Helper()
	msgs, finish := tiReadChoices(t, b, 1)
	return msgs[0], finish[0]
}

// tiReadChoices assembles the n choices of a streamed chat answer as an SDK
// does (content joined, tool calls by index: id and name from their first
// delta, arguments joined) and checks the stream's frame: each choice's
// role chunk before its other chunks, one finish reason per choice, a usage
// chunk (include_usage) and data: [DONE] last.
func tiReadChoices(t *testing.T, b []byte, n int) ([]tiMessage, []string) {
	t.Helper()
	var (
		msgs    = make([]tiMessage, n)
		content = make([]strings.Builder, n)
		finish  = make([]string, n)
		role    = make([]bool, n)
		nonNull = make([]bool, n)
		usage   bool
		done    bool
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if done {
			t.Fatalf("an event after [DONE]: %s\n%s", data, b)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ch struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Role      string  `json:"role"`
					Content   *string `json:"content"`
					Reasoning *string `json:"reasoning"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		if ch.Error != nil {
			t.Fatalf("error event %s", data)
		}
		if ch.Usage != nil && len(ch.Choices) == 0 {
			usage = true
		}
		for _, c := range ch.Choices {
			if c.Index < 0 || c.Index >= n {
				t.Fatalf("a chunk of choice %d (n = %d): %s", c.Index, n, data)
			}
			i, m := c.Index, &msgs[c.Index]
			if c.Delta.Role == "assistant" {
				role[i] = true
			} else if !role[i] {
				t.Fatalf("a chunk before the role chunk: %s", data)
			}
			if c.Delta.Content != nil {
				content[i].WriteString(*c.Delta.Content)
				nonNull[i] = nonNull[i] || *c.Delta.Content != ""
			}
			if c.Delta.Reasoning != nil && *c.Delta.Reasoning != "" {
				r := *c.Delta.Reasoning
				if m.Reasoning != nil {
					r = *m.Reasoning + r
				}
				m.Reasoning = &r
			}
			for _, tc := range c.Delta.ToolCalls {
				for len(m.ToolCalls) <= tc.Index {
					m.ToolCalls = append(m.ToolCalls, tiToolCall{Type: "function"})
				}
				call := &m.ToolCalls[tc.Index]
				if tc.ID != "" {
					call.ID = tc.ID
				}
				call.Function.Name += tc.Function.Name
				call.Function.Arguments += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				if finish[i] != "" {
					t.Fatalf("two finish reasons (%s, %s)\n%s", finish[i], *c.FinishReason, b)
				}
				finish[i] = *c.FinishReason
			}
		}
	}
	for i := range msgs {
		if !done || !usage || finish[i] == "" {
			t.Fatalf("stream incomplete: [DONE] %v, usage chunk %v, choice %d's finish reason %q\n%s", done, usage, i, finish[i], b)
		}
		msgs[i].Role = "assistant"
		if nonNull[i] || len(msgs[i].ToolCalls) == 0 {
			msgs[i].Content = content[i].String()
		}
	}
	return msgs, finish
}

// TestTokenInStreamMock runs tool-using agents whose turns are streamed
// (turns 0, 1 and 3; turn 2 a whole answer, so an attempt goes stream →
// stream → whole → stream) through a --token-in gateway and a passthrough
// gateway on one mock engine serving vLLM 0.32's streamed generate and
// derender (rollgate mock --enable-scale-out --end-of-turn). tokenInAgents
// checks: every call is served token-in ("first", "extended" after an
// answer that ended on its end-of-turn token, "whole:not_ended" after a cut
// one), every extended prompt starts with the previous prompt + response
// ids (capture's turn check agrees), and on equal prompt ids token-in and
// passthrough give the same content, tool calls, finish reason, response
// ids and logprobs, streamed alike.
func TestTokenInStreamMock(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr, "--enable-scale-out", "--end-of-turn")
	_, _ = tokenInAgents(t, "http://"+mockAddr+"/v1", "vllm", "mock-model", []string{"Paris", "Tokyo", "Lima", "Oslo"}, 48,
		func(turn int) bool { return turn != 2 })
}

// TestTokenInStreamRealVLLM is TestTokenInStreamMock's agents, every turn
// streamed, against the real vLLM (SmolLM2, hermes tool parser) started
// with --enable-scale-out.
func TestTokenInStreamRealVLLM(t *testing.T) {
	v, err := testenv.StartVLLM()
	if err != nil {
		t.Fatalf("TestTokenInStreamRealVLLM needs a real vLLM (set %s, or let testenv.StartVLLM start one): %v", testenv.EnvVLLMURL, err)
	}
	t.Cleanup(v.Stop)
	g, n := tokenInAgents(t, v.URL, "vllm", testenv.VLLMModel, []string{"Paris", "Tokyo", "Lima"}, 48, func(int) bool { return true })
	tokenInMerges(t, "real vLLM 0.32 (SmolLM2, hermes), streamed", g, n)
}

// TestTokenInHangUp: a client that hangs up on a token-in call aborts the
// engine's generation, streamed (the generate stream's connection closes)
// or not (the hang-up watch closes the generate request's connection), and
// the row says so.
func TestTokenInHangUp(t *testing.T) {
	ms, mockURL, err := mock.Start(mock.Config{ScaleOut: true, EndOfTurn: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	addr, dir := freeAddr(t), t.TempDir()
	db := filepath.Join(dir, "ti.db")
	_, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db, "--upstream", mockURL, "--upstream-kind", "vllm", "--token-in")
	store, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	post := func(client *http.Client, attempt, knob, extra string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/rollout/hang/attempt/"+attempt+"/v1/chat/completions",
			strings.NewReader(`{"model":"mock-model","messages":[{"role":"user","content":"Tell me a long story"}],"max_tokens":400`+extra+`}`))
		req.Header.Set("Content-Type", "application/json")
		k, v, _ := strings.Cut(knob, ": ")
		req.Header.Set(k, v)
		return client.Do(req)
	}

	// Streamed: 400 tokens 100 ms apart (40 s); the client leaves after the
	// first content chunk.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := post(client, "stream", "x-mock-itl-ms: 100", `,"stream":true`)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for chunks := 0; chunks < 2; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v\n%s", err, logs)
		}
		if strings.HasPrefix(line, "data: ") {
			chunks++ // the role chunk, then the first token
		}
	}
	if ms.ActiveStreams() != 1 {
		t.Fatalf("the mock has %d streams open, want the generate stream", ms.ActiveStreams())
	}
	resp.Body.Close()
	testenv.WaitFor(t, 10*time.Second, func() string {
		return fmt.Sprintf("the engine's generate stream still runs (%d open) 10 s after the client left\n%s", ms.ActiveStreams(), logs)
	}, func() bool { return ms.ActiveStreams() == 0 })
	rows := tiRows(t, store, "hang", "stream", 1, logs)
	if r := rows[0]; r.TokenIn != "first" || !r.Stream || r.Error != "client disconnected mid-stream" || len(r.ResponseTokenIDs) == 0 || len(r.ResponseTokenIDs) >= 400 {
		t.Errorf("streamed row: token_in %q, stream %v, error %q, %d response ids; want first, a stream, client disconnected mid-stream, some ids but not 400",
			r.TokenIn, r.Stream, r.Error, len(r.ResponseTokenIDs))
	}

	// Whole answer: the first token after 30 s; the client gives up after 0.5 s.
	before := ms.Aborted()
	_, err = post(&http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}, "whole", "x-mock-ttft-ms: 30000", "")
	if err == nil {
		t.Fatal("the call answered before the client's timeout")
	}
	testenv.WaitFor(t, 10*time.Second, func() string {
		return fmt.Sprintf("the engine's generate call was not aborted (aborted %d, %d before) 10 s after the client left\n%s", ms.Aborted(), before, logs)
	}, func() bool { return ms.Aborted() > before })
	rows = tiRows(t, store, "hang", "whole", 1, logs)
	if r := rows[0]; r.TokenIn != "first" || r.HTTPStatus != 499 {
		t.Errorf("whole-answer row: token_in %q, status %d; want first, 499", r.TokenIn, r.HTTPStatus)
	}
}

// TestTokenInChoices: with n = 2 (whole and streamed) a token-in call
// answers as passthrough does on the same prompt (each choice's content,
// tool calls, finish reason, and its row's response ids and logprobs), and
// the agent's next call, which sends back the second choice, is extended
// from that choice: its prompt ids start with the previous prompt + the
// second choice's response ids.
func TestTokenInChoices(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr, "--enable-scale-out", "--end-of-turn")
	g := startTokenInGateways(t, "http://"+mockAddr+"/v1", "vllm")
	first := `[{"role":"user","content":"What is the weather in Rome?"}]`
	ask := func(addr, attempt, messages, extra string, stream bool) ([]tiMessage, []string) {
		n := 2
		if strings.Contains(extra, `"n":1`) {
			n = 1
		}
		if stream {
			extra += `,"stream":true,"stream_options":{"include_usage":true}`
		}
		status, b, _ := postReal(t, "http://"+addr+"/rollout/choices/attempt/"+attempt+"/v1/chat/completions",
			`{"model":"mock-model","messages":`+messages+`,"tools":`+realTools+extra+`}`)
		if status != 200 {
			t.Fatalf("%s: %d %s", attempt, status, b)
		}
		if stream {
			return tiReadChoices(t, b, n)
		}
		var ans struct {
			Choices []struct {
				Message      tiMessage `json:"message"`
				FinishReason string    `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &ans); err != nil || len(ans.Choices) != n {
			t.Fatalf("%s: %v %s", attempt, err, b)
		}
		var msgs []tiMessage
		var finish []string
		for _, c := range ans.Choices {
			msgs, finish = append(msgs, c.Message), append(finish, c.FinishReason)
		}
		return msgs, finish
	}
	for _, stream := range []bool{false, true} {
		attempt := fmt.Sprintf("stream-%v", stream)
		tiMsgs, tiFinish := ask(g.tiAddr, attempt, first, `,"n":2,"tool_choice":"required","max_tokens":48`, stream)
		ptMsgs, ptFinish := ask(g.ptAddr, attempt, first, `,"n":2,"tool_choice":"required","max_tokens":48`, stream)
		tiR := tiRows(t, g.tiStore, "choices", attempt, 2, g.tiLogs)
		ptR := tiRows(t, g.ptStore, "choices", attempt, 2, g.ptLogs)
		for i := range 2 {
			a, b := tiMsgs[i], ptMsgs[i]
			if fmt.Sprint(a.Content) != fmt.Sprint(b.Content) || len(a.ToolCalls) != len(b.ToolCalls) || tiFinish[i] != ptFinish[i] {
				t.Errorf("%s choice %d: token-in %+v (%s), passthrough %+v (%s)", attempt, i, a, tiFinish[i], b, ptFinish[i])
			}
			for k := range min(len(a.ToolCalls), len(b.ToolCalls)) {
				if a.ToolCalls[k].Function != b.ToolCalls[k].Function {
					t.Errorf("%s choice %d: tool call %+v, passthrough %+v", attempt, i, a.ToolCalls[k].Function, b.ToolCalls[k].Function)
				}
			}
			ti, pt := tiR[i], ptR[i]
			if ti.ChoiceIndex != uint32(i) || pt.ChoiceIndex != uint32(i) || ti.TokenIn != "first" ||
				!slices.Equal(ti.PromptTokenIDs, pt.PromptTokenIDs) || !slices.Equal(ti.ResponseTokenIDs, pt.ResponseTokenIDs) || !slices.Equal(ti.ResponseLogprobs, pt.ResponseLogprobs) {
				t.Errorf("%s choice %d rows: token-in (choice %d, %q) %d prompt, %v response ids, %v; passthrough (choice %d) %d, %v, %v",
					attempt, i, ti.ChoiceIndex, ti.TokenIn, len(ti.PromptTokenIDs), ti.ResponseTokenIDs, ti.ResponseLogprobs, pt.ChoiceIndex, len(pt.PromptTokenIDs), pt.ResponseTokenIDs, pt.ResponseLogprobs)
			}
		}
		if slices.Equal(tiR[0].ResponseTokenIDs, tiR[1].ResponseTokenIDs) {
			t.Fatalf("%s: both choices sampled the same ids; the test needs two answers", attempt)
		}
		// The agent keeps the second choice.
		picked := tiMsgs[1]
		if len(picked.ToolCalls) == 0 || tiFinish[1] != "tool_calls" {
			t.Fatalf("%s: the second choice is no tool call (%s): %+v", attempt, tiFinish[1], picked)
		}
		next := []tiMessage{{Role: "user", Content: "What is the weather in Rome?"}, picked, {Role: "tool", ToolCallID: picked.ToolCalls[0].ID, Content: "Sunny, 21 C"}}
		mj, _ := json.Marshal(next)
		ask(g.tiAddr, attempt, string(mj), `,"n":1,"max_tokens":48`, stream)
		rows := tiRows(t, g.tiStore, "choices", attempt, 3, g.tiLogs)
		head := slices.Concat(tiR[1].PromptTokenIDs, tiR[1].ResponseTokenIDs)
		if r := rows[2]; r.TokenIn != "extended" || len(r.PromptTokenIDs) <= len(head) || !slices.Equal(r.PromptTokenIDs[:len(head)], head) {
			t.Errorf("%s: the call after the second choice: token_in %q, %d prompt ids; want extended from the previous %d prompt + %d response ids of choice 1\n%s",
				attempt, r.TokenIn, len(r.PromptTokenIDs), len(tiR[1].PromptTokenIDs), len(tiR[1].ResponseTokenIDs), g.tiLogs)
		}
	}
	// A streamed tool call cut by max_tokens finishes "length" both ways
	// (vLLM's streamed derender says "tool_calls" once a call streamed).
	tiMsgs, tiFinish := ask(g.tiAddr, "cut", first, `,"n":1,"tool_choice":"required","max_tokens":20`, true)
	ptMsgs, ptFinish := ask(g.ptAddr, "cut", first, `,"n":1,"tool_choice":"required","max_tokens":20`, true)
	if tiFinish[0] != "length" || ptFinish[0] != "length" || len(tiMsgs[0].ToolCalls) != 1 || len(ptMsgs[0].ToolCalls) != 1 || tiMsgs[0].ToolCalls[0].Function != ptMsgs[0].ToolCalls[0].Function {
		t.Errorf("a tool call cut by max_tokens: token-in %s %+v, passthrough %s %+v; want length both ways, with the call's name streamed", tiFinish[0], tiMsgs[0], ptFinish[0], ptMsgs[0])
	}
}

// bridgeMerged runs `rollgate bridge --mode trajectories` on db and returns
// its samples and how many calls its summary says it merged into an earlier
// turn's sample ("trajectories: N calls merged, breaks ...").
func bridgeMerged(t *testing.T, db string) ([]jsonlRow, int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	out := filepath.Join(t.TempDir(), "traj.jsonl")
	// --status '': the agents' rollouts are not registered (reward 0).
	if code := run([]string{"bridge", "--db", db, "--out", out, "--mode", "trajectories", "--estimator", "none", "--status", ""}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge trajectories on %s: %s", db, stderr.String())
	}
	_, line, ok := strings.Cut(stderr.String(), "trajectories: ")
	var merged int
	if !ok {
		t.Fatalf("no trajectories line in the bridge's summary:\n%s", stderr.String())
	}
	line, _, _ = strings.Cut(line, "\n")
	if _, err := fmt.Sscanf(line, "%d calls merged", &merged); err != nil {
		t.Fatalf("summary line %q: %v", line, err)
	}
	_, breaks, _ := strings.Cut(line, "breaks ")
	return readJSONL(t, out), merged, breaks
}

// tokenInMerges checks that the bridge's trajectory mode merges every call
// the token-in gateway extended into the sample of the call before it, and
// reports the merge table beside passthrough's on the same agents. It
// returns how many calls the bridge merged into an earlier turn's sample on
// each gateway.
func tokenInMerges(t *testing.T, name string, g tokenInGateways, n tokenInCounts) (tiMerged, ptMerged int) {
	t.Helper()
	tiSamples, tiMerged, tiBreaks := bridgeMerged(t, g.tiDB)
	_, ptMerged, ptBreaks := bridgeMerged(t, g.ptDB)
	together := map[string]bool{} // "rollout/seq" of each call merged after the one before it
	for _, s := range tiSamples {
		for i := 1; i < len(s.SequenceIDs); i++ {
			if s.SequenceIDs[i] == s.SequenceIDs[i-1]+1 {
				together[fmt.Sprintf("%s/%d", s.RolloutID, s.SequenceIDs[i])] = true
			}
		}
	}
	rows, err := g.tiStore.Calls(t.Context(), export.CallFilter{})
	if err != nil {
		t.Fatal(err)
	}
	extended, merged := 0, 0
	for _, r := range rows {
		if r.TokenIn != tokenin.Extended {
			continue
		}
		extended++
		if together[fmt.Sprintf("%s/%d", r.RolloutID, r.SequenceID)] {
			merged++
		} else {
			t.Errorf("%s: %s call %d was extended, but the bridge did not merge it into the sample of call %d", name, r.RolloutID, r.SequenceID, r.SequenceID-1)
		}
	}
	if extended != n.extended || extended == 0 {
		t.Errorf("%s: %d extended rows, the agents saw %d", name, extended, n.extended)
	}
	t.Logf("merge table, %s:\n| gateway | later calls | extending calls (token-in) / prefix calls | merged by --mode trajectories | break rate | bridge breaks |\n|---|---:|---:|---:|---:|---|\n| --token-in | %d | %d | %d (%d of the extended: %.0f %%) | %.0f %% | %s |\n| passthrough | %d | %d | %d | %.0f %% | %s |",
		name, n.later, extended, tiMerged, merged, 100*float64(merged)/float64(max(extended, 1)), 100*float64(n.later-tiMerged)/float64(max(n.later, 1)), tiBreaks,
		n.ptLater, n.ptLater-n.ptBreaks, ptMerged, 100*float64(n.ptLater-ptMerged)/float64(max(n.ptLater, 1)), ptBreaks)
	return tiMerged, ptMerged
}

// TestTokenInTrajectoriesMock: item 2's measurement on the mock's template
// (ChatML with hermes tool calls): tool-using agents, whole and streamed
// turns, with --token-in and passthrough beside it; every extended call is
// merged by the bridge's trajectory mode.
func TestTokenInTrajectoriesMock(t *testing.T) {
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr, "--enable-scale-out", "--end-of-turn")
	g, n := tokenInAgents(t, "http://"+mockAddr+"/v1", "vllm", "mock-model", []string{"Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito"}, 64,
		func(turn int) bool { return turn%2 == 1 })
	tokenInMerges(t, "mock (ChatML, hermes)", g, n)
}

// tokenInStreamShapes calls base's render, streamed generate and streamed
// derender (one call per generate chunk, state carried) for a chat request
// and returns the shapes (jsonShape) of the generate chunks and of the
// derender answers with their deltas masked (what a parser emits depends on
// the model's text, not on the format), consecutive repeats collapsed (how
// many tokens an answer takes is the model's).
func tokenInStreamShapes(t *testing.T, base, model string) (gen, der []string) {
	t.Helper()
	origin := strings.TrimSuffix(base, "/v1")
	chatReq := `{"model":"` + model + `","messages":[{"role":"user","content":"Say hi"}],"max_tokens":4,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"return_token_ids":true}`
	status, rendered, _ := postReal(t, origin+"/v1/chat/completions/render", chatReq)
	if status != 200 {
		t.Fatalf("render at %s: %d %s", origin, status, rendered)
	}
	promptIDs := gjson.GetBytes(rendered, "token_ids").Raw
	status, stream, _ := postReal(t, origin+"/inference/v1/generate", string(rendered))
	if status != 200 {
		t.Fatalf("generate at %s: %d %s", origin, status, stream)
	}
	state := "null"
	for _, line := range strings.Split(string(stream), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		shape, err := jsonShape([]byte(data))
		if err != nil {
			t.Fatal(err)
		}
		if len(gen) == 0 || gen[len(gen)-1] != shape {
			gen = append(gen, shape)
		}
		body := `{"stream":true,"model":"` + model + `","generate_chunk":` + data + `,"stream_state":` + state + `,"prompt_tokens":3,"prompt_token_ids":` + promptIDs + `,"chat_request":` + chatReq + `}`
		status, out, _ := postReal(t, origin+"/v1/chat/completions/derender", body)
		if status != 200 {
			t.Fatalf("derender at %s: %d %s\n%s", origin, status, out, body)
		}
		state = gjson.GetBytes(out, "stream_state").Raw
		masked := string(out)
		if d := gjson.GetBytes(out, "chunk.choices.0.delta"); d.Exists() {
			masked = strings.Replace(masked, d.Raw, "{}", 1)
		}
		if shape, err = jsonShape([]byte(masked)); err != nil {
			t.Fatal(err)
		}
		if len(der) == 0 || der[len(der)-1] != shape {
			der = append(der, shape)
		}
	}
	return gen, der
}

// TestTokenInStreamShapesMatchRealVLLM: the mock's streamed generate and
// derender answer in the real vLLM 0.32's shapes (keys, their order, nulls,
// value types): the generate chunks (a token chunk, the finish chunk, the
// usage chunk) and every derender answer with its state, deltas masked.
func TestTokenInStreamShapesMatchRealVLLM(t *testing.T) {
	v, err := testenv.StartVLLM()
	if err != nil {
		t.Fatalf("TestTokenInStreamShapesMatchRealVLLM needs a real vLLM (set %s, or let testenv.StartVLLM start one): %v", testenv.EnvVLLMURL, err)
	}
	t.Cleanup(v.Stop)
	ms, mockURL, err := mock.Start(mock.Config{ScaleOut: true, EndOfTurn: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Shutdown()
	realGen, realDer := tokenInStreamShapes(t, v.URL, testenv.VLLMModel)
	mockGen, mockDer := tokenInStreamShapes(t, mockURL, "mock-model")
	if !slices.Equal(realGen, mockGen) {
		t.Errorf("generate stream shapes differ:\nreal:\n%s\nmock:\n%s", strings.Join(realGen, "\n"), strings.Join(mockGen, "\n"))
	}
	if len(realDer) != len(mockDer) {
		t.Errorf("%d derender answers from the real vLLM, %d from the mock", len(realDer), len(mockDer))
	}
	for i := range min(len(realDer), len(mockDer)) {
		if realDer[i] != mockDer[i] {
			t.Errorf("derender answer %d differs:\nreal: %s\nmock: %s", i, realDer[i], mockDer[i])
		}
	}
}
