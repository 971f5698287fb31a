// Package advantage holds the outcome advantage estimators of docs/verl.md §3 as
// pure functions over per-sample scores grouped by a key (the task id).
//
// Conventions follow verl (trainer/ppo/core_algos.py):
//
//   - GRPO: A_i = (s_i - mean_g) / (std_g + 1e-6), std unbiased (N-1); a
//     group of one has mean 0 and std 1.
//   - Dr.GRPO: A_i = s_i - mean_g; a group of one has mean 0.
//   - RLOO: A_i = s_i - mean_{j != i} s_j = n/(n-1) * (s_i - mean_g); a group
//     of one gets A = s.
//   - REINFORCE++-baseline: x_i = s_i - mean_g (group of one: mean 0)
//     broadcast to every masked token of sample i, then whitened over all
//     masked tokens of the batch: (x - mu) / sqrt(var + 1e-8), var unbiased.
//   - None: A_i = s_i.
//
// A "sample" is whatever unit the caller chooses: a transition
// (transition-level) or a whole rollout whose advantage is then broadcast to
// its transitions (rollout-level).
package advantage

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Estimator names an advantage estimator.
type Estimator string

// The estimators.
const (
	GRPO        Estimator = "grpo"
	DrGRPO      Estimator = "drgrpo"
	RLOO        Estimator = "rloo"
	ReinforcePP Estimator = "reinforce++-baseline"
	None        Estimator = "none"
)

// Epsilons as verl uses them.
const (
	GRPOEps   = 1e-6 // added to the group std
	WhitenEps = 1e-8 // added to the batch variance before the square root
)

// Parse turns a name (case-insensitive; "dr_grpo", "dr.grpo", "reinforce_plus_plus_baseline" accepted) into an Estimator.
func Parse(s string) (Estimator, error) {
	switch strings.NewReplacer("_", "", ".", "", "-", "").Replace(strings.ToLower(s)) {
	case "grpo":
		return GRPO, nil
	case "drgrpo":
		return DrGRPO, nil
	case "rloo":
		return RLOO, nil
	case "reinforce++baseline", "reinforceplusplusbaseline", "reinforcebaseline":
		return ReinforcePP, nil
	case "none", "":
		return None, nil
	}
	return "", fmt.Errorf("advantage: unknown estimator %q (grpo, drgrpo, rloo, reinforce++-baseline, none)", s)
}

// Input is a batch of samples: one score per sample, its group key, and
// (for REINFORCE++-baseline only) its number of masked response tokens.
type Input struct {
	Scores []float64
	Groups []string
	// GroupIndex, when Groups is nil, gives each sample's group as a small
	// integer instead (4 bytes per sample rather than a string header's 16:
	// what a batch of millions keeps in memory).
	GroupIndex []int32
	// Tokens[i] is the number of response tokens with mask 1 of sample i
	// (the weight of the sample in the batch whitening). Only
	// REINFORCE++-baseline reads it; nil means 1 per sample.
	Tokens []int
}

// Options tune Compute.
type Options struct {
	// DropZeroVariance drops every group of two or more samples whose scores
	// are all equal (they carry no signal). Groups of one are kept, as
	// verl's DAPO filter does. Dropping happens before any batch statistic.
	DropZeroVariance bool
}

// Result is one advantage per sample; Keep[i] is false for dropped samples
// (their advantage is 0).
type Result struct {
	Advantages []float64
	Keep       []bool
	// DroppedGroups is the number of groups dropped for zero variance.
	DroppedGroups int
}

// Compute returns the advantages of in under estimator e.
func Compute(e Estimator, in Input, opt Options) (*Result, error) {
	n := len(in.Scores)
	groupOf := func(i int) int32 { return in.GroupIndex[i] }
	if in.Groups != nil || in.GroupIndex == nil {
		if len(in.Groups) != n {
			return nil, fmt.Errorf("advantage: %d scores but %d group keys", n, len(in.Groups))
		}
		ix := make([]int32, n)
		seen := map[string]int32{}
		for i, g := range in.Groups {
			k, ok := seen[g]
			if !ok {
				k = int32(len(seen))
				seen[g] = k
			}
			ix[i] = k
		}
		groupOf = func(i int) int32 { return ix[i] }
	} else if len(in.GroupIndex) != n {
		return nil, fmt.Errorf("advantage: %d scores but %d group indices", n, len(in.GroupIndex))
	}
	if in.Tokens != nil && len(in.Tokens) != n {
		return nil, fmt.Errorf("advantage: %d scores but %d token counts", n, len(in.Tokens))
	}
	for i, s := range in.Scores {
		if math.IsNaN(s) || math.IsInf(s, 0) {
			return nil, fmt.Errorf("advantage: score %d is %v", i, s)
		}
	}
	res := &Result{Advantages: make([]float64, n), Keep: make([]bool, n)}
	// Group members in input order.
	members := map[int32][]int{}
	var order []int32
	for i := range n {
		g := groupOf(i)
		if _, ok := members[g]; !ok {
			order = append(order, g)
		}
		members[g] = append(members[g], i)
	}
	var scores, adv []float64
	for _, g := range order {
		idx := members[g]
		scores, adv = scores[:0], adv[:0]
		for _, i := range idx {
			scores = append(scores, in.Scores[i])
			adv = append(adv, 0)
		}
		dropped, err := Group(e, scores, adv, opt)
		if err != nil {
			return nil, err
		}
		if dropped {
			res.DroppedGroups++
			continue
		}
		for k, i := range idx {
			res.Keep[i], res.Advantages[i] = true, adv[k]
		}
	}
	if e == ReinforcePP {
		var w Whitener
		for i, a := range res.Advantages {
			if res.Keep[i] {
				w.Add(a, weight(in.Tokens, i))
			}
		}
		if err := w.Mean(); err != nil {
			return nil, err
		}
		for i, a := range res.Advantages {
			if res.Keep[i] {
				w.AddDeviation(a, weight(in.Tokens, i))
			}
		}
		w.Scale()
		for i, a := range res.Advantages {
			if res.Keep[i] {
				res.Advantages[i] = w.Apply(a, weight(in.Tokens, i))
			}
		}
	}
	return res, nil
}

