package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
	"github.com/rollgate/rollgate/trainer-bridge/safetensors"
)

// bridgeStore writes two tasks of two rollouts each, as the gateway stores
// them: two-turn tool-using episodes, rewards posted through the API.
//
//	task A: ra1 (tool result "Error: no such city" -> air_tool_failure -0.5 on seq 1, R = 1)
//	        ra2 (tool result fine, R = 0)
//	task B: rb1 (second answer truncated -> air_truncated -0.5 on seq 2, R = 1)
//	        rb2 (R = 1; a third call with token_source "none" is excluded)
func bridgeStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rollgate.db")
	s, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const tools = `"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	first := `{"model":"m","messages":[{"role":"user","content":"q"}],` + tools + `}`
	second := func(result string) string {
		return `{"model":"m","messages":[{"role":"user","content":"q"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"city\":\"Oslo\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"` + result + `"}],` + tools + `}`
	}
	toolMsg := `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"lookup","arguments":"{\"city\":\"Oslo\"}"}}]}`
	b := &export.Batch{}
	add := func(ro, task string, seq uint64, req, msg, finish, src string, prompt, resp []uint32) {
		lp := make([]float32, len(resp))
		for i := range lp {
			lp[i] = -0.5
		}
		b.Calls = append(b.Calls, export.Call{SpanID: ro + fmt.Sprint(seq), RolloutID: ro, AttemptID: "at-" + ro, TaskID: task, AgentName: "agent",
			SequenceID: seq, StartTimeUnixNano: 1_700_000_000_000_000_000 + seq, HTTPStatus: 200, Endpoint: "/v1/chat/completions", Model: "m",
			PolicyVersion: "3", RequestBody: req, ResponseMessage: msg, FinishReason: finish, TokenSource: src,
			PromptTokenIDs: prompt, ResponseTokenIDs: resp, ResponseLogprobs: lp})
	}
	for _, ro := range []struct {
		id, task, result, finish2 string
		reward                    float64
	}{{"ra1", "A", "Error: no such city", "stop", 1}, {"ra2", "A", "12 degrees", "stop", 0}, {"rb1", "B", "3 degrees", "length", 1}, {"rb2", "B", "ok", "stop", 1}} {
		add(ro.id, ro.task, 1, first, toolMsg, "tool_calls", "engine", []uint32{100, 101}, []uint32{200, 201})
		add(ro.id, ro.task, 2, second(ro.result), `{"role":"assistant","content":"It is cold."}`, ro.finish2, "engine", []uint32{100, 101, 200, 201, 300}, []uint32{202})
		b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro.id, AttemptID: "at-" + ro.id, TaskID: ro.task, Status: "succeeded", Metadata: "{}", CreatedUnixNano: 1, UpdatedUnixNano: 2})
		b.Rewards = append(b.Rewards, export.Reward{RolloutID: ro.id, AttemptID: "at-" + ro.id, Name: "primary", Value: ro.reward, Source: "api", TimeUnixNano: 3})
	}
	add("rb2", "B", 3, first, `{"role":"assistant","content":"x"}`, "stop", "none", []uint32{1}, []uint32{2})
	if err := s.Write(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBridgeCommand runs "rollgate bridge" in-process on the store above.
//
// Rollout scores (R + AIR): ra1 1-0.5 = 0.5, ra2 0, rb1 1-0.5 = 0.5, rb2 1.
// GRPO per task: A = {0.5, 0}: mean 0.25, std sqrt(0.03125*2/1)... precisely
// unbiased var = (0.25^2 + 0.25^2)/1 = 0.125, std = 0.35355339059327373;
// A(ra1) = 0.25/(std+1e-6), A(ra2) = -A(ra1); task B = {0.5, 1}: the same
// magnitudes with rb1 negative.
func TestBridgeCommand(t *testing.T) {
	db := bridgeStore(t)
	out := filepath.Join(t.TempDir(), "batch.jsonl")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bridge", "--db", db, "--out", out, "--mode", "trajectories", "--estimator", "grpo"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		RolloutID    string    `json:"rollout_id"`
		UID          string    `json:"uid"`
		PromptIDs    []uint32  `json:"prompt_ids"`
		ResponseIDs  []uint32  `json:"response_ids"`
		ResponseMask []int     `json:"response_mask"`
		Logprobs     []float32 `json:"rollout_log_probs"`
		Reward       float64   `json:"reward"`
		Advantage    float64   `json:"advantage"`
	}
	var rows []row
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var r row
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		rows = append(rows, r)
	}
	a := 0.25 / (math.Sqrt(0.125) + 1e-6)
	want := []struct {
		ro     string
		reward float64
		adv    float64
	}{{"ra1", 0.5, a}, {"ra2", 0, -a}, {"rb1", 0.5, -a}, {"rb2", 1, a}}
	if len(rows) != len(want) {
		t.Fatalf("%d rows:\n%s", len(rows), data)
	}
	for i, w := range want {
		r := rows[i]
		if r.RolloutID != w.ro || math.Abs(r.Reward-w.reward) > 1e-12 || math.Abs(r.Advantage-w.adv) > 1e-12 {
			t.Errorf("row %d: %+v, want %+v", i, r, w)
		}
		// prompt [100 101]; response: turn 1 [200 201], observation [300], turn 2 [202]
		if fmt.Sprint(r.PromptIDs, r.ResponseIDs, r.ResponseMask, r.Logprobs) != "[100 101] [200 201 300 202] [1 1 0 1] [-0.5 -0.5 0 -0.5]" {
			t.Errorf("row %d tokens: %v %v %v %v", i, r.PromptIDs, r.ResponseIDs, r.ResponseMask, r.Logprobs)
		}
	}
	summary := stderr.String()
	for _, s := range []string{"4 samples in 2 groups from 4 attempts (9 calls)", "excluded: unverified_ids=1", "AIR hits: air_tool_failure=1 air_truncated=1",
		"trajectories: 4 calls merged", `task "A": 2 samples, reward mean 0.25`} {
		if !strings.Contains(summary, s) {
			t.Errorf("summary lacks %q:\n%s", s, summary)
		}
	}

	// Parquet by extension; AIR off and written nowhere: rewards are R alone.
	pq := filepath.Join(t.TempDir(), "batch.parquet")
	stderr.Reset()
	if code := run([]string{"bridge", "--db", db, "--out", pq, "--air=false", "--estimator", "rloo"}, &stdout, &stderr); code != 0 {
		t.Fatalf("parquet exit %d: %s", code, stderr.String())
	}
	if fi, err := os.Stat(pq); err != nil || fi.Size() < 100 {
		t.Fatalf("parquet file: %v %v", fi, err)
	}
	if data, _ := os.ReadFile(pq); !bytes.HasPrefix(data, []byte("PAR1")) || !bytes.HasSuffix(data, []byte("PAR1")) {
		t.Fatal("not a parquet file")
	}
	if !strings.Contains(stderr.String(), "8 samples in 2 groups") || !strings.Contains(stderr.String(), "AIR hits: none") {
		t.Fatalf("summary: %s", stderr.String())
	}

	// safetensors batch: verl keys, 4 trajectories padded to P = 2, R = 4.
	st := filepath.Join(t.TempDir(), "batch.safetensors")
	if code := run([]string{"bridge", "--db", db, "--out", st, "--mode", "trajectories", "--pad-id", "7"}, &stdout, &stderr); code != 0 {
		t.Fatalf("safetensors exit %d: %s", code, stderr.String())
	}
	raw, err := os.ReadFile(st)
	if err != nil {
		t.Fatal(err)
	}
	ts, meta, err := safetensors.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]safetensors.Tensor{}
	for _, x := range ts {
		byName[x.Name] = x
	}
	if x := byName["response_mask"]; fmt.Sprint(x.Shape, x.I64[:4]) != "[4 4] [1 1 0 1]" {
		t.Errorf("response_mask %v", x)
	}
	if x := byName["advantages"]; math.Abs(float64(x.F32[0])-a) > 1e-6 || x.F32[2] != 0 {
		t.Errorf("advantages %v", x.F32[:4])
	}
	if x := byName["token_level_rewards"]; fmt.Sprint(x.F32[:4]) != "[0 0 0 0.5]" {
		t.Errorf("token_level_rewards %v", x.F32[:4])
	}
	if meta["uid"] != `["A@3","A@3","B@3","B@3"]` { // task@policy version: one group per training step
		t.Errorf("uid %q", meta["uid"])
	}

	// --air-write stores the rule outcomes; rollgate sql shows them.
	if code := run([]string{"bridge", "--db", db, "--out", "-", "--air-write", "--air-rules", "air_truncated=off,air_tool_failure=-2"}, &stdout, &stderr); code != 0 {
		t.Fatalf("air-write exit %d: %s", code, stderr.String())
	}
	stdout.Reset()
	if code := run([]string{"sql", "--db", db, "SELECT rollout_id, sequence_id, source, value FROM rewards WHERE source LIKE 'air%'"}, &stdout, &stderr); code != 0 {
		t.Fatalf("sql: %s", stderr.String())
	}
	if !strings.Contains(stdout.String(), "ra1        | 1           | air_tool_failure | -2") || !strings.Contains(stdout.String(), "(1 row)") {
		t.Fatalf("sql output:\n%s", stdout.String())
	}
}

