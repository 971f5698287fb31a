package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

// TestBridgeThroughGateway drives scripted two-turn tool-using agents through
// the real gateway (rollgate serve with the built-in mock engine), posts
// rewards and statuses through /api/v1, then runs rollgate bridge on the
// captured store and checks the samples against the stored rows.
//
//	task T1: g1 tool result "Error: timed out" (air_tool_failure on call 1), R = 1
//	         g2 tool result fine, R = 0
//	task T2: g3 second turn cut by max_tokens 2 (air_truncated on call 2), R = 1
//	         g4 tool result fine, R = 1
//	         g5 tool result fine, R = -5, cancelled: not selected (failed attempts
//	         are, cancelled ones are not). A finished rollout never runs again, so
//	         a later attempt g4/b is refused (409), where it once resurrected g4.
func TestBridgeThroughGateway(t *testing.T) {
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "rollgate.db")
	cmd, logs := start(t, addr, "/readyz", "serve", "--listen", addr, "--db", db)
	base := "http://" + addr
	const tools = `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	type agent struct {
		ro, attempt, task, result string
		maxTokens2                int
		reward                    float64
		status                    string
	}
	agents := []agent{
		{"g1", "a", "T1", "Error: timed out", 0, 1, "succeeded"},
		{"g2", "a", "T1", "12 degrees", 0, 0, "succeeded"},
		{"g3", "a", "T2", "3 degrees", 2, 1, "succeeded"},
		{"g4", "a", "T2", "sunny", 0, 1, "succeeded"},
		{"g5", "a", "T2", "sunny", 0, -5, "cancelled"},
	}
	for _, a := range agents {
		status, body, _ := post(t, base+"/api/v1/rollouts", fmt.Sprintf(`{"task_id":%q,"rollout_id":%q,"attempt_id":%q}`, a.task, a.ro, a.attempt))
		if status != 200 {
			t.Fatalf("register %s: %d %s", a.ro, status, body)
		}
		var reg struct {
			BaseURL string `json:"base_url"`
		}
		json.Unmarshal([]byte(body), &reg)
		user := `{"role":"user","content":"weather in Oslo?"}`
		status, body, _ = post(t, reg.BaseURL+"/chat/completions", `{"model":"mock-model","logprobs":true,"messages":[`+user+`],"tools":`+tools+`}`)
		if status != 200 {
			t.Fatalf("turn 1 of %s: %d %s\n%s", a.ro, status, body, logs)
		}
		var resp struct {
			Choices []struct {
				Message      json.RawMessage `json:"message"`
				FinishReason string          `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(body), &resp); err != nil || len(resp.Choices) != 1 || resp.Choices[0].FinishReason != "tool_calls" {
			t.Fatalf("turn 1 of %s: %v %s", a.ro, err, body)
		}
		var msg struct {
			ToolCalls []struct {
				ID string `json:"id"`
			} `json:"tool_calls"`
		}
		json.Unmarshal(resp.Choices[0].Message, &msg)
		toolResult, _ := json.Marshal(a.result)
		req := `{"model":"mock-model","logprobs":true,"messages":[` + user + `,` + asSampled(t, string(resp.Choices[0].Message)) +
			`,{"role":"tool","tool_call_id":"` + msg.ToolCalls[0].ID + `","content":` + string(toolResult) + `}],"tools":` + tools
		if a.maxTokens2 > 0 {
			req += fmt.Sprintf(`,"max_tokens":%d`, a.maxTokens2)
		}
		if status, body, _ = post(t, reg.BaseURL+"/chat/completions", req+"}"); status != 200 {
			t.Fatalf("turn 2 of %s: %d %s", a.ro, status, body)
		}
		if status, body, _ = post(t, base+"/api/v1/rollouts/"+a.ro+"/rewards", fmt.Sprintf(`{"value":%v,"attempt_id":%q}`, a.reward, a.attempt)); status != 200 {
			t.Fatalf("reward %s: %d %s", a.ro, status, body)
		}
		if status, body, _ = post(t, base+"/api/v1/rollouts/"+a.ro+"/status", fmt.Sprintf(`{"status":%q,"attempt_id":%q}`, a.status, a.attempt)); status != 200 {
			t.Fatalf("status %s: %d %s", a.ro, status, body)
		}
	}
	if status, body, _ := post(t, base+"/api/v1/rollouts", `{"task_id":"T2","rollout_id":"g4","attempt_id":"b"}`); status != 409 || !strings.Contains(body, "succeeded") {
		t.Fatalf("a later attempt of the finished g4: %d %s, want 409 naming its status", status, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("serve: %v\n%s", err, logs)
	}

	out := filepath.Join(t.TempDir(), "batch.jsonl")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bridge", "--db", db, "--out", out, "--estimator", "grpo", "--air-write"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge: exit %d\n%s", code, stderr.String())
	}
	rows := readJSONL(t, out)
	// Rollout scores R + AIR: g1 1-0.5 = 0.5, g2 0 (T1); g3 1-0.5 = 0.5, g4 1 (T2).
	// Each task: two scores 0.25 apart from their mean, unbiased std sqrt(0.125).
	a := 0.25 / (math.Sqrt(0.125) + 1e-6)
	want := []struct {
		ro     string
		seq    uint64
		reward float64
		adv    float64
	}{{"g1", 1, 0.5, a}, {"g1", 2, 1, a}, {"g2", 1, 0, -a}, {"g2", 2, 0, -a}, {"g3", 1, 1, -a}, {"g3", 2, 0.5, -a}, {"g4", 1, 1, a}, {"g4", 2, 1, a}}
	if len(rows) != len(want) {
		t.Fatalf("%d samples, want %d\n%s", len(rows), len(want), stderr.String())
	}
	s, err := sqlite.Open(db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i, w := range want {
		r := rows[i]
		if r.RolloutID != w.ro || r.SequenceIDs[0] != w.seq || math.Abs(r.Reward-w.reward) > 1e-12 || math.Abs(r.Advantage-w.adv) > 1e-12 || r.AttemptID != "a" {
			t.Errorf("sample %d: %s/%s %v reward %v adv %v, want %+v", i, r.RolloutID, r.AttemptID, r.SequenceIDs, r.Reward, r.Advantage, w)
		}
		calls, err := s.Calls(context.Background(), export.CallFilter{RolloutID: w.ro, AttemptID: "a"})
		if err != nil || len(calls) != 2 {
			t.Fatalf("calls of %s: %d %v", w.ro, len(calls), err)
		}
		c := calls[w.seq-1]
		if fmt.Sprint(c.PromptTokenIDs) != fmt.Sprint(r.PromptIDs) || fmt.Sprint(c.ResponseTokenIDs) != fmt.Sprint(r.ResponseIDs) ||
			fmt.Sprint(c.ResponseLogprobs) != fmt.Sprint(r.Logprobs) || len(r.ResponseMask) != len(r.ResponseIDs) || len(r.ResponseIDs) == 0 ||
			len(c.ResponseLogprobs) != len(c.ResponseTokenIDs) || c.TokenSource != export.TokenSourceEngine {
			t.Errorf("sample %d ids differ from the stored call:\n%v %v %v\n%v %v %v", i, c.PromptTokenIDs, c.ResponseTokenIDs, c.ResponseLogprobs, r.PromptIDs, r.ResponseIDs, r.Logprobs)
		}
	}
	if !strings.Contains(stderr.String(), "AIR hits: air_tool_failure=1 air_truncated=1") {
		t.Errorf("summary:\n%s", stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"sql", "--db", db, "SELECT rollout_id, sequence_id, source FROM rewards WHERE name = 'air' ORDER BY rollout_id"}, &stdout, &stderr); code != 0 ||
		!strings.Contains(stdout.String(), "g1         | 1           | air_tool_failure") || !strings.Contains(stdout.String(), "g3         | 2           | air_truncated") {
		t.Errorf("air rows:\n%s", stdout.String())
	}

	// Trajectories: the agents sent the tool calls back as sampled
	// (asSampled), so each rollout's second prompt extends the first call's
	// prompt + response: one sample per rollout, the tool turn masked.
	stderr.Reset()
	if code := run([]string{"bridge", "--db", db, "--out", out, "--mode", "trajectories", "--estimator", "none"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge trajectories: %s", stderr.String())
	}
	rows = readJSONL(t, out)
	if len(rows) != 4 || !strings.Contains(stderr.String(), "4 calls merged, breaks none") {
		t.Fatalf("%d trajectories\n%s", len(rows), stderr.String())
	}
	for i, r := range rows {
		calls, err := s.Calls(context.Background(), export.CallFilter{RolloutID: r.RolloutID, AttemptID: "a"})
		if err != nil || len(calls) != 2 {
			t.Fatal(err)
		}
		c1, c2 := calls[0], calls[1]
		obs := c2.PromptTokenIDs[len(c1.PromptTokenIDs)+len(c1.ResponseTokenIDs):]
		var wantIDs, wantMask []string
		for _, id := range c1.ResponseTokenIDs {
			wantIDs, wantMask = append(wantIDs, fmt.Sprint(id)), append(wantMask, "1")
		}
		for _, id := range obs {
			wantIDs, wantMask = append(wantIDs, fmt.Sprint(id)), append(wantMask, "0")
		}
		for _, id := range c2.ResponseTokenIDs {
			wantIDs, wantMask = append(wantIDs, fmt.Sprint(id)), append(wantMask, "1")
		}
		if len(obs) == 0 || fmt.Sprint(r.PromptIDs) != fmt.Sprint(c1.PromptTokenIDs) ||
			fmt.Sprint(r.ResponseIDs) != "["+strings.Join(wantIDs, " ")+"]" || fmt.Sprint(r.ResponseMask) != "["+strings.Join(wantMask, " ")+"]" {
			t.Errorf("trajectory %d (%s): prompt %v response %v mask %v", i, r.RolloutID, r.PromptIDs, r.ResponseIDs, r.ResponseMask)
		}
		if want := []float64{0.5, 0, 0.5, 1}[i]; math.Abs(r.Reward-want) > 1e-12 { // R + AIR of its calls
			t.Errorf("trajectory %d reward %v want %v", i, r.Reward, want)
		}
	}

	// A trainer consumes the batch: examples/trainer/consume.py loads the
	// safetensors into PyTorch (Debian's python3-torch) and takes masked
	// policy-gradient steps on a tiny model.
	st := filepath.Join(t.TempDir(), "batch.safetensors")
	stderr.Reset()
	if code := run([]string{"bridge", "--db", db, "--out", st, "--estimator", "grpo"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge safetensors: %s", stderr.String())
	}
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("Debian's python3 is missing (apt-get install python3 python3-torch; scripts/test does): %v", err)
	}
	outb, err := exec.Command(py, filepath.Join("..", "..", "examples", "trainer", "consume.py"), st, "--steps", "5").CombinedOutput()
	if err != nil {
		t.Fatalf("consume.py: %v\n%s", err, outb)
	}
	lines := strings.Split(strings.TrimSpace(string(outb)), "\n")
	var sum struct {
		S        int     `json:"samples"`
		T        int     `json:"response_tokens"`
		G        int     `json:"groups"`
		Before   float64 `json:"objective_before"`
		After    float64 `json:"objective_after"`
		GradNorm float64 `json:"grad_norm"`
		AdvAbs   float64 `json:"advantage_abs_sum"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &sum); err != nil {
		t.Fatalf("consume.py summary: %v\n%s", err, outb)
	}
	tokens := 0
	for _, r := range readJSONLFromBridge(t, db) {
		for _, m := range r.ResponseMask {
			tokens += m
		}
	}
	if sum.S != 8 || sum.G != 2 || sum.T != tokens || sum.GradNorm <= 0 || sum.AdvAbs <= 0 || !(sum.After > sum.Before) {
		t.Fatalf("trainer step: %+v (want 8 samples, 2 groups, %d response tokens, a gradient, a higher objective)\n%s", sum, tokens, outb)
	}
}

// readJSONLFromBridge runs the default transitions export as JSONL.
func readJSONLFromBridge(t *testing.T, db string) []jsonlRow {
	t.Helper()
	out := filepath.Join(t.TempDir(), "b.jsonl")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bridge", "--db", db, "--out", out, "--estimator", "grpo"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge: %s", stderr.String())
	}
	return readJSONL(t, out)
}

type jsonlRow struct {
	RolloutID    string    `json:"rollout_id"`
	AttemptID    string    `json:"attempt_id"`
	SequenceIDs  []uint64  `json:"sequence_ids"`
	PromptIDs    []uint32  `json:"prompt_ids"`
	ResponseIDs  []uint32  `json:"response_ids"`
	ResponseMask []int     `json:"response_mask"`
	Logprobs     []float32 `json:"rollout_log_probs"`
	Reward       float64   `json:"reward"`
	Advantage    float64   `json:"advantage"`
	TokenSource  string    `json:"token_source"`
}

func readJSONL(t *testing.T, path string) []jsonlRow {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []jsonlRow
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r jsonlRow
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		rows = append(rows, r)
	}
	return rows
}
