package bridge

import (
	"fmt"
	"slices"

	"github.com/rollgate/rollgate/export"
)

// Assembly modes.
const (
	ModeTransitions  = "transitions"  // one sample per (call, choice), LightningRL
	ModeTrajectories = "trajectories" // consecutive turns merged while prefixes hold
)

// Truncation policies.
const (
	// TruncCut (default) cuts a response longer than MaxResponse at the
	// limit (ids, mask, logprobs) and keeps the sample, marked Truncated, as
	// verl's agent loop and Agent Lightning do; a prompt longer than
	// MaxPrompt excludes the sample (prompt_too_long): the context the
	// policy saw is never trimmed.
	TruncCut = "cut"
	// TruncDrop drops samples over either limit (truncated).
	TruncDrop = "drop"
	// TruncTrim is an explicit off-policy option: it keeps the last
	// MaxPrompt prompt tokens (a context the policy never saw) and the first
	// MaxResponse response tokens, marking the sample Trimmed.
	TruncTrim = "trim"
)

// Break classes counted in Stats.Breaks (trajectory mode).
const (
	BreakTemplate = "template"       // the new prompt diverges only in the last 2 tokens of the previous response (end-of-turn markup)
	BreakRetoken  = "retokenization" // the previous prompt is kept but the previous response was re-tokenized or edited
	BreakContext  = "context_edit"   // earlier context changed (truncation, summarisation, another system prompt)
	// BreakMixedSources: the call's ids and the trajectory's come from
	// different provenances, one of them retokenized (Options.Retokenize):
	// such turns are never merged (tokenize.Turn.MixedSources).
	BreakMixedSources = "mixed_sources"
)

// Sample is one training row. In trajectory mode Response holds every turn
// after the first prompt: generated tokens (mask 1, with logprobs) and
// observation tokens (mask 0, logprob 0).
type Sample struct {
	RolloutID     string
	AttemptID     string
	TaskID        string
	AgentName     string
	PolicyVersion string
	ChoiceIndex   uint32
	SequenceIDs   []uint64 // the calls merged into this sample, in order
	Prompt        []uint32
	Response      []uint32
	ResponseMask  []uint8
	Logprobs      []float32
	Reward        float64 // the credited return (a scalar on the last response token)
	Advantage     float64
	GroupUID      string
	Trimmed       bool // the prompt or response was trimmed by TruncTrim (off-policy)
	// Truncated: the response was cut at Options.MaxResponse (ids, mask and
	// logprobs), as verl's agent loop does; the reward sits on the last kept token.
	Truncated bool
	// HasLogprobs: every generated token (mask 1) carries the engine's
	// sampling logprob. When false, Logprobs holds zeros that are not
	// logprobs; writers must not present them as such.
	HasLogprobs bool
	// TokenSource is where the ids came from (export.TokenSource*): engine,
	// tokenize, or retokenized (rebuilt by Options.Retokenize). A trajectory
	// never mixes retokenized calls with others; one that merges engine and
	// tokenize calls is marked tokenize.
	TokenSource string
	// MixedPolicy: more than one policy version sampled the response's
	// tokens (a generation resumed after a weight update, or merged turns
	// served by different versions); PolicyVersion is the latest (mixed.go).
	MixedPolicy bool
}

// assemble builds samples from the kept calls of one attempt, sorted by
// sequence id then choice. st counts breaks.
func assemble(mode string, calls []export.Call, st *Stats) ([]*Sample, error) {
	switch mode {
	case ModeTransitions, "":
		out := make([]*Sample, 0, len(calls))
		for _, c := range calls {
			out = append(out, newSample(c))
		}
		return out, nil
	case ModeTrajectories:
	default:
		return nil, fmt.Errorf("bridge: unknown mode %q (%s, %s)", mode, ModeTransitions, ModeTrajectories)
	}
	var open []*Sample              // trajectories that may still grow
	var full [][]uint32             // full[i] = prompt+response ids of open[i]
	lastOfAgent := map[string]int{} // agent -> index in open of its most recent trajectory
	var out []*Sample
	for _, c := range calls {
		best := -1
		for i, ids := range full {
			if open[i].AgentName == c.AgentName && sameClass(open[i].TokenSource, c.TokenSource) && open[i].SequenceIDs[len(open[i].SequenceIDs)-1] != c.SequenceID && hasPrefix(c.PromptTokenIDs, ids) && (best < 0 || len(ids) > len(full[best])) {
				best = i
			}
		}
		if best < 0 {
			// A sibling choice of the same request starts its own sample without a break.
			if j, ok := lastOfAgent[c.AgentName]; ok && open[j].SequenceIDs[len(open[j].SequenceIDs)-1] != c.SequenceID {
				if !sameClass(open[j].TokenSource, c.TokenSource) {
					st.Breaks[BreakMixedSources]++
				} else {
					st.Breaks[classify(open[j], full[j], c.PromptTokenIDs)]++
				}
			}
			s := newSample(c)
			out = append(out, s)
			open = append(open, s)
			full = append(full, concat(c.PromptTokenIDs, c.ResponseTokenIDs))
			lastOfAgent[c.AgentName] = len(open) - 1
			continue
		}
		s := open[best]
		obs := c.PromptTokenIDs[len(full[best]):]
		s.Response = append(s.Response, obs...)
		s.ResponseMask = append(s.ResponseMask, make([]uint8, len(obs))...)
		s.Logprobs = append(s.Logprobs, make([]float32, len(obs))...)
		s.Response = append(s.Response, c.ResponseTokenIDs...)
		s.ResponseMask = append(s.ResponseMask, ones(len(c.ResponseTokenIDs))...)
		s.Logprobs = append(s.Logprobs, logprobs(c)...)
		s.HasLogprobs = s.HasLogprobs && hasLogprobs(c)
		s.SequenceIDs = append(s.SequenceIDs, c.SequenceID)
		if c.TokenSource == export.TokenSourceTokenize {
			s.TokenSource = export.TokenSourceTokenize // the weaker provenance of the two verified ones
		}
		if last, mixed := callPolicy(&c); last != s.PolicyVersion || mixed {
			s.MixedPolicy = true
			s.PolicyVersion = last // the latest policy that generated part of it
		}
		full[best] = concat(c.PromptTokenIDs, c.ResponseTokenIDs)
		lastOfAgent[c.AgentName] = best
		st.Merged++
	}
	return out, nil
}

