package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/rollgate/rollgate/tokenize/chattemplate/chattemplatetest"
)

// TestRetokenizeThroughGateway: a two-turn tool-using agent goes through the
// real gateway to a backend that returns no token ids (the mock engine with
// --ignore-return-token-ids behind a replica of kind "openai", as a hosted
// API is), so its calls are captured with token_source none. rollgate bridge
// excludes them by default; with --retokenize on the real Qwen2.5 files it
// trains on them, and every id equals the independent references'
// (@huggingface/jinja's rendering of the messages the agent sent and
// received — the second answer streamed —, tokenized by transformers.js);
// in trajectory mode the two turns merge. POST /api/v1/bridge/batches with
// "retokenize" naming the tokenizer configured in bridge_tokenizers does the
// same over HTTP.
func TestRetokenizeThroughGateway(t *testing.T) {
	qwen := chattemplatetest.ModelDir(t, "qwen2_5")
	mockAddr := freeAddr(t)
	start(t, mockAddr, "/health", "mock", "--listen", mockAddr, "--ignore-return-token-ids")
	addr := freeAddr(t)
	db := filepath.Join(t.TempDir(), "rollgate.db")
	cfg := map[string]any{"listen": addr, "db": db, "bridge_tokenizers": map[string]string{"qwen2_5": qwen}, "backends": []map[string]any{
		{"model": "qwen", "replicas": []map[string]any{{"name": "hosted", "url": "http://" + mockAddr + "/v1", "kind": "openai"}}},
	}}
	b, _ := yaml.Marshal(cfg)
	cfgPath := filepath.Join(t.TempDir(), "rollgate.yaml")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, logs := start(t, addr, "/readyz", "serve", "--config", cfgPath)
	base := "http://" + addr

	const tools = `[{"type":"function","function":{"name":"lookup","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	status, body, _ := post(t, base+"/api/v1/rollouts", `{"task_id":"T","rollout_id":"r1","attempt_id":"a"}`)
	if status != 200 {
		t.Fatalf("register: %d %s", status, body)
	}
	var reg struct {
		BaseURL string `json:"base_url"`
	}
	json.Unmarshal([]byte(body), &reg)
	type turn struct {
		messages, message json.RawMessage
		finish            string
	}
	chat := func(messages string, stream bool) turn {
		t.Helper()
		req := `{"model":"qwen","messages":` + messages + `,"tools":` + tools
		if stream {
			req += `,"stream":true`
		}
		status, body, _ := post(t, reg.BaseURL+"/chat/completions", req+"}")
		if status != 200 {
			t.Fatalf("chat: %d %s\n%s", status, body, logs)
		}
		if strings.Contains(body, `token_ids":[`) {
			t.Fatalf("the backend returned token ids: %s", body)
		}
		type choice struct {
			Message      json.RawMessage `json:"message"`
			Delta        json.RawMessage `json:"delta"`
			FinishReason string          `json:"finish_reason"`
		}
		var resp struct {
			Choices []choice `json:"choices"`
		}
		if !stream {
			if err := json.Unmarshal([]byte(body), &resp); err != nil || len(resp.Choices) != 1 {
				t.Fatalf("chat: %v %s", err, body)
			}
			return turn{json.RawMessage(messages), resp.Choices[0].Message, resp.Choices[0].FinishReason}
		}
		// The client's view of a streamed answer: its content deltas, in order.
		var content strings.Builder
		finish := ""
		for _, line := range strings.Split(body, "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			resp.Choices = nil
			if err := json.Unmarshal([]byte(data), &resp); err != nil {
				t.Fatalf("chunk %s: %v", data, err)
			}
			for _, c := range resp.Choices {
				var d struct {
					Content   string          `json:"content"`
					ToolCalls json.RawMessage `json:"tool_calls"`
				}
				json.Unmarshal(c.Delta, &d)
				if len(d.ToolCalls) > 0 {
					t.Fatalf("streamed turn made a tool call: %s", data)
				}
				content.WriteString(d.Content)
				if c.FinishReason != "" {
					finish = c.FinishReason
				}
			}
		}
		msg, _ := json.Marshal(map[string]string{"role": "assistant", "content": content.String()})
		return turn{json.RawMessage(messages), msg, finish}
	}
	user := `{"role":"system","content":"You answer weather questions."},{"role":"user","content":"Weather in Oslo? °C please."}`
	t1 := chat(`[`+user+`]`, false)
	var msg struct {
		ToolCalls []struct {
			ID string `json:"id"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(t1.message, &msg); err != nil || len(msg.ToolCalls) == 0 || t1.finish != "tool_calls" {
		t.Fatalf("turn 1 is not a tool call (%v): %s %s", err, t1.message, t1.finish)
	}
	t2 := chat(`[`+user+`,`+string(t1.message)+`,{"role":"tool","tool_call_id":"`+msg.ToolCalls[0].ID+`","content":"12 degrees, cloudy"}]`, true)
	if t2.finish == "" || strings.Contains(string(t2.message), `"content":""`) {
		t.Fatalf("streamed turn 2: %s finish %q", t2.message, t2.finish)
	}
	if status, body, _ = post(t, base+"/api/v1/rollouts/r1/rewards", `{"value":1,"attempt_id":"a"}`); status != 200 {
		t.Fatalf("reward: %d %s", status, body)
	}
	if status, body, _ = post(t, base+"/api/v1/rollouts/r1/status", `{"status":"succeeded","attempt_id":"a"}`); status != 200 {
		t.Fatalf("status: %d %s", status, body)
	}

	// By default the calls without ids are excluded.
	out := filepath.Join(t.TempDir(), "off.jsonl")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bridge", "--db", db, "--out", out, "--estimator", "none"}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge: exit %d\n%s", code, stderr.String())
	}
	if data, err := os.ReadFile(out); err != nil || len(data) != 0 || !strings.Contains(stderr.String(), "unverified_ids=2") {
		t.Fatalf("without --retokenize: %v %q\n%s", err, data, stderr.String())
	}

	ref := chattemplatetest.Reference(t, "qwen2_5", []chattemplatetest.Case{
		{Name: "turn 1", Messages: t1.messages, Tools: json.RawMessage(tools), Response: t1.message, FinishReason: t1.finish},
		{Name: "turn 2", Messages: t2.messages, Tools: json.RawMessage(tools), Response: t2.message, FinishReason: t2.finish},
	})
	check := func(rows []jsonlRow) {
		t.Helper()
		if len(rows) != 2 {
			t.Fatalf("%d samples, want 2", len(rows))
		}
		for i, r := range rows {
			if ref[i].Error != "" {
				t.Fatalf("reference %d: %s", i, ref[i].Error)
			}
			if r.TokenSource != "retokenized" || fmt.Sprint(r.SequenceIDs) != fmt.Sprint([]uint64{uint64(i + 1)}) {
				t.Errorf("sample %d: token_source %q sequence %v", i, r.TokenSource, r.SequenceIDs)
			}
			if !slices.Equal(r.PromptIDs, ref[i].PromptIDs) {
				t.Errorf("turn %d: prompt ids differ from the reference's for %q\n got %v\nwant %v", i+1, ref[i].Prompt, r.PromptIDs, ref[i].PromptIDs)
			}
			if !slices.Equal(r.ResponseIDs, ref[i].ResponseIDs) {
				t.Errorf("turn %d: response ids differ from the reference's for %q\n got %v\nwant %v", i+1, *ref[i].Response, r.ResponseIDs, ref[i].ResponseIDs)
			}
		}
	}
	out = filepath.Join(t.TempDir(), "on.jsonl")
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"bridge", "--db", db, "--out", out, "--estimator", "none", "--retokenize", qwen}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge --retokenize: exit %d\n%s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "retokenized: 2 calls from their text, 2 samples") {
		t.Errorf("summary does not count the retokenized calls:\n%s", stderr.String())
	}
	check(readJSONL(t, out))

	// Trajectories: the two retokenized turns merge (prompt 2 extends
	// prompt 1 + response 1, the tool result masked).
	out = filepath.Join(t.TempDir(), "traj.jsonl")
	stderr.Reset()
	if code := run([]string{"bridge", "--db", db, "--out", out, "--estimator", "none", "--mode", "trajectories", "--retokenize", qwen}, &stdout, &stderr); code != 0 {
		t.Fatalf("bridge --mode trajectories --retokenize: exit %d\n%s", code, stderr.String())
	}
	traj := readJSONL(t, out)
	if len(traj) != 1 || fmt.Sprint(traj[0].SequenceIDs) != "[1 2]" || traj[0].TokenSource != "retokenized" ||
		!slices.Equal(traj[0].PromptIDs, ref[0].PromptIDs) || !slices.Equal(traj[0].ResponseIDs[len(traj[0].ResponseIDs)-len(ref[1].ResponseIDs):], ref[1].ResponseIDs) {
		t.Errorf("trajectories: %+v\n%s", traj, stderr.String())
	}

	// Over HTTP: the batch goes to the lease queue; lease it back.
	status, body, _ = post(t, base+"/api/v1/bridge/batches", `{"estimator":"none","retokenize":"qwen2_5"}`)
	if status != 200 || !strings.Contains(body, `"retokenized":2`) || !strings.Contains(body, `"samples":2`) {
		t.Fatalf("POST /api/v1/bridge/batches: %d %s", status, body)
	}
	status, body, _ = post(t, base+"/api/v1/bridge/lease", `{"n":10}`)
	var lease struct {
		Samples []jsonlRow `json:"samples"`
	}
	if err := json.Unmarshal([]byte(body), &lease); status != 200 || err != nil {
		t.Fatalf("lease: %d %v %s", status, err, body)
	}
	check(lease.Samples)
	// A path is no tokenizer name: 400 listing the configured names.
	if status, body, _ = post(t, base+"/api/v1/bridge/batches", `{"retokenize":"/nonexistent"}`); status != 400 || !strings.Contains(body, "qwen2_5") {
		t.Errorf("a path as the tokenizer: %d %s", status, body)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
