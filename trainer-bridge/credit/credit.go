// Package credit spreads a rollout's rewards over its calls (docs/trainers.md
// "Credit over the calls of a rollout"). The calls of one rollout are given in order
// (sequence id); the episode reward R sits on the last call and each call t
// may carry a process reward p_t (per-call rewards from the rewards API,
// sequence_id > 0, plus automatic intermediate rewards). The per-step reward
// is r_t = p_t + [t = last] * R.
//
//   - Identical (LightningRL): G_t = R + p_t — every call gets the episode
//     reward, its own process reward on top.
//   - Discounted: G_t = sum_{k>=t} gamma^(k-t) r_k.
//   - LastOnly: G_t = r_t — the episode reward only on the last call.
//
// Episode returns a rollout's undiscounted return R + sum_t p_t (Agent-R1),
// the score of a rollout-level advantage.
package credit

import (
	"fmt"
	"strings"
)

// Mode is a credit-assignment rule.
type Mode string

// The modes.
const (
	Identical  Mode = "identical"
	Discounted Mode = "discounted"
	LastOnly   Mode = "last"
)

// ParseMode accepts identical, discounted, last (or last-call-only).
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "identical", "":
		return Identical, nil
	case "discounted":
		return Discounted, nil
	case "last", "last-call-only", "last_call_only", "lastonly":
		return LastOnly, nil
	}
	return "", fmt.Errorf("credit: unknown mode %q (identical, discounted, last)", s)
}

// Assign returns the return of each of the n calls of one rollout, given the
// episode reward and the process rewards (process may be nil or shorter than
// n: missing entries are 0). gamma is read only by Discounted and must be in [0, 1].
func Assign(m Mode, episode float64, process []float64, gamma float64) ([]float64, error) {
	n := len(process)
	return AssignN(m, n, episode, process, gamma)
}

// AssignN is Assign for n calls with process rewards possibly shorter than n.
func AssignN(m Mode, n int, episode float64, process []float64, gamma float64) ([]float64, error) {
	if len(process) > n {
		return nil, fmt.Errorf("credit: %d process rewards for %d calls", len(process), n)
	}
	p := func(t int) float64 {
		if t < len(process) {
			return process[t]
		}
		return 0
	}
	out := make([]float64, n)
	switch m {
	case Identical:
		for t := range out {
			out[t] = episode + p(t)
		}
	case LastOnly:
		for t := range out {
			out[t] = p(t)
		}
		if n > 0 {
			out[n-1] += episode
		}
	case Discounted:
		if gamma < 0 || gamma > 1 {
			return nil, fmt.Errorf("credit: gamma %v outside [0, 1]", gamma)
		}
		var g float64
		for t := n - 1; t >= 0; t-- {
			if t == n-1 {
				g = p(t) + episode
			} else {
				g = p(t) + gamma*g
			}
			out[t] = g
		}
	default:
		return nil, fmt.Errorf("credit: unknown mode %q", m)
	}
	return out, nil
}

// Episode is the undiscounted return of a rollout: R + sum of process rewards.
func Episode(episode float64, process []float64) float64 {
	for _, p := range process {
		episode += p
	}
	return episode
}