func newSample(c export.Call) *Sample {
	version, mixed := callPolicy(&c)
	return &Sample{RolloutID: c.RolloutID, AttemptID: c.AttemptID, TaskID: c.TaskID, AgentName: c.AgentName,
		PolicyVersion: version, MixedPolicy: mixed, ChoiceIndex: c.ChoiceIndex, SequenceIDs: []uint64{c.SequenceID},
		Prompt: c.PromptTokenIDs, Response: slices.Clip(c.ResponseTokenIDs),
		ResponseMask: ones(len(c.ResponseTokenIDs)), Logprobs: logprobs(c), TokenSource: c.TokenSource,
		HasLogprobs: hasLogprobs(c)}
}

// hasLogprobs reports whether the call carries one logprob per response token.
func hasLogprobs(c export.Call) bool {
	return len(c.ResponseTokenIDs) > 0 && len(c.ResponseLogprobs) == len(c.ResponseTokenIDs)
}

// sameClass reports whether ids of the two token sources may be merged into
// one sequence: retokenized ids only with retokenized ones.
func sameClass(a, b string) bool {
	return (a == export.TokenSourceRetokenized) == (b == export.TokenSourceRetokenized)
}

// logprobs are the call's response logprobs, zeros when missing or of the wrong length.
// A sample's response and logprobs are the call's arrays, not copies,
// their capacity clipped: a trajectory's next turn appended to them gets
// memory of its own, and nothing writes into them in place.
func logprobs(c export.Call) []float32 {
	if len(c.ResponseLogprobs) == len(c.ResponseTokenIDs) {
		return slices.Clip(c.ResponseLogprobs)
	}
	return make([]float32, len(c.ResponseTokenIDs))
}

// classify says why prompt does not extend the trajectory whose ids are full.
func classify(s *Sample, full, prompt []uint32) string {
	n := 0
	for n < len(full) && n < len(prompt) && full[n] == prompt[n] {
		n++
	}
	switch {
	case n >= len(full)-2:
		return BreakTemplate
	case n >= len(full)-lastTurnLen(s): // the previous call's whole prompt is kept
		return BreakRetoken
	}
	return BreakContext
}

// lastTurnLen is the length of the last generated run of s (mask-1 tail).
func lastTurnLen(s *Sample) int {
	n := 0
	for i := len(s.ResponseMask) - 1; i >= 0 && s.ResponseMask[i] == 1; i-- {
		n++
	}
	return n
}

func hasPrefix(s, prefix []uint32) bool {
	if len(prefix) > len(s) {
		return false
	}
	for i, v := range prefix {
		if s[i] != v {
			return false
		}
	}
	return true
}

func concat(a, b []uint32) []uint32 {
	out := make([]uint32, 0, len(a)+len(b))
	return append(append(out, a...), b...)
}

func ones(n int) []uint8 {
	m := make([]uint8, n)
	for i := range m {
		m[i] = 1
	}
	return m
}

// truncate applies the policy to s. It returns the exclusion reason when s
// is left out (ExclTruncDropped, ExclPromptTooLong), else "".
func truncate(s *Sample, maxPrompt, maxResponse int, policy string) (excluded string) {
	overP := maxPrompt > 0 && len(s.Prompt) > maxPrompt
	overR := maxResponse > 0 && len(s.Response) > maxResponse
	if !overP && !overR {
		return ""
	}
	switch policy {
	case TruncDrop:
		return ExclTruncDropped
	case TruncTrim:
		if overP {
			s.Prompt = s.Prompt[len(s.Prompt)-maxPrompt:]
		}
		if overR {
			s.Response, s.ResponseMask, s.Logprobs = s.Response[:maxResponse:maxResponse], s.ResponseMask[:maxResponse:maxResponse], s.Logprobs[:maxResponse:maxResponse]
		}
		s.Trimmed = true
		return ""
	}
	if overP {
		return ExclPromptTooLong
	}
	// Cut at the limit, then back to the last generated token: the reward
	// sits on the last response token, which must be one the policy chose
	// (a trajectory cut inside an observation would put it on a masked one).
	n := maxResponse
	for n > 0 && s.ResponseMask[n-1] == 0 {
		n--
	}
	if n == 0 {
		return ExclTruncDropped
	}
	s.Response, s.ResponseMask, s.Logprobs = s.Response[:n:n], s.ResponseMask[:n:n], s.Logprobs[:n:n]
	s.Truncated = true
	return ""
}
