package bridge

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/trainer-bridge/safetensors"
)

func tensorSamples() []*Sample {
	return []*Sample{
		{RolloutID: "r0", AttemptID: "a0", TaskID: "t", GroupUID: "t", AgentName: "solver", PolicyVersion: "v1", TokenSource: "engine",
			SequenceIDs: []uint64{1, 2}, Prompt: []uint32{5, 6}, Response: []uint32{7, 8, 9}, ResponseMask: []uint8{1, 0, 1},
			Logprobs: []float32{-1, 0, -2}, Reward: 2, Advantage: 0.5, HasLogprobs: true, Truncated: true},
		{RolloutID: "r1", AttemptID: "a1", TaskID: "u", GroupUID: "u", AgentName: "solver", PolicyVersion: "v2", TokenSource: "tokenize",
			SequenceIDs: []uint64{3}, Prompt: []uint32{4}, Response: []uint32{3}, ResponseMask: []uint8{1},
			Logprobs: []float32{-3}, Reward: -1, Advantage: -0.5, HasLogprobs: true, MixedPolicy: true},
	}
}

// readTensors writes samples with o and reads the file back: tensors as
// "shape values" strings, dtypes, metadata.
func readTensors(t *testing.T, samples []*Sample, o TensorOptions) (map[string]string, map[string]string, map[string]string, TensorStats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := WriteSafetensors(&buf, samples, o)
	if err != nil {
		t.Fatal(err)
	}
	ts, meta, err := safetensors.Read(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got, dtypes := map[string]string{}, map[string]string{}
	for _, x := range ts {
		dtypes[x.Name] = x.DType()
		if x.I64 != nil {
			got[x.Name] = sp(x.Shape, x.I64)
		} else {
			got[x.Name] = sp(x.Shape, x.F32)
		}
	}
	return got, dtypes, meta, st
}

// TestTensors pads two samples by hand (pad id 0):
//
//	s0: prompt [5 6], response [7 8 9] mask [1 0 1] lp [-1 0 -2], reward 2, adv 0.5
//	s1: prompt [4],   response [3]     mask [1]     lp [-3],      reward -1, adv -0.5
//
// P = 2, R = 3:
//
//	prompts   [[5 6] [0 4]]            responses [[7 8 9] [3 0 0]]
//	input_ids [[5 6 7 8 9] [0 4 3 0 0]] attention [[1 1 1 1 1] [0 1 1 0 0]]
//	position  [[0 1 2 3 4] [0 0 1 1 1]] (cumsum - 1, clipped at 0)
//	response_mask [[1 0 1] [1 0 0]]
//	scores = rewards [[0 0 2] [-1 0 0]] advantages = returns [[0.5 0 0.5] [-0.5 0 0]]
func TestTensors(t *testing.T) {
	got, dtypes, meta, st := readTensors(t, tensorSamples(), TensorOptions{})
	want := map[string]string{
		"prompts":             "[2 2] [5 6 0 4]",
		"responses":           "[2 3] [7 8 9 3 0 0]",
		"input_ids":           "[2 5] [5 6 7 8 9 0 4 3 0 0]",
		"attention_mask":      "[2 5] [1 1 1 1 1 0 1 1 0 0]",
		"position_ids":        "[2 5] [0 1 2 3 4 0 0 1 1 1]",
		"response_mask":       "[2 3] [1 0 1 1 0 0]",
		"rollout_log_probs":   "[2 3] [-1 0 -2 -3 0 0]",
		"token_level_scores":  "[2 3] [0 0 2 -1 0 0]",
		"token_level_rewards": "[2 3] [0 0 2 -1 0 0]",
		"advantages":          "[2 3] [0.5 0 0.5 -0.5 0 0]",
		"returns":             "[2 3] [0.5 0 0.5 -0.5 0 0]",
	}
	if len(got) != len(want) {
		t.Fatalf("tensors %v", got)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %s want %s", k, got[k], w)
		}
		wd := "I64"
		if strings.Contains("rollout_log_probs token_level_scores token_level_rewards advantages returns", k) {
			wd = "F32"
		}
		if dtypes[k] != wd {
			t.Errorf("%s: dtype %s want %s", k, dtypes[k], wd)
		}
	}
	if st != (TensorStats{Rows: 2, PromptLen: 2, ResponseLen: 3}) {
		t.Errorf("stats %+v", st)
	}
	wantMeta := map[string]string{
		"uid":             `["t","u"]`,
		"rollout_id":      `["r0","r1"]`,
		"attempt_id":      `["a0","a1"]`,
		"task_id":         `["t","u"]`,
		"agent_name":      `["solver","solver"]`,
		"policy_version":  `["v1","v2"]`,
		"token_source":    `["engine","tokenize"]`,
		"choice_index":    `[0,0]`,
		"sequence_ids":    `[[1,2],[3]]`,
		"has_logprobs":    `[true,true]`,
		"truncated":       `[true,false]`,
		"trimmed":         `[false,false]`,
		"padding":         `[false,false]`,
		"mixed_policy":    `[false,true]`,
		"rollgate_format": TensorFormat,
	}
	if len(meta) != len(wantMeta) {
		t.Errorf("metadata keys %v", meta)
	}
	for k, w := range wantMeta {
		if meta[k] != w {
			t.Errorf("metadata %s: %s want %s", k, meta[k], w)
		}
	}
	checkMetaTypes(t, meta, 2)

	var buf bytes.Buffer
	if _, err := WriteSafetensors(&buf, []*Sample{{Response: []uint32{1}, HasLogprobs: true}}, TensorOptions{}); err == nil {
		t.Error("sample without mask accepted")
	}
}

