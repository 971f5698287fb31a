package bridge

import (
	"bytes"
	"testing"

	"github.com/rollgate/rollgate/trainer-bridge/safetensors"
)

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
//	rewards   [[0 0 2] [-1 0 0]]        advantages [[0.5 0 0.5] [-0.5 0 0]]
func TestTensors(t *testing.T) {
	samples := []*Sample{
		{RolloutID: "r0", GroupUID: "t", Prompt: []uint32{5, 6}, Response: []uint32{7, 8, 9}, ResponseMask: []uint8{1, 0, 1}, Logprobs: []float32{-1, 0, -2}, Reward: 2, Advantage: 0.5},
		{RolloutID: "r1", GroupUID: "u", Prompt: []uint32{4}, Response: []uint32{3}, ResponseMask: []uint8{1}, Logprobs: []float32{-3}, Reward: -1, Advantage: -0.5},
	}
	var buf bytes.Buffer
	if err := WriteSafetensors(&buf, samples, 0); err != nil {
		t.Fatal(err)
	}
	ts, meta, err := safetensors.Read(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, x := range ts {
		if x.I64 != nil {
			got[x.Name] = sp(x.Shape, x.I64)
		} else {
			got[x.Name] = sp(x.Shape, x.F32)
		}
	}
	want := map[string]string{
		"prompts":             "[2 2] [5 6 0 4]",
		"responses":           "[2 3] [7 8 9 3 0 0]",
		"input_ids":           "[2 5] [5 6 7 8 9 0 4 3 0 0]",
		"attention_mask":      "[2 5] [1 1 1 1 1 0 1 1 0 0]",
		"position_ids":        "[2 5] [0 1 2 3 4 0 0 1 1 1]",
		"response_mask":       "[2 3] [1 0 1 1 0 0]",
		"rollout_log_probs":   "[2 3] [-1 0 -2 -3 0 0]",
		"token_level_rewards": "[2 3] [0 0 2 -1 0 0]",
		"advantages":          "[2 3] [0.5 0 0.5 -0.5 0 0]",
	}
	if len(got) != len(want) {
		t.Fatalf("tensors %v", got)
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: got %s want %s", k, got[k], w)
		}
	}
	if meta["uid"] != `["t","u"]` || meta["rollout_id"] != `["r0","r1"]` {
		t.Errorf("meta %v", meta)
	}
	if err := WriteSafetensors(&buf, []*Sample{{Response: []uint32{1}}}, 0); err == nil {
		t.Error("sample without mask accepted")
	}
}