// TestBridgeServe: a trainer pulls the samples over HTTP; a lease it never
// acknowledges expires and its samples come back; the command ends when all
// are acknowledged.
func TestBridgeServe(t *testing.T) {
	db := bridgeStore(t)
	addr := freeAddr(t)
	var stdout bytes.Buffer
	stderr := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"bridge", "--db", db, "--serve", addr, "--lease-ttl", "200ms", "--estimator", "none"}, &stdout, stderr)
	}()
	waitUntil(t, "the bridge to listen", 15*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	lease := func(n int) (string, []map[string]any) {
		r, err := http.Post("http://"+addr+"/lease", "application/json", strings.NewReader(fmt.Sprintf(`{"n":%d}`, n)))
		if err != nil {
			t.Fatalf("lease: %v\n%s", err, stderr)
		}
		defer r.Body.Close()
		if r.StatusCode == 204 {
			return "", nil
		}
		var l struct {
			LeaseID string           `json:"lease_id"`
			Samples []map[string]any `json:"samples"`
		}
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			t.Fatal(err)
		}
		return l.LeaseID, l.Samples
	}
	abandoned, first := lease(3)
	if abandoned == "" || len(first) != 3 || first[0]["rollout_id"] != "ra1" {
		t.Fatalf("first lease %q %v", abandoned, first)
	}
	seen := map[string]int{}
	for {
		id, s := lease(2)
		if id == "" {
			break
		}
		r, err := http.Post("http://"+addr+"/ack", "application/json", strings.NewReader(`{"lease_id":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("ack %s: %d", id, r.StatusCode)
		}
		for _, x := range s {
			seen[fmt.Sprint(x["rollout_id"], x["sequence_ids"])]++
		}
	}
	// The abandoned lease expires after 200ms: its 3 samples are served again.
	waitUntil(t, "the expired samples to come back", 15*time.Second, func() bool {
		id, s := lease(8)
		if id != "" {
			r, err := http.Post("http://"+addr+"/ack", "application/json", strings.NewReader(`{"lease_id":"`+id+`"}`))
			if err != nil {
				t.Fatal(err)
			}
			r.Body.Close()
			for _, x := range s {
				seen[fmt.Sprint(x["rollout_id"], x["sequence_ids"])]++
			}
		}
		return len(seen) >= 8
	})
	if code := <-done; code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("%s acknowledged %d times", k, n)
		}
	}
	if !strings.Contains(stderr.String(), "all 8 samples acknowledged") {
		t.Errorf("stderr: %s", stderr)
	}
}

func TestBridgeFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bridge"},
		{"bridge", "--out", "x", "--estimator", "gae"},
		{"bridge", "--out", "x", "--credit", "sometimes"},
		{"bridge", "--out", "x", "--agent", "("},
		{"bridge", "--out", "x", "--air-rules", "nope=1"},
		{"bridge", "--out", "x", "--air-rules", "air_repeat"},
		{"bridge", "--out", "x", "--since", "yesterday"},
		{"bridge", "--out", "x", "--format", "csv"},
		{"bridge", "--out", "-", "--format", "parquet"},
		{"bridge", "--out", "-", "--format", "safetensors"},
		{"bridge", "--out", "x.jsonl", "--missing-reward", "5"},
		{"bridge", "--out", "x.jsonl", "--truncation", "chop"},
		{"bridge", "--out", "x.jsonl", "--min-group-size", "-1"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 || stderr.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr.String())
		}
	}
}

// TestBridgeExplain: --explain says, for one rollout, what became of each
// call and sample and why; --report writes the same for every attempt.
func TestBridgeExplain(t *testing.T) {
	db := bridgeStore(t)
	report := filepath.Join(t.TempDir(), "report.json")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bridge", "--db", db, "--estimator", "grpo", "--explain", "rb2", "--report", report}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"rollout rb2 attempt at-rb2", `group "B@3"`, "sample [1] choice 0: included, advantage", "call [3] choice 0: excluded: unverified_ids"} {
		if !strings.Contains(out, want) {
			t.Fatalf("--explain rb2 lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Attempts []bridge.AttemptReport `json:"attempts"`
	}
	if err := json.Unmarshal(b, &rep); err != nil || len(rep.Attempts) != 4 {
		t.Fatalf("report (%v): %s", err, b)
	}
	stdout.Reset()
	if code := run([]string{"bridge", "--db", db, "--explain", "nope"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "not selected") {
		t.Fatalf("unknown rollout: %d %s", code, stdout.String())
	}
}