// checkMetaTypes parses every array key as JSON of its type with one entry per row.
func checkMetaTypes(t *testing.T, meta map[string]string, rows int) {
	t.Helper()
	for _, k := range []string{"uid", "rollout_id", "attempt_id", "task_id", "agent_name", "policy_version", "token_source"} {
		var v []string
		if err := json.Unmarshal([]byte(meta[k]), &v); err != nil || len(v) != rows {
			t.Errorf("metadata %s = %s: %v, want %d strings", k, meta[k], err, rows)
		}
	}
	for _, k := range []string{"has_logprobs", "truncated", "trimmed", "padding", "mixed_policy"} {
		var v []bool
		if err := json.Unmarshal([]byte(meta[k]), &v); err != nil || len(v) != rows {
			t.Errorf("metadata %s = %s: %v, want %d booleans", k, meta[k], err, rows)
		}
	}
	var seqs [][]uint64
	if err := json.Unmarshal([]byte(meta["sequence_ids"]), &seqs); err != nil || len(seqs) != rows {
		t.Errorf("metadata sequence_ids = %s: %v", meta["sequence_ids"], err)
	}
	var ci []uint32
	if err := json.Unmarshal([]byte(meta["choice_index"]), &ci); err != nil || len(ci) != rows {
		t.Errorf("metadata choice_index = %s: %v", meta["choice_index"], err)
	}
}

