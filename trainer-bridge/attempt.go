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

	// Process rewards per sequence id: the last API reward of that name, plus AIR.
	// (The maps are made here, where they stay off the heap.)
	cr := credits{process: map[uint64]float64{}, step: map[uint64]int{}}
	seqs := map[uint64]bool{}
	apiRewards(d.Rewards, calls, ref.AttemptID, o.RewardName, cr.process, seqs)
	if o.AIR != nil {
		rs := o.AIR.EvaluateSpans(calls, o.toolSpans[[2]string{ref.RolloutID, ref.AttemptID}], uint64(o.Now().UnixNano()))
		for _, r := range rs {
			cr.process[r.SequenceID] += r.Value
			st.AIRHits[r.Source]++
		}
		if o.WriteAIR {
			if err := air.Write(ctx, store, rs); err != nil {
				return out, fmt.Errorf("bridge: %w", err)
			}
		}
	}
	var ok bool
	if cr.episode, ok = out.episodeReward(d.Rewards, ref, &o, st); !ok {
		return out, nil
	}
	if len(seqs) == 0 {
		out.score = credit.Episode(cr.episode, nil)
		if out.report != nil {
			out.report.Score = out.score
		}
		return out, nil
	}
	cr.pv = make([]float64, len(seqs))
	if err := cr.assign(seqs, &o); err != nil {
		return out, err
	}
	samples, err := assemble(o.Mode, out.keptCalls(calls, &o, st), st)
	if err != nil {
		return out, err
	}
	out.judge(samples, &cr, &o, st)
	out.score = credit.Episode(cr.episode, cr.pv)
	if out.report != nil {
		out.report.Score = out.score
	}
	return out, nil
}

// apiRewards adds to process, per sequence id, the last reward of that
// name the API stored for the attempt, and to seqs the sequence ids of the
// attempt's calls and of those rewards.
func apiRewards(rewards []export.Reward, calls []export.Call, attemptID, name string, process map[uint64]float64, seqs map[uint64]bool) {
	for _, c := range calls {
		seqs[c.SequenceID] = true
	}
	type last struct {
		v  float64
		at uint64
	}
	api := map[uint64]last{}
	for _, r := range rewards {
		if r.SequenceID == 0 || r.Name != name || (r.AttemptID != "" && r.AttemptID != attemptID) {
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
}

// episodeReward returns the attempt's episode reward, or 0 for a missing
// one under MissingZero (out.missing), and marks out rewarded; false when
// the attempt is left out for want of one (unfinished or no_reward,
// counted in st).
func (out *attemptOut) episodeReward(rewards []export.Reward, ref AttemptRef, o *Options, st *Stats) (float64, bool) {
	episode, ok := finalReward(rewards, ref.AttemptID, o.RewardName)
	if !ok {
		// An unregistered attempt's reward is what says its episode ended:
		// without one it may still be running, and never joins a group.
		if ref.Status == StatusUnregistered {
			st.Excluded[ExclUnfinished]++
			if out.report != nil {
				out.report.RewardMissing, out.report.Reason = true, ExclUnfinished
			}
			return 0, false
		}
		if o.MissingReward == MissingDrop {
			st.Excluded[ExclNoReward]++
			if out.report != nil {
				out.report.RewardMissing = true
			}
			return 0, false
		}
		episode, out.missing = 0, true
		st.FilledRewards++
	}
	if out.report != nil {
		out.report.RewardMissing = !ok
	}
	out.rewarded = true
	return episode, true
}

// credits are what an attempt's samples are rewarded with.
type credits struct {
	episode float64
	process map[uint64]float64 // process reward per sequence id
	pv      []float64          // process reward per step (sequence ids in order)
	step    map[uint64]int     // step of each sequence id
	returns []float64          // credited return per step
	lastSeq uint64             // the last step's sequence id
}

// assign orders the attempt's sequence ids (seqs, at least one) into steps
// (cr.step, an empty map; cr.pv, one per step) and credits the rewards over
// them (Options.Credit).
func (cr *credits) assign(seqs map[uint64]bool, o *Options) error {
	order := make([]uint64, 0, len(seqs))
	for s := range seqs {
		order = append(order, s)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	for i, s := range order {
		cr.pv[i], cr.step[s] = cr.process[s], i
	}
	var err error
	if cr.returns, err = credit.AssignN(o.Credit, len(order), cr.episode, cr.pv, o.Gamma); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	cr.lastSeq = order[len(order)-1]
	return nil
}

// reward adds s's credited reward to s.Reward.
func (cr *credits) reward(s *Sample, o *Options) {
	switch {
	case o.Mode == ModeTransitions:
		s.Reward = cr.returns[cr.step[s.SequenceIDs[0]]]
	case o.Credit == credit.Discounted:
		s.Reward = cr.returns[cr.step[s.SequenceIDs[0]]]
	default:
		for _, q := range s.SequenceIDs {
			s.Reward += cr.process[q]
		}
		if o.Credit == credit.Identical || s.SequenceIDs[len(s.SequenceIDs)-1] == cr.lastSeq {
			s.Reward += cr.episode
		}
	}
}

// exclude counts call c as left out for why, and reports it.
func (out *attemptOut) exclude(st *Stats, c *export.Call, why string) {
	st.Excluded[why]++
	if out.report != nil {
		out.report.Items = append(out.report.Items, Decision{Kind: "call", SequenceIDs: []uint64{c.SequenceID}, ChoiceIndex: c.ChoiceIndex, Reason: why})
	}
}

// keptCalls returns the calls that become samples, retokenized where
// Options.Retokenize says so, and counts and reports the others with the
// reason (exclude).
func (out *attemptOut) keptCalls(calls []export.Call, o *Options, st *Stats) []export.Call {
	// kept is a view of calls while every call so far is kept as read,
	// and a copy from the first call that is left out or retokenized.
	kept, view := calls[:0:0], true
	superseded := export.SupersededTries(calls)
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
		case superseded != nil && superseded[i]:
			out.exclude(st, &c, ExclSuperseded)
		case c.Error != "" || c.HTTPStatus >= 300:
			out.exclude(st, &c, ExclErrored)
		case retokenizeFailed:
			out.exclude(st, &c, ExclRetokenize)
		case !(trusted[c.TokenSource] || o.Retokenize != nil && c.TokenSource == export.TokenSourceRetokenized) ||
			len(c.PromptTokenIDs) == 0 || len(c.ResponseTokenIDs) == 0:
			out.exclude(st, &c, ExclUnverified)
		case o.Selection.AgentName != nil && !o.Selection.AgentName.MatchString(c.AgentName):
			out.exclude(st, &c, ExclAgent)
		case versionBelow(c.PolicyVersion, o.Selection.MinPolicyVersion):
			out.exclude(st, &c, ExclPolicyVersion)
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
	return kept
}

// judge credits the assembled samples, applies the length limits and the
// logprobs policy, and keeps in out.samples those that pass; the rewards
// of the others go to out.dropped (transition level: each still counts in
// its group).
func (out *attemptOut) judge(samples []*Sample, cr *credits, o *Options, st *Stats) {
	out.samples = samples[:0]
	for _, s := range samples {
		cr.reward(s, o)
		why := truncate(s, o.MaxPrompt, o.MaxResponse, o.Truncation)
		if why == "" && o.Logprobs == LogprobsKeep && !s.HasLogprobs {
			why = ExclNoLogprobs
		}
		if why == "" && o.MixedPolicy == MixedDrop && s.MixedPolicy {
			why = ExclMixedPolicy
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
