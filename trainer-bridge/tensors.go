package bridge

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/rollgate/rollgate/trainer-bridge/safetensors"
)

// Tensors pads samples into verl's DataProto tensors (TRAINERS.md "verl
// batch"): prompts left-padded to the longest prompt, responses
// right-padded to the longest response, padID on padding.
//
//	prompts [B,P], responses [B,R], input_ids [B,P+R] (int64)
//	attention_mask [B,P+R]: 1 on real tokens (observation tokens included)
//	position_ids [B,P+R]: cumsum(attention_mask) - 1, clipped at 0
//	response_mask [B,R]: 1 on generated tokens, 0 on observations and padding
//	rollout_log_probs [B,R] (float32, 0 off the response mask)
//	token_level_rewards [B,R]: the sample reward on its last response token
//	advantages [B,R]: the sample advantage times response_mask
//
// The metadata holds the non-tensor columns as JSON arrays: uid (the group
// key), rollout_id, attempt_id, task_id, agent_name, policy_version.
func Tensors(samples []*Sample, padID int64) ([]safetensors.Tensor, map[string]string, error) {
	b, p, r := len(samples), 0, 0
	for _, s := range samples {
		p, r = max(p, len(s.Prompt)), max(r, len(s.Response))
	}
	l := p + r
	prompts, responses := make([]int64, b*p), make([]int64, b*r)
	inputIDs, attn, pos := make([]int64, b*l), make([]int64, b*l), make([]int64, b*l)
	respMask := make([]int64, b*r)
	logprobs, rewards, adv := make([]float32, b*r), make([]float32, b*r), make([]float32, b*r)
	meta := map[string][]string{}
	for i, s := range samples {
		if len(s.ResponseMask) != len(s.Response) || len(s.Logprobs) != len(s.Response) {
			return nil, nil, fmt.Errorf("bridge: sample %d (%s): %d response ids, %d mask, %d logprobs", i, s.RolloutID, len(s.Response), len(s.ResponseMask), len(s.Logprobs))
		}
		pad := p - len(s.Prompt)
		for j := range p {
			v := padID
			if j >= pad {
				v = int64(s.Prompt[j-pad])
				attn[i*l+j] = 1
			}
			prompts[i*p+j], inputIDs[i*l+j] = v, v
		}
		for j := range r {
			v := padID
			if j < len(s.Response) {
				v = int64(s.Response[j])
				attn[i*l+p+j] = 1
				if s.ResponseMask[j] == 1 {
					respMask[i*r+j] = 1
					logprobs[i*r+j] = s.Logprobs[j]
					adv[i*r+j] = float32(s.Advantage)
				}
			}
			responses[i*r+j], inputIDs[i*l+p+j] = v, v
		}
		if n := len(s.Response); n > 0 {
			rewards[i*r+n-1] = float32(s.Reward)
		}
		var c int64
		for j := range l {
			c += attn[i*l+j]
			pos[i*l+j] = max(c-1, 0)
		}
		meta["uid"] = append(meta["uid"], s.GroupUID)
		meta["rollout_id"] = append(meta["rollout_id"], s.RolloutID)
		meta["attempt_id"] = append(meta["attempt_id"], s.AttemptID)
		meta["task_id"] = append(meta["task_id"], s.TaskID)
		meta["agent_name"] = append(meta["agent_name"], s.AgentName)
		meta["policy_version"] = append(meta["policy_version"], s.PolicyVersion)
	}
	md := map[string]string{}
	for k, v := range meta {
		j, err := json.Marshal(v)
		if err != nil {
			return nil, nil, fmt.Errorf("bridge: metadata %s: %w", k, err)
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
		{Name: "rollout_log_probs", Shape: []int{b, r}, F32: logprobs},
		{Name: "token_level_rewards", Shape: []int{b, r}, F32: rewards},
		{Name: "advantages", Shape: []int{b, r}, F32: adv},
	}
	return ts, md, nil
}

// WriteSafetensors writes Tensors(samples, padID) as one safetensors file.
func WriteSafetensors(w io.Writer, samples []*Sample, padID int64) error {
	ts, md, err := Tensors(samples, padID)
	if err != nil {
		return err
	}
	if err := safetensors.Write(w, ts, md); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	return nil
}
