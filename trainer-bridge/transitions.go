// Package bridge is the trainer's side of rollgate: it reads captured calls
// and rewards from a store and turns them into training samples.
//
// This first piece builds LightningRL-style transitions (docs/trainers.md "Samples"):
// one sample per (call, choice) with the engine's exact token ids and the
// rollout's final reward. Calls that errored or whose token ids were not
// verified are excluded and counted, never trained on silently.
package bridge

import (
	"context"
	"fmt"
	"sort"

	"github.com/rollgate/rollgate/export"
)

// Transition is one training sample: the prompt and response ids of one call
// choice, with the reward credited to it.
type Transition struct {
	RolloutID        string
	AttemptID        string
	TaskID           string
	AgentName        string
	SequenceID       uint64
	ChoiceIndex      uint32
	PolicyVersion    string
	PromptTokenIDs   []uint32
	ResponseTokenIDs []uint32
	ResponseLogprobs []float32
	Reward           float64
}

// TransitionStats counts what Transitions left out and why.
type TransitionStats struct {
	Calls          int // llm_calls rows read
	Used           int // rows turned into transitions
	Errored        int // rows with an error or a non-2xx status
	UnverifiedIDs  int // rows whose token_source is not a trusted one
	NoReward       int // rollouts read without an episode reward (their rows are skipped)
	TokenSourceMix int // rows from sources other than "engine" that were used
}

// trusted token sources a transition may be built from.
var trusted = map[string]bool{export.TokenSourceEngine: true, export.TokenSourceTokenize: true}

// Transitions reads one rollout (its latest attempt when attemptID is empty)
// and returns a transition per successful call choice, each credited with
// the rollout's final episode reward named rewardName ("" = "primary"):
// the last such reward reported, as Agent Lightning does.
func Transitions(ctx context.Context, store export.Store, rolloutID, attemptID, rewardName string) ([]Transition, TransitionStats, error) {
	var st TransitionStats
	if rewardName == "" {
		rewardName = "primary"
	}
	d, err := store.Rollout(ctx, rolloutID)
	if err != nil {
		return nil, st, fmt.Errorf("bridge: reading rollout %s: %w", rolloutID, err)
	}
	if attemptID == "" {
		attemptID = latestAttempt(d)
	}
	reward, ok := finalReward(d.Rewards, attemptID, rewardName)
	calls := make([]export.Call, 0, len(d.Calls))
	for _, c := range d.Calls {
		if c.AttemptID == attemptID {
			calls = append(calls, c)
		}
	}
	st.Calls = len(calls)
	if !ok {
		st.NoReward = 1
		return nil, st, nil
	}
	sort.Slice(calls, func(i, j int) bool {
		if calls[i].SequenceID != calls[j].SequenceID {
			return calls[i].SequenceID < calls[j].SequenceID
		}
		return calls[i].ChoiceIndex < calls[j].ChoiceIndex
	})
	out := make([]Transition, 0, len(calls))
	for _, c := range calls {
		switch {
		case c.Error != "" || c.HTTPStatus >= 300:
			st.Errored++
			continue
		case !trusted[c.TokenSource] || len(c.ResponseTokenIDs) == 0 || len(c.PromptTokenIDs) == 0:
			st.UnverifiedIDs++
			continue
		}
		if c.TokenSource != export.TokenSourceEngine {
			st.TokenSourceMix++
		}
		out = append(out, Transition{
			RolloutID: c.RolloutID, AttemptID: c.AttemptID, TaskID: c.TaskID, AgentName: c.AgentName,
			SequenceID: c.SequenceID, ChoiceIndex: c.ChoiceIndex, PolicyVersion: c.PolicyVersion,
			PromptTokenIDs: c.PromptTokenIDs, ResponseTokenIDs: c.ResponseTokenIDs,
			ResponseLogprobs: c.ResponseLogprobs, Reward: reward,
		})
	}
	st.Used = len(out)
	return out, st, nil
}

// latestAttempt is the attempt updated last, or the one of the last call.
func latestAttempt(d *export.RolloutDetail) string {
	var best export.Rollout
	for _, a := range d.Attempts {
		if a.UpdatedUnixNano >= best.UpdatedUnixNano {
			best = a
		}
	}
	if best.AttemptID != "" {
		return best.AttemptID
	}
	var seq uint64
	var id string
	for _, c := range d.Calls {
		if c.StartTimeUnixNano >= seq {
			seq, id = c.StartTimeUnixNano, c.AttemptID
		}
	}
	return id
}

// finalReward is the last episode-level reward (sequence_id 0) with the
// given name for the attempt; rewards posted without an attempt id count
// for every attempt.
func finalReward(rs []export.Reward, attemptID, name string) (float64, bool) {
	var v float64
	var at uint64
	found := false
	for _, r := range rs {
		if r.SequenceID != 0 || r.Name != name || (r.AttemptID != "" && r.AttemptID != attemptID) {
			continue
		}
		if !found || r.TimeUnixNano >= at {
			v, at, found = r.Value, r.TimeUnixNano, true
		}
	}
	return v, found
}
