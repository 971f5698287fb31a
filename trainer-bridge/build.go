package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strconv"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/tokenize/chattemplate"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

// Advantage levels.
const (
	LevelRollout    = "rollout"    // one score per attempt (R + sum of process rewards), advantage broadcast to its samples
	LevelTransition = "transition" // every sample is scored and grouped on its own (Agent Lightning)
)

// Options configure Build. The zero value plus a Selection is LightningRL:
// transitions, identical credit, reward "primary", no advantage.
type Options struct {
	// toolSpans are the agent's failed tool spans by (rollout, attempt), read
	// once per Build for the air_tool_span rule.
	toolSpans map[[2]string][]export.Span

	Selection  Selection
	Mode       string // ModeTransitions (default) or ModeTrajectories
	RewardName string // episode and per-call reward name, default "primary"
	Credit     credit.Mode
	Gamma      float64 // for credit.Discounted
	Estimator  advantage.Estimator
	Level      string // LevelRollout (default) or LevelTransition
	// DropZeroVariance drops groups whose scores are all equal.
	DropZeroVariance bool
	// AIR, when set, computes automatic intermediate rewards over every call
	// of each selected attempt and adds them to the process rewards.
	AIR *air.Engine
	// WriteAIR stores the AIR outcomes in the rewards table.
	WriteAIR bool
	// MaxPrompt and MaxResponse limit sample lengths (0 = no limit);
	// Truncation is TruncDrop (default) or TruncTrim.
	MaxPrompt, MaxResponse int
	Truncation             string
	// Now stamps AIR rows; nil = time.Now.
	Now func() time.Time
	// Progress, when set, is called after each attempt with (done, total).
	Progress func(done, total int)
	// Retokenize, when set, rebuilds the ids of calls captured without them
	// (token_source "none": hosted APIs, llama.cpp's chat route, SGLang
	// streaming chat) from the model's chat template and tokenizer, instead
	// of excluding them; their samples carry token_source "retokenized" and
	// zero rollout logprobs (recompute them in the trainer), are counted in
	// Stats.Retokenized and never merged with other calls' ids in trajectory
	// mode. Calls with ids (engine, tokenize) are never touched. Nil (the
	// default) excludes such calls as unverified_ids.
	Retokenize Retokenizer
	// Emit, when set, streams the samples instead of returning them in
	// Result.Samples: Build reads the attempts twice (scores for the
	// advantages, then the samples, one attempt at a time), so memory stays
	// bounded by one attempt whatever the size of the export.
	Emit func(*Sample) error
}

// Retokenizer rebuilds the token ids of one call choice captured without
// them, from its request body, assistant message and finish reason.
// *chattemplate.Retokenizer (package tokenize/chattemplate) is the
// implementation: the model's chat template and tokenizer.json.
type Retokenizer interface {
	Retokenize(requestBody, responseMessage, finishReason string) (*chattemplate.Retokenized, error)
}

var _ Retokenizer = (*chattemplate.Retokenizer)(nil)

// TaskStat is the reward distribution of one task's samples.
type TaskStat struct {
	Samples   int
	Mean, Std float64 // population std of sample rewards
}

// Stats summarises a run: what was used, what was left out and why.
type Stats struct {
	Attempts           int            // attempts selected
	Calls              int            // llm_calls rows of the selected attempts
	Samples            int            // samples produced
	Groups             int            // advantage groups (task ids) among the samples
	Merged             int            // trajectory mode: calls merged into an earlier turn's sample
	Trimmed            int            // samples trimmed by the truncation policy
	DroppedGroups      int            // zero-variance groups dropped
	DroppedSamples     int            // samples of those groups
	Retokenized        int            // calls whose ids Options.Retokenize rebuilt (token_source none -> retokenized)
	RetokenizedSamples int            // samples among Samples with token_source retokenized
	Excluded           map[string]int // by reason (Excl* constants)
	Breaks             map[string]int // trajectory breaks by class (Break* constants)
	AIRHits            map[string]int // AIR reward rows by rule
	Tasks              map[string]TaskStat
}

// Result is what Build returns.
type Result struct {
	Samples []*Sample
	Stats   Stats
}

