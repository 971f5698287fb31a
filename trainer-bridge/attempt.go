package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// attemptOut is what buildAttempt made of one attempt.
type attemptOut struct {
	samples  []*Sample
	score    float64   // rollout-level score
	dropped  []float64 // credited rewards of samples excluded after assembly
	rewarded bool      // false: excluded (no reward, MissingDrop)
	missing  bool      // no episode reward; 0 was used
	report   *AttemptReport
	dec      []int  // report item of each sample (Options.Report)
	policy   string // policy version of the attempt's first call
}

// unitsOf splits an attempt into advantage units, in a fixed order (both
// passes of Build must agree).
func unitsOf(a attemptOut, i int, ref AttemptRef, o *Options) []unit {
	level := o.Level
	group := groupOf(ref, a, o.GroupBy)
	if level == LevelRollout {
		return []unit{{samples: a.samples, score: a.score, group: group, missing: a.missing, ref: i, dec: a.dec}}
	}
	us := make([]unit, 0, len(a.samples)+len(a.dropped))
	for k, s := range a.samples {
		u := unit{samples: []*Sample{s}, score: s.Reward, group: group, missing: a.missing, ref: i}
		if a.dec != nil {
			u.dec = a.dec[k : k+1]
		}
		us = append(us, u)
	}
	for _, r := range a.dropped {
		us = append(us, unit{score: r, group: group, missing: a.missing, ref: i})
	}
	return us
}

// eachAttempt builds the samples of every attempt that refs hands out (up
// to n at a time, none at the end), in order, and calls f for every
// selected attempt with its index (those excluded for a missing reward are
// counted in st instead). Stores that read many rollouts at once
// (ClickHouse) are read in chunks instead of a round trip per rollout.
func eachAttempt(ctx context.Context, store export.Store, refs func(n int) ([]AttemptRef, error), o Options, st *Stats, prog *Progress, f func(i int, ref AttemptRef, a attemptOut) error) error {
	cache := &prefetched{Store: store}
	chunks := func() ([]AttemptRef, error) { return refs(bulkChunk) }
	next := func() (chunk, bool) {
		rs, err := chunks()
		return chunk{refs: rs, err: err}, err != nil || len(rs) > 0
	}
	if bulk, ok := store.(export.BulkRolloutReader); ok {
		// The engine's raw answer is never read here; the request only to
		// retokenize and by AIR rules that read it.
		// Nor the rollouts rows: the selection has the attempts.
		ro := export.ReadOptions{NoResponseBody: true, NoRequestBody: o.Retokenize == nil && (o.AIR == nil || !o.AIR.ReadsRequests()),
			NoAttempts: true}
		ctx, cancel := context.WithCancel(ctx)
		var wait func()
		next, wait = readAhead(ctx, bulk, chunks, ro)
		defer wait()
		defer cancel() // stops the readers when f fails

	}
	i := 0
	for c, ok := next(); ok; c, ok = next() {
		if c.err != nil {
			return fmt.Errorf("bridge: reading rollouts: %w", c.err)
		}
		cache.m = c.m
		for _, ref := range c.refs {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := eachOne(ctx, cache, i, ref, o, st, prog, f); err != nil {
				return err
			}
			i++
		}
	}
	return ctx.Err()
}

// eachOne builds attempt i of eachAttempt and calls f.
func eachOne(ctx context.Context, read export.Store, i int, ref AttemptRef, o Options, st *Stats, prog *Progress, f func(i int, ref AttemptRef, a attemptOut) error) error {
	a, err := buildAttempt(ctx, read, ref, o, st)
	if err != nil {
		return err
	}
	if o.Progress != nil {
		prog.Attempts, prog.Calls = i+1, st.Calls
		o.Progress(prog)
	}
	if !a.rewarded {
		if a.report != nil {
			if a.report.Reason == "" {
				a.report.Reason = ExclNoReward
			}
			return f(i, ref, a) // reported, no unit
		}
		return nil // counted as no_reward or unfinished
	}
	if len(a.samples) == 0 {
		st.Excluded[ExclNoSample]++
		if a.report != nil {
			a.report.Reason = ExclNoSample
		}
	}
	return f(i, ref, a)
}

// groupOf is the GRPO group key: with GroupGroup the rollout's group_id when
// it has one; else the task id (of the attempt's calls, else
// of its rollouts row), or the rollout id when there is none; with
// GroupTaskPolicy followed by "@" and the policy version of the attempt's
// first call when it has one.
func groupOf(ref AttemptRef, a attemptOut, by string) string {
	if by == GroupGroup && ref.GroupID != "" {
		return ref.GroupID
	}
	g := "rollout:" + ref.RolloutID
	switch {
	case len(a.samples) > 0 && a.samples[0].TaskID != "":
		g = a.samples[0].TaskID
	case ref.TaskID != "":
		g = ref.TaskID
	}
	if by != GroupTask && a.policy != "" {
		g += "@" + a.policy
	}
	return g
}