// TestTensorsFixedPadding: --pad-prompt 4 --pad-response 5 with pad id 9
// gives [B,4], [B,5] and [B,9] whatever the samples, so two files
// concatenate; a sample over a fixed length is an error naming the flag.
func TestTensorsFixedPadding(t *testing.T) {
	o := TensorOptions{PadID: 9, PadPrompt: 4, PadResponse: 5}
	got, _, _, st := readTensors(t, tensorSamples(), o)
	if got["prompts"] != "[2 4] [9 9 5 6 9 9 9 4]" || got["responses"] != "[2 5] [7 8 9 9 9 3 9 9 9 9]" ||
		got["attention_mask"] != "[2 9] [0 0 1 1 1 1 1 0 0 0 0 0 1 1 0 0 0 0]" ||
		got["position_ids"] != "[2 9] [0 0 0 1 2 3 4 4 4 0 0 0 0 1 1 1 1 1]" ||
		got["token_level_scores"] != "[2 5] [0 0 2 0 0 -1 0 0 0 0]" {
		t.Errorf("fixed padding: %v", got)
	}
	if st.PromptLen != 4 || st.ResponseLen != 5 {
		t.Errorf("stats %+v", st)
	}
	other, _, _, _ := readTensors(t, tensorSamples()[1:], o)
	for k, v := range got {
		a, b := strings.Fields(v), strings.Fields(other[k])
		if a[1] != b[1] { // trailing dimension of the shape "[B N]"
			t.Errorf("%s: %s vs %s", k, v, other[k])
		}
	}
	for _, tc := range []struct {
		o    TensorOptions
		want string
	}{
		{TensorOptions{PadResponse: 2}, "--pad-response 2 is smaller than a response of 3 tokens (rollout r0); raise it or set --max-response"},
		{TensorOptions{PadPrompt: 1}, "--pad-prompt 1 is smaller than a prompt of 2 tokens (rollout r0)"},
		{TensorOptions{BatchMultiple: -1}, "negative"},
	} {
		if _, err := WriteSafetensors(&bytes.Buffer{}, tensorSamples(), tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

// TestTensorsBatchMultiple: 2 samples, --batch-multiple 4 appends 2 rows of
// pad ids with every mask and float 0, marked padding in the metadata.
func TestTensorsBatchMultiple(t *testing.T) {
	got, _, meta, st := readTensors(t, tensorSamples(), TensorOptions{PadID: 9, BatchMultiple: 4})
	if st != (TensorStats{Rows: 4, PaddingRows: 2, PromptLen: 2, ResponseLen: 3}) {
		t.Fatalf("stats %+v", st)
	}
	want := map[string]string{
		"prompts":            "[4 2] [5 6 9 4 9 9 9 9]",
		"input_ids":          "[4 5] [5 6 7 8 9 9 4 3 9 9 9 9 9 9 9 9 9 9 9 9]",
		"attention_mask":     "[4 5] [1 1 1 1 1 0 1 1 0 0 0 0 0 0 0 0 0 0 0 0]",
		"position_ids":       "[4 5] [0 1 2 3 4 0 0 1 1 1 0 0 0 0 0 0 0 0 0 0]",
		"response_mask":      "[4 3] [1 0 1 1 0 0 0 0 0 0 0 0]",
		"advantages":         "[4 3] [0.5 0 0.5 -0.5 0 0 0 0 0 0 0 0]",
		"token_level_scores": "[4 3] [0 0 2 -1 0 0 0 0 0 0 0 0]",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %s want %s", k, got[k], w)
		}
	}
	if meta["padding"] != `[false,false,true,true]` || meta["uid"] != `["t","u","",""]` || meta["rollout_id"] != `["r0","r1","",""]` || meta["sequence_ids"] != `[[1,2],[3],[],[]]` {
		t.Errorf("metadata %v", meta)
	}
	checkMetaTypes(t, meta, 4)
	// Already a multiple, or off: no rows added.
	for _, m := range []int{0, 1, 2} {
		if _, _, _, st := readTensors(t, tensorSamples(), TensorOptions{BatchMultiple: m}); st.PaddingRows != 0 || st.Rows != 2 {
			t.Errorf("batch multiple %d: %+v", m, st)
		}
	}
	if _, _, _, st := readTensors(t, tensorSamples(), TensorOptions{BatchMultiple: 3}); st.PaddingRows != 1 || st.Rows != 3 {
		t.Errorf("batch multiple 3: %+v", st)
	}
}

// TestTensorsLogprobs: OmitLogprobs leaves rollout_log_probs out of the
// file; keeping them refuses a sample without logprobs.
func TestTensorsLogprobs(t *testing.T) {
	samples := tensorSamples()
	samples[1].HasLogprobs, samples[1].Logprobs = false, nil
	got, _, meta, _ := readTensors(t, samples, TensorOptions{OmitLogprobs: true})
	if _, ok := got["rollout_log_probs"]; ok || len(got) != 10 {
		t.Errorf("omit: tensors %v", got)
	}
	if meta["has_logprobs"] != `[true,false]` {
		t.Errorf("has_logprobs %s", meta["has_logprobs"])
	}
	samples[1].Logprobs = []float32{0}
	if _, err := WriteSafetensors(&bytes.Buffer{}, samples, TensorOptions{}); err == nil || !strings.Contains(err.Error(), "--logprobs omit") {
		t.Errorf("sample without logprobs kept: %v", err)
	}
}
