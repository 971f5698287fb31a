package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/rollgate/rollgate/trainer-bridge/safetensors"
)

// readBatch reads a safetensors file: shapes by name, tensors, metadata.
func readBatch(t *testing.T, path string) (map[string]string, map[string]safetensors.Tensor, map[string]string) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ts, meta, err := safetensors.Read(raw)
	if err != nil {
		t.Fatal(err)
	}
	shapes, byName := map[string]string{}, map[string]safetensors.Tensor{}
	for _, x := range ts {
		shapes[x.Name], byName[x.Name] = fmt.Sprint(x.Shape), x
	}
	return shapes, byName, meta
}

// TestBridgeTensorFlags: --pad-prompt, --pad-response, --batch-multiple,
// --logprobs and the pad id of --tokenizer-config on the store of
// bridgeStore (4 trajectories, P = 2, R = 4).
func TestBridgeTensorFlags(t *testing.T) {
	db := bridgeStore(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tokenizer_config.json")
	os.WriteFile(cfg, []byte(`{"pad_token":"<|endoftext|>","added_tokens_decoder":{"151643":{"content":"<|endoftext|>","special":true},"151644":{"content":"<|im_start|>"}}}`), 0o644)
	var stdout, stderr bytes.Buffer
	st := filepath.Join(dir, "batch.safetensors")
	args := []string{"bridge", "--db", db, "--out", st, "--mode", "trajectories", "--pad-prompt", "8", "--pad-response", "6", "--batch-multiple", "3", "--tokenizer-config", cfg}
	if code := run(args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	shapes, ts, meta := readBatch(t, st)
	for k, w := range map[string]string{"prompts": "[6 8]", "responses": "[6 6]", "input_ids": "[6 14]", "attention_mask": "[6 14]",
		"position_ids": "[6 14]", "response_mask": "[6 6]", "rollout_log_probs": "[6 6]", "token_level_scores": "[6 6]",
		"token_level_rewards": "[6 6]", "advantages": "[6 6]", "returns": "[6 6]"} {
		if shapes[k] != w {
			t.Errorf("%s: shape %s want %s", k, shapes[k], w)
		}
	}
	if len(shapes) != 11 {
		t.Errorf("keys %v", shapes)
	}
	if p := ts["prompts"].I64; fmt.Sprint(p[:8]) != "[151643 151643 151643 151643 151643 151643 100 101]" || p[len(p)-1] != 151643 {
		t.Errorf("prompts padded with %v", p[:8])
	}
	if m := ts["attention_mask"].I64; fmt.Sprint(m[4*14:]) != fmt.Sprint(make([]int64, 2*14)) {
		t.Errorf("padding rows attention %v", m[4*14:])
	}
	if meta["padding"] != `[false,false,false,false,true,true]` || meta["uid"] != `["A@3","A@3","B@3","B@3","",""]` {
		t.Errorf("metadata padding %s uid %s", meta["padding"], meta["uid"])
	}
	var tr []bool
	if err := json.Unmarshal([]byte(meta["truncated"]), &tr); err != nil || len(tr) != 6 {
		t.Errorf("truncated %s", meta["truncated"])
	}
	if !strings.Contains(stderr.String(), "safetensors: 6 rows x 8 prompt + 6 response tokens, pad id 151643, 2 padding rows added for --batch-multiple 3") {
		t.Errorf("summary:\n%s", stderr.String())
	}

	// A second batch with the same fixed padding has the same trailing dimensions.
	st2 := filepath.Join(dir, "b.safetensors")
	if code := run([]string{"bridge", "--db", db, "--out", st2, "--pad-prompt", "8", "--pad-response", "6", "--tasks", "A", "--logprobs", "omit", "--pad-id", "7"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	shapes2, ts2, _ := readBatch(t, st2)
	for k, s := range shapes2 {
		if strings.Fields(s)[1] != strings.Fields(shapes[k])[1] {
			t.Errorf("%s: %s vs %s", k, s, shapes[k])
		}
	}
	if _, ok := shapes2["rollout_log_probs"]; ok || len(shapes2) != 10 {
		t.Errorf("--logprobs omit: keys %v", shapes2)
	}
	if ts2["prompts"].I64[0] != 7 {
		t.Errorf("--pad-id 7: prompts %v", ts2["prompts"].I64[:8])
	}

	// --logprobs omit in Parquet leaves the column out.
	pq := filepath.Join(dir, "b.parquet")
	if code := run([]string{"bridge", "--db", db, "--out", pq, "--logprobs", "omit"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	data, _ := os.ReadFile(pq)
	f, err := parquet.OpenFile(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range f.Schema().Columns() {
		if c[0] == "rollout_log_probs" {
			t.Error("parquet: rollout_log_probs with --logprobs omit")
		}
	}

	// Too-small padding fails naming the flag; bad values are usage errors.
	stderr.Reset()
	if code := run([]string{"bridge", "--db", db, "--out", st, "--mode", "trajectories", "--pad-response", "3"}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "--pad-response 3 is smaller than a response of 4 tokens (rollout ra1); raise it or set --max-response") {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
	noPad := filepath.Join(dir, "llama", "tokenizer_config.json")
	os.MkdirAll(filepath.Dir(noPad), 0o755)
	os.WriteFile(noPad, []byte(`{"pad_token":null,"added_tokens_decoder":{}}`), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--out", st, "--pad-prompt", "-1"}, "--pad-prompt -1"},
		{[]string{"--out", st, "--batch-multiple", "-2"}, "--batch-multiple -2"},
		{[]string{"--out", filepath.Join(dir, "x.jsonl"), "--pad-response", "4"}, "--pad-response pads safetensors batches only"},
		{[]string{"--out", st, "--logprobs", "zero"}, `--logprobs "zero" is not keep or omit`},
		{[]string{"--out", st, "--tokenizer-config", noPad}, "--tokenizer-config: " + noPad + " has no pad_token; pass --pad-id"},
		{[]string{"--out", st, "--tokenizer-config", filepath.Join(dir, "missing.json")}, "--tokenizer-config: "},
	} {
		stderr.Reset()
		if code := run(append([]string{"bridge", "--db", db}, tc.args...), &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d: %s", tc.args, code, stderr.String())
		}
	}
}

// TestPadTokenID: pad_token as a string or {"content"}, resolved from
// added_tokens_decoder or the tokenizer.json beside the config.
func TestPadTokenID(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tokenizer_config.json")
	os.WriteFile(cfg, []byte(`{"pad_token":{"content":"<pad>","lstrip":false},"added_tokens_decoder":{"0":{"content":"<unk>"}}}`), 0o644)
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"added_tokens":[{"id":3,"content":"<pad>"}]}`), 0o644)
	if id, err := padTokenID(cfg); err != nil || id != 3 {
		t.Errorf("tokenizer.json: %d %v", id, err)
	}
	os.WriteFile(cfg, []byte(`{"pad_token":"<pad>","added_tokens_decoder":{"5":{"content":"<pad>"}}}`), 0o644)
	if id, err := padTokenID(cfg); err != nil || id != 5 {
		t.Errorf("added_tokens_decoder: %d %v", id, err)
	}
	os.WriteFile(cfg, []byte(`{"pad_token":"<nope>"}`), 0o644)
	if _, err := padTokenID(cfg); err == nil || !strings.Contains(err.Error(), `pad_token "<nope>" is not an added token`) {
		t.Errorf("unknown pad token: %v", err)
	}
}