// Group computes into adv (as long as scores) the advantages of one group's
// scores, in the group's order; with REINFORCE++-baseline they are the
// centred scores, whitened over the batch by a Whitener afterwards. dropped
// says the group was dropped for zero variance (its advantages stay 0).
// Compute is Group over each group of a batch; callers that see a batch
// group by group (the trainer bridge, with more samples than it keeps in
// memory) call it directly.
func Group(e Estimator, scores, adv []float64, opt Options) (dropped bool, err error) {
	switch e {
	case GRPO, DrGRPO, ReinforcePP, RLOO, None:
	default:
		return false, fmt.Errorf("advantage: unknown estimator %q", e)
	}
	for i, s := range scores {
		if math.IsNaN(s) || math.IsInf(s, 0) {
			return false, fmt.Errorf("advantage: score %d of the group is %v", i, s)
		}
	}
	if opt.DropZeroVariance && len(scores) > 1 && !slices.ContainsFunc(scores[1:], func(s float64) bool { return s != scores[0] }) {
		return true, nil
	}
	mean, std := groupStats(scores)
	k := float64(len(scores))
	for i, s := range scores {
		switch e {
		case GRPO:
			adv[i] = (s - mean) / (std + GRPOEps)
		case DrGRPO, ReinforcePP:
			adv[i] = s - mean
		case RLOO:
			if len(scores) > 1 {
				adv[i] = k / (k - 1) * (s - mean)
			} else {
				adv[i] = s
			}
		case None:
			adv[i] = s
		}
	}
	return false, nil
}

// groupStats is verl's group mean and unbiased std; a group of one has mean 0, std 1.
func groupStats(scores []float64) (mean, std float64) {
	if len(scores) == 1 {
		return 0, 1
	}
	for _, s := range scores {
		mean += s
	}
	mean /= float64(len(scores))
	var ss float64
	for _, s := range scores {
		d := s - mean
		ss += d * d
	}
	return mean, math.Sqrt(ss / float64(len(scores)-1))
}

// Whitener is REINFORCE++-baseline's batch whitening, verl's masked_whiten
// over the kept samples, each weighted by its masked token count: mu =
// masked mean, var = masked variance times N/(N-1), x' = (x - mu) /
// sqrt(var + 1e-8). It takes the batch in three passes, in the same order
// each time: Add every kept advantage, Mean; AddDeviation every one,
// Scale; then Apply to each.
type Whitener struct {
	n, sum, mu, ss, inv float64
	empty               bool
}

// Add counts one kept advantage a of a sample with w masked tokens.
func (x *Whitener) Add(a, w float64) {
	x.n += w
	x.sum += w * a
}

// Mean ends the first pass: an error when the batch has fewer than 2
// masked tokens (but some).
func (x *Whitener) Mean() error {
	if x.n == 0 {
		x.empty = true // nothing kept
		return nil
	}
	if x.n < 2 {
		return fmt.Errorf("advantage: REINFORCE++-baseline whitening needs at least 2 masked tokens in the batch, got %v", x.n)
	}
	x.mu = x.sum / x.n
	return nil
}

// AddDeviation counts one kept advantage's squared deviation from the mean.
func (x *Whitener) AddDeviation(a, w float64) {
	d := a - x.mu
	x.ss += w * d * d
}

// Scale ends the second pass.
func (x *Whitener) Scale() {
	v := x.ss / x.n * (x.n / (x.n - 1))
	x.inv = 1 / math.Sqrt(v+WhitenEps)
}

// Apply returns the whitened advantage a of a kept sample with w masked
// tokens (0 without any: verl multiplies by the response mask).
func (x *Whitener) Apply(a, w float64) float64 {
	if x.empty {
		return a
	}
	if w == 0 {
		return 0
	}
	return (a - x.mu) * x.inv
}

func weight(tokens []int, i int) float64 {
	if tokens == nil {
		return 1
	}
	return float64(tokens[i])
}