// buildAttempt assembles one attempt's samples and returns them with the
// attempt's undiscounted return (the rollout-level score); rewarded is false
// when the attempt has no episode reward.
func buildAttempt(ctx context.Context, store export.Store, ref AttemptRef, o Options, st *Stats) (out attemptOut, err error) {
	d, err := store.Rollout(ctx, ref.RolloutID)
	if err != nil {
		return out, fmt.Errorf("bridge: reading rollout %s: %w", ref.RolloutID, err)
	}
	calls := attemptCalls(d.Calls, ref.AttemptID)
	st.Calls += len(calls)
	if len(calls) > 0 {
		out.policy = calls[0].PolicyVersion
	}
	if o.Report {
		out.report = &AttemptReport{RolloutID: ref.RolloutID, AttemptID: ref.AttemptID, TaskID: ref.TaskID, Status: ref.Status, Items: []Decision{}}
	}
	exclude := func(c *export.Call, why string) {
		st.Excluded[why]++
		if out.report != nil {
			out.report.Items = append(out.report.Items, Decision{Kind: "call", SequenceIDs: []uint64{c.SequenceID}, ChoiceIndex: c.ChoiceIndex, Reason: why})
		}
	}

	// Process rewards per sequence id: the last API reward of that name, plus AIR.
	process := map[uint64]float64{}
	seqs := map[uint64]bool{}
	for _, c := range calls {
		seqs[c.SequenceID] = true
	}
	type last struct {
		v  float64
		at uint64
	}
	api := map[uint64]last{}
	for _, r := range d.Rewards {
		if r.SequenceID == 0 || r.Name != o.RewardName || (r.AttemptID != "" && r.AttemptID != ref.AttemptID) {
			continue
		}
		if l, ok := api[r.SequenceID]; !ok || r.TimeUnixNano >= l.at {
			api[r.SequenceID] = last{r.Value, r.TimeUnixNano}
		}
	}
	for seq, l := range api {
		process[seq] += l.v
		seqs[seq] = true
	}
	if o.AIR != nil {
		rs := o.AIR.EvaluateSpans(calls, o.toolSpans[[2]string{ref.RolloutID, ref.AttemptID}], uint64(o.Now().UnixNano()))
		for _, r := range rs {
			process[r.SequenceID] += r.Value
			st.AIRHits[r.Source]++
		}
		if o.WriteAIR {
			if err := air.Write(ctx, store, rs); err != nil {
				return out, fmt.Errorf("bridge: %w", err)
			}
		}
	}
	episode, ok := finalReward(d.Rewards, ref.AttemptID, o.RewardName)
	if !ok {
		// An unregistered attempt's reward is what says its episode ended:
		// without one it may still be running, and never joins a group.
		if ref.Status == StatusUnregistered {
			st.Excluded[ExclUnfinished]++
			if out.report != nil {
				out.report.RewardMissing, out.report.Reason = true, ExclUnfinished
			}
			return out, nil
		}
		if o.MissingReward == MissingDrop {
			st.Excluded[ExclNoReward]++
			if out.report != nil {
				out.report.RewardMissing = true
			}
			return out, nil
		}
		episode, out.missing = 0, true
		st.FilledRewards++
	}
	if out.report != nil {
		out.report.RewardMissing = !ok
	}
	out.rewarded = true
	if len(seqs) == 0 {
		out.score = credit.Episode(episode, nil)
		if out.report != nil {
			out.report.Score = out.score
		}
		return out, nil
	}
	order := make([]uint64, 0, len(seqs))
	for s := range seqs {
		order = append(order, s)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	pv := make([]float64, len(order))
	step := map[uint64]int{}
	for i, s := range order {
		pv[i], step[s] = process[s], i
	}
	returns, err := credit.AssignN(o.Credit, len(order), episode, pv, o.Gamma)
	if err != nil {
		return out, fmt.Errorf("bridge: %w", err)
	}

	// kept is a view of calls while every call so far is kept as read,
	// and a copy from the first call that is left out or retokenized.
	kept, view := calls[:0:0], true
	own := func(i int) {
		if view {
			kept, view = append(make([]export.Call, 0, len(calls)), calls[:i]...), false
		}
	}
	for i, c := range calls {
		retokenizeFailed := false
		selected := (o.Selection.AgentName == nil || o.Selection.AgentName.MatchString(c.AgentName)) &&
			!versionBelow(c.PolicyVersion, o.Selection.MinPolicyVersion)
		if o.Retokenize != nil && (c.TokenSource == export.TokenSourceNone || o.RetokenizeAll) && c.Error == "" && c.HTTPStatus < 300 && selected {
			if err := retokenize(&c, o.Retokenize); err != nil {
				retokenizeFailed = true
				slog.Debug("bridge: call not retokenized", "rollout", c.RolloutID, "attempt", c.AttemptID,
					"sequence", c.SequenceID, "choice", c.ChoiceIndex, "err", err)
			} else {
				st.Retokenized++
			}
			own(i)
		}
		switch {
		case c.Error != "" || c.HTTPStatus >= 300:
			exclude(&c, ExclErrored)
		case retokenizeFailed:
			exclude(&c, ExclRetokenize)
		case !(trusted[c.TokenSource] || o.Retokenize != nil && c.TokenSource == export.TokenSourceRetokenized) ||
			len(c.PromptTokenIDs) == 0 || len(c.ResponseTokenIDs) == 0:
			exclude(&c, ExclUnverified)
		case o.Selection.AgentName != nil && !o.Selection.AgentName.MatchString(c.AgentName):
			exclude(&c, ExclAgent)
		case versionBelow(c.PolicyVersion, o.Selection.MinPolicyVersion):
			exclude(&c, ExclPolicyVersion)
		default:
			if view {
				kept = calls[: i+1 : i+1]
			} else {
				kept = append(kept, c)
			}
			continue
		}
		own(i)
	}
	samples, err := assemble(o.Mode, kept, st)
	if err != nil {
		return out, err
	}
	lastSeq := order[len(order)-1]
	out.samples = samples[:0]
	for _, s := range samples {
		switch {
		case o.Mode == ModeTransitions:
			s.Reward = returns[step[s.SequenceIDs[0]]]
		case o.Credit == credit.Discounted:
			s.Reward = returns[step[s.SequenceIDs[0]]]
		default:
			for _, q := range s.SequenceIDs {
				s.Reward += process[q]
			}
			if o.Credit == credit.Identical || s.SequenceIDs[len(s.SequenceIDs)-1] == lastSeq {
				s.Reward += episode
			}
		}
		why := truncate(s, o.MaxPrompt, o.MaxResponse, o.Truncation)
		if why == "" && o.Logprobs == LogprobsKeep && !s.HasLogprobs {
			why = ExclNoLogprobs
		}
		if out.report != nil {
			out.report.Items = append(out.report.Items, Decision{Kind: "sample", SequenceIDs: s.SequenceIDs, ChoiceIndex: s.ChoiceIndex,
				Reason: why, Truncated: s.Truncated})
			if why == "" {
				out.dec = append(out.dec, len(out.report.Items)-1)
			}
		}
		if why != "" {
			st.Excluded[why]++
			out.dropped = append(out.dropped, s.Reward)
			continue
		}
		if s.Trimmed {
			st.Trimmed++
		}
		if s.Truncated {
			st.Truncated++
		}
		out.samples = append(out.samples, s)
	}
	out.score = credit.Episode(episode, pv)
	if out.report != nil {
		out.report.Score = out.score
	}
	return out, nil
}

// attemptCalls returns the calls of the attempt among a rollout's, sorted
// by sequence id then choice (stably): all of them, not copied, when they
// are already (a store's usual answer for a rollout of one attempt; the
// caller must not modify them), otherwise a sorted copy of those of the
// attempt.
func attemptCalls(all []export.Call, attemptID string) []export.Call {
	less := func(a, b *export.Call) bool { return export.CompareTurns(a, b) < 0 }
	ready := true
	for i := range all {
		if all[i].AttemptID != attemptID || i > 0 && less(&all[i], &all[i-1]) {
			ready = false
			break
		}
	}
	if ready {
		return all
	}
	calls := make([]export.Call, 0, len(all))
	for _, c := range all {
		if c.AttemptID == attemptID {
			calls = append(calls, c)
		}
	}
	sort.SliceStable(calls, func(i, j int) bool { return less(&calls[i], &calls[j]) })
	return calls
}

// retokenize fills c's ids with the retokenizer's and marks them
// retokenized; the captured logprobs (if any) belong to the engine's
// tokens, not these, and are dropped.
func retokenize(c *export.Call, r Retokenizer) error {
	out, err := r.Retokenize(c.RequestBody, c.ResponseMessage, c.FinishReason)
	if err != nil {
		return err
	}
	if len(out.PromptIDs) == 0 || len(out.ResponseIDs) == 0 {
		return errors.New("empty prompt or response ids")
	}
	c.PromptTokenIDs, c.ResponseTokenIDs, c.ResponseLogprobs = out.PromptIDs, out.ResponseIDs, nil
	c.TokenSource = export.TokenSourceRetokenized
	return nil
}