// Build selects attempts from store, assembles samples, credits rewards and
// computes advantages.
func Build(ctx context.Context, store export.Store, o Options) (*Result, error) {
	if o.RewardName == "" {
		o.RewardName = "primary"
	}
	if o.Credit == "" {
		o.Credit = credit.Identical
	}
	if o.Estimator == "" {
		o.Estimator = advantage.None
	}
	if o.Level == "" {
		o.Level = LevelRollout
	}
	if o.Level != LevelRollout && o.Level != LevelTransition {
		return nil, fmt.Errorf("bridge: advantage level %q is not %q or %q", o.Level, LevelRollout, LevelTransition)
	}
	if o.Truncation == "" {
		o.Truncation = TruncDrop
	}
	if o.Truncation != TruncDrop && o.Truncation != TruncTrim {
		return nil, fmt.Errorf("bridge: truncation policy %q is not %q or %q", o.Truncation, TruncDrop, TruncTrim)
	}
	if o.Mode == "" {
		o.Mode = ModeTransitions
	}
	if o.Mode != ModeTransitions && o.Mode != ModeTrajectories {
		return nil, fmt.Errorf("bridge: unknown mode %q (%s, %s)", o.Mode, ModeTransitions, ModeTrajectories)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	refs, err := SelectAttempts(ctx, store, o.Selection)
	if err != nil {
		return nil, err
	}
	if o.AIR != nil && o.AIR.Enabled(air.RuleToolSpan) {
		if o.toolSpans, err = failedToolSpans(ctx, store); err != nil {
			return nil, err
		}
	}
	res := &Result{Stats: Stats{Attempts: len(refs), Excluded: map[string]int{}, Breaks: map[string]int{}, AIRHits: map[string]int{}, Tasks: map[string]TaskStat{}}}
	// Pass 1: every selected attempt's samples, or, when streaming, only the
	// scores the advantages need (the samples are built again in pass 2).
	var units []unit
	perRef := make([]int, len(refs)) // units each ref gave
	err = eachAttempt(ctx, store, refs, o, &res.Stats, func(i int, samples []*Sample, score float64) error {
		group := groupOf(samples[0])
		add := func(u unit) {
			for _, s := range u.samples {
				for _, m := range s.ResponseMask {
					u.tokens += int(m)
				}
			}
			if o.Emit != nil {
				u.samples = nil
			}
			units = append(units, u)
			perRef[i]++
		}
		if o.Level == LevelRollout {
			add(unit{samples: samples, score: score, group: group})
			return nil
		}
		for _, s := range samples {
			add(unit{samples: []*Sample{s}, score: s.Reward, group: group})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	in := advantage.Input{Scores: make([]float64, len(units)), Groups: make([]string, len(units)), Tokens: make([]int, len(units))}
	for i, u := range units {
		in.Scores[i], in.Groups[i], in.Tokens[i] = u.score, u.group, u.tokens
	}
	adv, err := advantage.Compute(o.Estimator, in, advantage.Options{DropZeroVariance: o.DropZeroVariance})
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	res.Stats.DroppedGroups = adv.DroppedGroups
	groups := map[string]bool{}
	tasks := taskAccumulator{}
	keep := func(i int, u unit, emit func(*Sample) error) error {
		if !adv.Keep[i] {
			res.Stats.DroppedSamples += len(u.samples)
			return nil
		}
		groups[u.group] = true
		for _, s := range u.samples {
			s.Advantage, s.GroupUID = adv.Advantages[i], u.group
			tasks.add(s)
			res.Stats.Samples++
			if s.TokenSource == export.TokenSourceRetokenized {
				res.Stats.RetokenizedSamples++
			}
			if err := emit(s); err != nil {
				return err
			}
		}
		return nil
	}
	if o.Emit == nil {
		for i, u := range units {
			_ = keep(i, u, func(s *Sample) error { res.Samples = append(res.Samples, s); return nil })
		}
	} else {
		// Pass 2: build each attempt again and hand its samples out one by one.
		o2 := o
		o2.WriteAIR, o2.Progress = false, nil
		var scratch Stats
		scratch.Excluded, scratch.Breaks, scratch.AIRHits = map[string]int{}, map[string]int{}, map[string]int{}
		next := 0
		err = eachAttempt(ctx, store, refs, o2, &scratch, func(i int, samples []*Sample, score float64) error {
			var us []unit
			if o.Level == LevelRollout {
				us = []unit{{samples: samples, group: groupOf(samples[0])}}
			} else {
				for _, s := range samples {
					us = append(us, unit{samples: []*Sample{s}, group: groupOf(samples[0])})
				}
			}
			if len(us) != perRef[i] {
				return fmt.Errorf("bridge: rollout %s changed while it was exported (%d samples, then %d); run the export again", refs[i].RolloutID, perRef[i], len(us))
			}
			for _, u := range us {
				if err := keep(next, u, o.Emit); err != nil {
					return err
				}
				next++
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	res.Stats.Groups = len(groups)
	res.Stats.Tasks = tasks.stats()
	return res, nil
}

// unit is what one advantage is computed for: a rollout's samples (rollout
// level) or one sample (transition level).
type unit struct {
	samples []*Sample
	score   float64
	group   string
	tokens  int
}

// eachAttempt builds the samples of every ref in order and calls f for the
// rewarded attempts that gave samples (the others are counted in st).
// Stores that read many rollouts at once (ClickHouse) are read in chunks
// instead of a round trip per rollout.
func eachAttempt(ctx context.Context, store export.Store, refs []AttemptRef, o Options, st *Stats, f func(i int, samples []*Sample, score float64) error) error {
	read := store
	bulk, isBulk := store.(export.BulkRolloutReader)
	cache := &prefetched{Store: store}
	for i, ref := range refs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if isBulk && i%bulkChunk == 0 {
			ids := make([]string, 0, bulkChunk)
			seen := map[string]bool{}
			for _, r := range refs[i:min(len(refs), i+bulkChunk)] {
				if !seen[r.RolloutID] {
					seen[r.RolloutID] = true
					ids = append(ids, r.RolloutID)
				}
			}
			var err error
			if cache.m, err = bulk.Rollouts(ctx, ids); err != nil {
				return fmt.Errorf("bridge: reading rollouts: %w", err)
			}
			read = cache
		}
		samples, score, rewarded, err := buildAttempt(ctx, read, ref, o, st)
		if err != nil {
			return err
		}
		if o.Progress != nil {
			o.Progress(i+1, len(refs))
		}
		if !rewarded {
			continue // counted as no_reward
		}
		if len(samples) == 0 {
			st.Excluded[ExclNoSample]++
			continue
		}
		if err := f(i, samples, score); err != nil {
			return err
		}
	}
	return nil
}

// groupOf is the GRPO group key: the task id, or the rollout id for calls without one.
func groupOf(s *Sample) string {
	if s.TaskID != "" {
		return s.TaskID
	}
	return "rollout:" + s.RolloutID
}

// buildAttempt assembles one attempt's samples and returns them with the
// attempt's undiscounted return (the rollout-level score); rewarded is false
// when the attempt has no episode reward.
func buildAttempt(ctx context.Context, store export.Store, ref AttemptRef, o Options, st *Stats) (samples []*Sample, score float64, rewarded bool, err error) {
	d, err := store.Rollout(ctx, ref.RolloutID)
	if err != nil {
		return nil, 0, false, fmt.Errorf("bridge: reading rollout %s: %w", ref.RolloutID, err)
	}
	calls := make([]export.Call, 0, len(d.Calls))
	for _, c := range d.Calls {
		if c.AttemptID == ref.AttemptID {
			calls = append(calls, c)
		}
	}
	sort.SliceStable(calls, func(i, j int) bool {
		if calls[i].SequenceID != calls[j].SequenceID {
			return calls[i].SequenceID < calls[j].SequenceID
		}
		return calls[i].ChoiceIndex < calls[j].ChoiceIndex
	})
	st.Calls += len(calls)

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
				return nil, 0, false, fmt.Errorf("bridge: %w", err)
			}
		}
	}
	episode, ok := finalReward(d.Rewards, ref.AttemptID, o.RewardName)
	if !ok {
		st.Excluded[ExclNoReward]++
		return nil, 0, false, nil
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
		return nil, 0, false, fmt.Errorf("bridge: %w", err)
	}

	kept := calls[:0:0]
	for _, c := range calls {
		retokenizeFailed := false
		selected := (o.Selection.AgentName == nil || o.Selection.AgentName.MatchString(c.AgentName)) &&
			!versionBelow(c.PolicyVersion, o.Selection.MinPolicyVersion)
		if o.Retokenize != nil && c.TokenSource == export.TokenSourceNone && c.Error == "" && c.HTTPStatus < 300 && selected {
			if err := retokenize(&c, o.Retokenize); err != nil {
				retokenizeFailed = true
				slog.Debug("bridge: call not retokenized", "rollout", c.RolloutID, "attempt", c.AttemptID,
					"sequence", c.SequenceID, "choice", c.ChoiceIndex, "err", err)
			} else {
				st.Retokenized++
			}
		}
		switch {
		case c.Error != "" || c.HTTPStatus >= 300:
			st.Excluded[ExclErrored]++
		case retokenizeFailed:
			st.Excluded[ExclRetokenize]++
		case !(trusted[c.TokenSource] || o.Retokenize != nil && c.TokenSource == export.TokenSourceRetokenized) ||
			len(c.PromptTokenIDs) == 0 || len(c.ResponseTokenIDs) == 0:
			st.Excluded[ExclUnverified]++
		case o.Selection.AgentName != nil && !o.Selection.AgentName.MatchString(c.AgentName):
			st.Excluded[ExclAgent]++
		case versionBelow(c.PolicyVersion, o.Selection.MinPolicyVersion):
			st.Excluded[ExclPolicyVersion]++
		default:
			kept = append(kept, c)
		}
	}
	samples, err = assemble(o.Mode, kept, st)
	if err != nil {
		return nil, 0, false, err
	}
	lastSeq := order[len(order)-1]
	out := samples[:0]
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
		keep, trimmed := truncate(s, o.MaxPrompt, o.MaxResponse, o.Truncation)
		if !keep {
			st.Excluded[ExclTruncDropped]++
			continue
		}
		if trimmed {
			st.Trimmed++
		}
		out = append(out, s)
	}
	return out, credit.Episode(episode, pv), true, nil
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

// taskAccumulator sums sample rewards per task for Stats.Tasks.
type taskAccumulator map[string]*[3]float64 // n, sum, sum of squares

func (a taskAccumulator) add(s *Sample) {
	v := a[s.TaskID]
	if v == nil {
		v = new([3]float64)
		a[s.TaskID] = v
	}
	v[0]++
	v[1] += s.Reward
	v[2] += s.Reward * s.Reward
}

func (a taskAccumulator) stats() map[string]TaskStat {
	out := map[string]TaskStat{}
	for t, v := range a {
		mean := v[1] / v[0]
		out[t] = TaskStat{Samples: int(v[0]), Mean: mean, Std: math.Sqrt(math.Max(0, v[2]/v[0]-mean*mean))}
	}
	return out
}

// failedToolSpans reads the agent spans (agent_spans, sent over OTLP) that
// report a failed tool call, by (rollout, attempt).
func failedToolSpans(ctx context.Context, store export.Store) (map[[2]string][]export.Span, error) {
	res, err := store.Query(ctx, "SELECT rollout_id, attempt_id, span_id, tool_name, tool_call_id, start_time_unix_nano FROM agent_spans "+
		"WHERE status_code = 'error' AND rollout_id != '' AND (tool_name != '' OR tool_call_id != '')")
	if err != nil {
		return nil, fmt.Errorf("bridge: reading failed tool spans: %w", err)
	}
	out := map[[2]string][]export.Span{}
	for _, r := range res.Rows {
		if len(r) < 6 {
			return nil, fmt.Errorf("bridge: reading failed tool spans: row with %d columns", len(r))
		}
		start, err := strconv.ParseUint(r[5], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bridge: reading failed tool spans: start time %q: %w", r[5], err)
		}
		k := [2]string{r[0], r[1]}
		out[k] = append(out[k], export.Span{RolloutID: r[0], AttemptID: r[1], SpanID: r[2], ToolName: r[3], ToolCallID: r[4],
			StatusCode: "error", StartTimeUnixNano: start})
	}
	return out, nil
}

// bulkChunk is how many rollouts Build reads per query from a bulk reader.
const bulkChunk = 500

// prefetched serves Rollout from a chunk read in bulk, and everything else
// from the store.
type prefetched struct {
	export.Store
	m map[string]*export.RolloutDetail
}

// Rollout returns the prefetched detail, or reads it when it is not there.
func (p *prefetched) Rollout(ctx context.Context, id string) (*export.RolloutDetail, error) {
	if d, ok := p.m[id]; ok {
		return d, nil
	}
	return p.Store.Rollout(ctx, id)
}
