package bridge

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/rollgate/rollgate/trainer-bridge/safetensors"
)

// TensorOptions shape a padded batch.
type TensorOptions struct {
	PadID int64 // id written on padding positions
	// PadPrompt and PadResponse fix P and R (0 = the longest prompt and
	// response of the batch). A sample longer than a fixed length is an
	// error, never cut: verl concatenates batches only when they share P and R.
	PadPrompt, PadResponse int
	// BatchMultiple (> 1) appends padding rows until the row count is a
	// multiple of it (0 or 1 = off).
	BatchMultiple int
	// OmitLogprobs leaves rollout_log_probs out of the file. When false,
	// every sample must carry its sampling logprobs (Sample.HasLogprobs):
	// zeros would read as log p = 0.
	OmitLogprobs bool
}

// TensorStats describe a padded batch.
type TensorStats struct {
	Rows        int // B, padding rows included
	PaddingRows int // rows appended for BatchMultiple
	PromptLen   int // P
	ResponseLen int // R
}

// TensorFormat is the rollgate_format metadata value: the version of the
// key layout below.
const TensorFormat = "1"

// Tensors pads samples into verl's DataProto tensors (docs/verl.md "Keys"):
// prompts left-padded, responses right-padded, o.PadID on padding.
// Ids and masks are int64, the rest float32; B counts padding rows.
//
//	prompts [B,P], responses [B,R], input_ids [B,P+R] = prompts ++ responses
//	attention_mask [B,P+R]: 1 on real tokens (observation tokens included)
//	position_ids [B,P+R]: cumsum(attention_mask) - 1, clipped at 0
//	response_mask [B,R]: 1 on generated tokens, 0 on observations and padding
//	rollout_log_probs [B,R]: sampling logprobs, 0 off the response mask
//	  (absent when o.OmitLogprobs)
//	token_level_scores [B,R]: the sample reward (scalar credited return) on
//	  its last response token, 0 elsewhere (verl's reward step output)
//	token_level_rewards [B,R]: equal to token_level_scores (no KL in reward)
//	advantages [B,R]: the sample advantage times response_mask
//	returns [B,R]: equal to advantages (verl's outcome estimators: GRPO,
//	  RLOO, REINFORCE++-baseline)
//
// The metadata (safetensors __metadata__) holds the non-tensor columns as
// JSON arrays of one entry per row: uid (the group key), rollout_id,
// attempt_id, task_id, agent_name, policy_version, token_source (strings),
// choice_index (numbers), sequence_ids (arrays of numbers: the calls merged
// into the row), has_logprobs, truncated (response cut at the maximum),
// trimmed (off-policy TruncTrim), padding (a BatchMultiple row) and
// mixed_policy (more than one policy version sampled the response:
// Sample.MixedPolicy) (booleans). Padding rows hold PadID everywhere, 0 in every mask and
// float, "" in the strings, [] as sequence_ids, has_logprobs true (they
// generate no token), padding true. One key is not an array:
// rollgate_format, the string TensorFormat.
func Tensors(samples []*Sample, o TensorOptions) ([]safetensors.Tensor, map[string]string, TensorStats, error) {
	var st TensorStats
	if o.PadPrompt < 0 || o.PadResponse < 0 || o.BatchMultiple < 0 {
		return nil, nil, st, fmt.Errorf("bridge: negative padding (prompt %d, response %d, batch multiple %d)", o.PadPrompt, o.PadResponse, o.BatchMultiple)
	}
	p, r := o.PadPrompt, o.PadResponse
	for i, s := range samples {
		if len(s.ResponseMask) != len(s.Response) || (!o.OmitLogprobs && len(s.Logprobs) != len(s.Response)) {
			return nil, nil, st, fmt.Errorf("bridge: sample %d (%s): %d response ids, %d mask, %d logprobs", i, s.RolloutID, len(s.Response), len(s.ResponseMask), len(s.Logprobs))
		}
		if !o.OmitLogprobs && !s.HasLogprobs {
			return nil, nil, st, fmt.Errorf("bridge: sample %d (rollout %s) has no sampling logprobs, rollout_log_probs would hold zeros read as log p = 0; leave them out (--logprobs omit) or exclude such samples", i, s.RolloutID)
		}
		if o.PadPrompt > 0 && len(s.Prompt) > o.PadPrompt {
			return nil, nil, st, fmt.Errorf("bridge: --pad-prompt %d is smaller than a prompt of %d tokens (rollout %s); raise it or set --max-prompt", o.PadPrompt, len(s.Prompt), s.RolloutID)
		}
		if o.PadResponse > 0 && len(s.Response) > o.PadResponse {
			return nil, nil, st, fmt.Errorf("bridge: --pad-response %d is smaller than a response of %d tokens (rollout %s); raise it or set --max-response", o.PadResponse, len(s.Response), s.RolloutID)
		}
		if o.PadPrompt == 0 {
			p = max(p, len(s.Prompt))
		}
		if o.PadResponse == 0 {
			r = max(r, len(s.Response))
		}
	}
	n := len(samples)
	b := n
	if m := o.BatchMultiple; m > 1 && b%m != 0 {
		b += m - b%m
	}
	st = TensorStats{Rows: b, PaddingRows: b - n, PromptLen: p, ResponseLen: r}
	l := p + r
	prompts, responses := make([]int64, b*p), make([]int64, b*r)
	inputIDs, attn, pos := make([]int64, b*l), make([]int64, b*l), make([]int64, b*l)
	respMask := make([]int64, b*r)
	logprobs, scores, adv := make([]float32, b*r), make([]float32, b*r), make([]float32, b*r)
	for i := range prompts {
		prompts[i] = o.PadID
	}
	for i := range responses {
		responses[i] = o.PadID
	}
	for i := range inputIDs {
		inputIDs[i] = o.PadID
	}
	var (
		uid, rollout, attempt, task, agent, pv, src = make([]string, b), make([]string, b), make([]string, b), make([]string, b), make([]string, b), make([]string, b), make([]string, b)
		choice                                      = make([]uint32, b)
		seqs                                        = make([][]uint64, b)
		hasLP, truncated, trimmed, padding          = make([]bool, b), make([]bool, b), make([]bool, b), make([]bool, b)
		mixed                                       = make([]bool, b)
	)
	for i := n; i < b; i++ {
		seqs[i], hasLP[i], padding[i] = []uint64{}, true, true
	}
	for i, s := range samples {
		pad := p - len(s.Prompt)
		for j, id := range s.Prompt {
			prompts[i*p+pad+j], inputIDs[i*l+pad+j], attn[i*l+pad+j] = int64(id), int64(id), 1
		}
		for j, id := range s.Response {
			responses[i*r+j], inputIDs[i*l+p+j], attn[i*l+p+j] = int64(id), int64(id), 1
			if s.ResponseMask[j] == 1 {
				respMask[i*r+j] = 1
				if !o.OmitLogprobs {
					logprobs[i*r+j] = s.Logprobs[j]
				}
				adv[i*r+j] = float32(s.Advantage)
			}
		}
		if k := len(s.Response); k > 0 {
			scores[i*r+k-1] = float32(s.Reward)
		}
		var c int64
		for j := range l {
			c += attn[i*l+j]
			pos[i*l+j] = max(c-1, 0)
		}
		uid[i], rollout[i], attempt[i], task[i], agent[i], pv[i], src[i] = s.GroupUID, s.RolloutID, s.AttemptID, s.TaskID, s.AgentName, s.PolicyVersion, s.TokenSource
		choice[i], seqs[i] = s.ChoiceIndex, s.SequenceIDs
		if seqs[i] == nil {
			seqs[i] = []uint64{}
		}
		hasLP[i], truncated[i], trimmed[i], mixed[i] = s.HasLogprobs, s.Truncated, s.Trimmed, s.MixedPolicy
	}
	md := map[string]string{"rollgate_format": TensorFormat}
	for k, v := range map[string]any{"uid": uid, "rollout_id": rollout, "attempt_id": attempt, "task_id": task,
		"agent_name": agent, "policy_version": pv, "token_source": src, "choice_index": choice, "sequence_ids": seqs,
		"has_logprobs": hasLP, "truncated": truncated, "trimmed": trimmed, "padding": padding, "mixed_policy": mixed} {
		j, err := json.Marshal(v)
		if err != nil {
			return nil, nil, st, fmt.Errorf("bridge: metadata %s: %w", k, err)
		}
		md[k] = string(j)
	}
	ts := []safetensors.Tensor{
		{Name: "prompts", Shape: []int{b, p}, I64: prompts},
		{Name: "responses", Shape: []int{b, r}, I64: responses},
		{Name: "input_ids", Shape: []int{b, l}, I64: inputIDs},
		{Name: "attention_mask", Shape: []int{b, l}, I64: attn},
		{Name: "position_ids", Shape: []int{b, l}, I64: pos},
		{Name: "response_mask", Shape: []int{b, r}, I64: respMask},
	}
	if !o.OmitLogprobs {
		ts = append(ts, safetensors.Tensor{Name: "rollout_log_probs", Shape: []int{b, r}, F32: logprobs})
	}
	ts = append(ts,
		safetensors.Tensor{Name: "token_level_scores", Shape: []int{b, r}, F32: scores},
		safetensors.Tensor{Name: "token_level_rewards", Shape: []int{b, r}, F32: append([]float32(nil), scores...)},
		safetensors.Tensor{Name: "advantages", Shape: []int{b, r}, F32: adv},
		safetensors.Tensor{Name: "returns", Shape: []int{b, r}, F32: append([]float32(nil), adv...)},
	)
	return ts, md, st, nil
}

// WriteSafetensors writes Tensors(samples, o) as one safetensors file.
func WriteSafetensors(w io.Writer, samples []*Sample, o TensorOptions) (TensorStats, error) {
	ts, md, st, err := Tensors(samples, o)
	if err != nil {
		return st, err
	}
	if err := safetensors.Write(w, ts, md); err != nil {
		return st, fmt.Errorf("bridge: %w", err)
	}
	return st, nil
}
