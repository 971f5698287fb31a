package bridge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
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
	// Truncation is TruncCut (default), TruncDrop or TruncTrim.
	MaxPrompt, MaxResponse int
	Truncation             string
	// MissingReward says what a selected attempt without an episode reward
	// gets: MissingZero (default: reward 0, as Agent Lightning; counted in
	// Stats.FilledRewards), MissingDrop (the attempt is excluded, no_reward)
	// or MissingDropGroup (its whole group is excluded, missing_reward_group).
	MissingReward string
	// MinGroupSize excludes the samples of groups sampled with fewer
	// members (small_group): 0 = the estimator's default (2 for grpo,
	// drgrpo and rloo, whose baseline needs siblings; 1 otherwise).
	MinGroupSize int
	// Logprobs is LogprobsKeep (default: the output carries
	// rollout_log_probs, so a sample without the engine's logprobs is
	// excluded as no_logprobs rather than written with zeros) or
	// LogprobsOmit (the output leaves rollout_log_probs out; every sample
	// is kept). Empty: LogprobsKeep, or LogprobsOmit when Retokenize is set.
	Logprobs string
	// Now stamps AIR rows; nil = time.Now.
	Now func() time.Time
	// Progress, when set, is called after each attempt read and, with
	// Emit, after each sample handed out; it must be cheap (throttle any
	// drawing) and must not keep p.
	Progress func(p *Progress)
	// Retokenize, when set, rebuilds the ids of calls captured without them
	// (token_source "none": hosted APIs, llama.cpp's chat route, SGLang
	// streaming chat) from the model's chat template and tokenizer, instead
	// of excluding them; their samples carry token_source "retokenized" and
	// zero rollout logprobs (recompute them in the trainer), are counted in
	// Stats.Retokenized and never merged with other calls' ids in trajectory
	// mode. Calls with ids (engine, tokenize) are never touched. Nil (the
	// default) excludes such calls as unverified_ids.
	Retokenize Retokenizer
	// GroupBy chooses the advantage group (the trainer's uid): GroupGroup
	// (default: the rollout's group_id, minted per task per enqueue call by
	// the task queue or given at registration, else as GroupTaskPolicy),
	// GroupTask (every selected attempt of a task) or GroupTaskPolicy (task
	// and the policy version of the attempt's first call, so that two
	// training steps of one task, served by different weights, never share a
	// baseline, as verl and Agent Lightning mint a group per step).
	GroupBy string
	// Report, when set, makes Build explain every selected attempt in
	// Result.Report: each call choice and sample included or excluded, with
	// the reason (the Excl* names of Stats.Excluded).
	Report bool
	// Emit, when set, streams the samples instead of returning them in
	// Result.Samples: Build reads the store once and keeps the samples in a
	// spill file (in SpillDir) until the batch-wide advantages are known,
	// so memory stays flat whatever the size of the export; the file holds
	// about the samples' ids, masks and logprobs (≈ 5 bytes per token) and
	// is removed when Build returns.
	Emit func(*Sample) error
	// SpillDir is the folder of Emit's spill file ("" = os.TempDir()).
	SpillDir string
}

// Progress is how far a Build has come (Options.Progress).
type Progress struct {
	// Phase is PhaseRead while attempts are read and assembled, then, with
	// Emit, PhaseWrite while the samples are handed out.
	Phase                   string
	Attempts, TotalAttempts int // attempts read, of those selected
	Calls                   int // call rows read
	// Samples written (PhaseWrite), of TotalSamples, known when the
	// writing begins.
	Samples, TotalSamples int
}

// Progress phases.
const (
	PhaseRead  = "read"
	PhaseWrite = "write"
)

// MissingReward policies (Options.MissingReward).
const (
	MissingZero      = "0"
	MissingDrop      = "drop"
	MissingDropGroup = "drop-group"
)

// Grouping (Options.GroupBy).
const (
	GroupGroup      = "group"
	GroupTask       = "task"
	GroupTaskPolicy = "task+policy"
)

// Logprobs policies (Options.Logprobs).
const (
	LogprobsKeep = "keep"
	LogprobsOmit = "omit"
)

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
	Trimmed            int            // samples trimmed by TruncTrim (off-policy)
	Truncated          int            // samples whose response was cut at MaxResponse (TruncCut)
	FilledRewards      int            // attempts without an episode reward given 0 (MissingZero)
	DroppedGroups      int            // zero-variance groups dropped
	DroppedSamples     int            // samples of those groups (also in Excluded[zero_variance])
	SmallGroups        int            // groups sampled with fewer than MinGroupSize members
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
	// Report explains every selected attempt (Options.Report), in selection order.
	Report []AttemptReport
}

// AttemptReport says what became of one selected attempt and why.
type AttemptReport struct {
	RolloutID string `json:"rollout_id"`
	AttemptID string `json:"attempt_id"`
	TaskID    string `json:"task_id"`
	Status    string `json:"status"`
	Group     string `json:"group,omitempty"` // the advantage group (uid)
	// Score is the attempt's rollout-level score; RewardMissing says the
	// episode reward was absent (and 0 used, or the attempt dropped).
	Score         float64 `json:"score"`
	RewardMissing bool    `json:"reward_missing,omitempty"`
	// Reason is set when the whole attempt was left out (no_reward,
	// no_sample, small_group, missing_reward_group, zero_variance).
	Reason string `json:"reason,omitempty"`
	// Items are the attempt's call choices left out before assembly and its
	// samples, included or not.
	Items []Decision `json:"items"`
}

// Decision is what became of one call choice (before assembly) or sample.
type Decision struct {
	Kind        string   `json:"kind"` // "call" or "sample"
	SequenceIDs []uint64 `json:"sequence_ids"`
	ChoiceIndex uint32   `json:"choice_index"`
	Included    bool     `json:"included"`
	Reason      string   `json:"reason,omitempty"`
	Truncated   bool     `json:"truncated,omitempty"`
	Advantage   float64  `json:"advantage,omitempty"`
}

// OptionError is an invalid Options value: the caller's mistake (a 400 over
// HTTP, exit status 2 on the command line), not a store failure.
type OptionError struct{ msg string }

func (e *OptionError) Error() string { return e.msg }

func optionErrorf(format string, a ...any) error {
	return &OptionError{msg: fmt.Sprintf(format, a...)}
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
	if o.Logprobs == "" && o.Retokenize != nil {
		// Retokenized samples have no logprobs at all: a batch that asks for
		// them leaves rollout_log_probs out rather than exclude them.
		o.Logprobs = LogprobsOmit
	}
	for _, c := range []struct {
		v       *string
		flag    string
		allowed []string // the first is the default
	}{
		{&o.Mode, "--mode", []string{ModeTransitions, ModeTrajectories}},
		{&o.Level, "--level", []string{LevelRollout, LevelTransition}},
		{&o.Truncation, "--truncation", []string{TruncCut, TruncDrop, TruncTrim}},
		{&o.MissingReward, "--missing-reward", []string{MissingZero, MissingDrop, MissingDropGroup}},
		{&o.Logprobs, "--logprobs", []string{LogprobsKeep, LogprobsOmit}},
		{&o.GroupBy, "--group-by", []string{GroupGroup, GroupTask, GroupTaskPolicy}},
	} {
		if *c.v == "" {
			*c.v = c.allowed[0]
		}
		if !slices.Contains(c.allowed, *c.v) {
			return nil, optionErrorf("bridge: %s %q is not one of %s", c.flag, *c.v, strings.Join(c.allowed, ", "))
		}
	}
	if o.MinGroupSize < 0 {
		return nil, optionErrorf("bridge: min group size %d is negative (--min-group-size)", o.MinGroupSize)
	}
	if o.MinGroupSize == 0 {
		o.MinGroupSize = 1
		switch o.Estimator {
		case advantage.GRPO, advantage.DrGRPO, advantage.RLOO:
			o.MinGroupSize = 2
		}
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
	// One pass over the store: every selected attempt's samples, kept in
	// memory, or, when streaming, in a spill file until the advantages are
	// known.
	var sp *spill
	if o.Emit != nil {
		if sp, err = newSpill(o.SpillDir); err != nil {
			return nil, err
		}
		defer sp.close()
	}
	units := &unitTable{groupIx: map[string]int32{}, keepSamples: sp == nil, keepDec: o.Report}
	reports := make([]*AttemptReport, len(refs))
	prog := &Progress{Phase: PhaseRead, TotalAttempts: len(refs)}
	err = eachAttempt(ctx, store, refs, o, &res.Stats, prog, func(i int, a attemptOut) error {
		if a.report != nil {
			a.report.Group = groupOf(refs[i], a, o.GroupBy)
			reports[i] = a.report
		}
		if !a.rewarded {
			return nil // reported only
		}
		for _, u := range unitsOf(a, i, refs[i], &o) {
			for _, s := range u.samples {
				for _, m := range s.ResponseMask {
					u.tokens += int(m)
				}
			}
			if sp != nil {
				for _, s := range u.samples {
					if err := sp.write(s); err != nil {
						return err
					}
				}
				u.spilled, u.samples = len(u.samples), nil
			}
			units.add(u)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Groups as sampled: every unit counts, also those whose samples were
	// all left out, so no exclusion moves a sibling's baseline.
	size := map[string]int{}
	unrewarded := map[string]bool{}
	for i := range units.meta {
		u := units.get(i)
		size[u.group]++
		if u.missing {
			unrewarded[u.group] = true
		}
	}
	for _, n := range size {
		if n < o.MinGroupSize {
			res.Stats.SmallGroups++
		}
	}
	n := len(units.meta)
	in := advantage.Input{Scores: make([]float64, n), GroupIndex: make([]int32, n), Tokens: make([]int, n)}
	for i, m := range units.meta {
		in.Scores[i], in.GroupIndex[i], in.Tokens[i] = m.score, m.group, int(m.tokens)
	}
	adv, err := advantage.Compute(o.Estimator, in, advantage.Options{DropZeroVariance: o.DropZeroVariance})
	if err != nil {
		return nil, fmt.Errorf("bridge: %w", err)
	}
	res.Stats.DroppedGroups = adv.DroppedGroups
	groups := map[string]bool{}
	tasks := taskAccumulator{}
	reason := func(i int, u unit) string {
		switch {
		case o.MissingReward == MissingDropGroup && unrewarded[u.group]:
			return ExclMissingGroup
		case size[u.group] < o.MinGroupSize:
			return ExclSmallGroup
		case !adv.Keep[i]:
			return ExclZeroVariance
		}
		return ""
	}
	keep := func(i int, u unit, emit func(*Sample) error) error {
		why := reason(i, u)
		if why == ExclZeroVariance {
			res.Stats.DroppedSamples += len(u.samples)
		}
		if rep := reports[u.ref]; rep != nil {
			if why != "" && o.Level == LevelRollout {
				rep.Reason = why
			}
			for _, d := range u.dec {
				rep.Items[d].Included, rep.Items[d].Reason, rep.Items[d].Advantage = why == "", why, adv.Advantages[i]
			}
		}
		if why != "" {
			res.Stats.Excluded[why] += len(u.samples)
			return nil
		}
		if len(u.samples) == 0 {
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
		for i := range units.meta {
			_ = keep(i, units.get(i), func(s *Sample) error { res.Samples = append(res.Samples, s); return nil })
		}
	} else {
		// Hand the spilled samples out one by one, in the order they were
		// built, decoded by a goroutine while the previous ones are emitted.
		if err := sp.rewind(); err != nil {
			return nil, err
		}
		total := 0
		for _, m := range units.meta {
			total += int(m.spilled)
		}
		next := sp.readAhead(total)
		defer next.stop()
		emit := o.Emit
		if o.Progress != nil {
			prog.Phase = PhaseWrite
			for i := range units.meta {
				if u := units.get(i); reason(i, u) == "" {
					prog.TotalSamples += u.spilled
				}
			}
			o.Progress(prog)
			emit = func(s *Sample) error {
				if err := o.Emit(s); err != nil {
					return err
				}
				prog.Samples++
				o.Progress(prog)
				return nil
			}
		}
		for i := range units.meta {
			u := units.get(i)
			u.samples = make([]*Sample, u.spilled)
			for k := range u.samples {
				if u.samples[k], err = next.sample(); err != nil {
					return nil, err
				}
			}
			if err := keep(i, u, emit); err != nil {
				return nil, err
			}
		}
	}
	res.Stats.Groups = len(groups)
	res.Stats.Tasks = tasks.stats()
	if o.Report {
		res.Report = make([]AttemptReport, 0, len(refs))
		for _, r := range reports {
			if r != nil {
				res.Report = append(res.Report, *r)
			}
		}
	}
	return res, nil
}

// unit is what one advantage is computed for: a rollout's samples (rollout
// level) or one sample (transition level). A unit may have no samples: an
// attempt whose calls were all left out, or a sample excluded after it was
// assembled; its score still counts in its group.
type unit struct {
	samples []*Sample
	score   float64
	group   string
	tokens  int
	missing bool  // the attempt had no episode reward (filled with 0)
	ref     int   // index of the attempt in the selection
	dec     []int // indices in the attempt's report items of the unit's samples
	spilled int   // samples written to the spill (streamed Build) instead of kept in samples
}

// unitTable holds a Build's units compactly: once the samples are spilled
// (Options.Emit), this bookkeeping is what grows with the size of an export,
// about 40 bytes per unit here and in the advantage step, where a []unit
// held over 100. Samples and report indices are kept only when needed.
type unitTable struct {
	meta        []unitMeta
	samples     [][]*Sample // per unit, unless the samples are spilled
	dec         [][]int     // per unit, with Options.Report
	groups      []string    // group keys by index
	groupIx     map[string]int32
	keepSamples bool
	keepDec     bool
}

// unitMeta is a unit without its samples and report indices.
type unitMeta struct {
	score   float64
	tokens  int32
	group   int32 // index in unitTable.groups
	ref     int32
	spilled int32
	missing bool
}

// add appends u.
func (t *unitTable) add(u unit) {
	g, ok := t.groupIx[u.group]
	if !ok {
		g = int32(len(t.groups))
		t.groupIx[u.group] = g
		t.groups = append(t.groups, u.group)
	}
	t.meta = append(t.meta, unitMeta{score: u.score, tokens: int32(u.tokens), group: g, ref: int32(u.ref), spilled: int32(u.spilled), missing: u.missing})
	if t.keepSamples {
		t.samples = append(t.samples, u.samples)
	}
	if t.keepDec {
		t.dec = append(t.dec, u.dec)
	}
}

// get returns unit i as it was added (without spilled samples).
func (t *unitTable) get(i int) unit {
	m := t.meta[i]
	u := unit{score: m.score, tokens: int(m.tokens), group: t.groups[m.group], ref: int(m.ref), spilled: int(m.spilled), missing: m.missing}
	if t.keepSamples {
		u.samples = t.samples[i]
	}
	if t.keepDec {
		u.dec = t.dec[i]
	}
	return u
}

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

// eachAttempt builds the samples of every ref in order and calls f for
// every selected attempt (those excluded for a missing reward are counted in
// st instead). Stores that read many rollouts at once (ClickHouse) are read
// in chunks instead of a round trip per rollout.
func eachAttempt(ctx context.Context, store export.Store, refs []AttemptRef, o Options, st *Stats, prog *Progress, f func(i int, a attemptOut) error) error {
	read := store
	cache := &prefetched{Store: store}
	var nextChunk func() (chunk, bool)
	if bulk, ok := store.(export.BulkRolloutReader); ok {
		// The engine's raw answer is never read here; the request only to
		// retokenize and by AIR rules that read it.
		ro := export.ReadOptions{NoResponseBody: true, NoRequestBody: o.Retokenize == nil && (o.AIR == nil || !o.AIR.ReadsRequests())}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // stops the reader when f fails
		nextChunk = readAhead(ctx, bulk, refs, ro)
	}
	for i, ref := range refs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if nextChunk != nil && i%bulkChunk == 0 {
			c, ok := nextChunk()
			if !ok {
				return ctx.Err()
			}
			if c.err != nil {
				return fmt.Errorf("bridge: reading rollouts: %w", c.err)
			}
			cache.m, read = c.m, cache
		}
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
				a.report.Reason = ExclNoReward
				if err := f(i, a); err != nil { // reported, no unit
					return err
				}
			}
			continue // counted as no_reward
		}
		if len(a.samples) == 0 {
			st.Excluded[ExclNoSample]++
			if a.report != nil {
				a.report.Reason = ExclNoSample
			}
		}
		if err := f(i, a); err != nil {
			return err
		}
	}
	return nil
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
			kept = append(kept, c)
		}
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

// chunk is the details of the rollouts of bulkChunk refs, or why they could
// not be read.
type chunk struct {
	m   map[string]*export.RolloutDetail
	err error
}

// readAhead reads the rollouts of refs in chunks of bulkChunk refs, ahead
// of their consumer, with two queries in flight (the store prepares the
// next chunks while the bridge builds the samples of this one; a server with
// a core to spare runs both at once). It returns next, which hands out the
// chunks in order and false after the last one, after an error or when ctx
// ends. Each reader holds at most one chunk (read, or being read) until next
// takes it, so memory holds at most three chunks, one of them in use, as
// with one reader a chunk ahead.
func readAhead(ctx context.Context, bulk export.BulkRolloutReader, refs []AttemptRef, ro export.ReadOptions) (next func() (chunk, bool)) {
	const readers = 2
	var lanes [readers]chan chunk
	for w := range lanes {
		lanes[w] = make(chan chunk)
		go func(lane chan<- chunk, first int) {
			defer close(lane)
			for i := first; i < len(refs); i += readers * bulkChunk {
				ids := make([]string, 0, bulkChunk)
				seen := map[string]bool{}
				for _, r := range refs[i:min(len(refs), i+bulkChunk)] {
					if !seen[r.RolloutID] {
						seen[r.RolloutID] = true
						ids = append(ids, r.RolloutID)
					}
				}
				m, err := bulk.Rollouts(ctx, ids, ro)
				select {
				case lane <- chunk{m, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}(lanes[w], w*bulkChunk)
	}
	k, failed := 0, false
	// The chunks in order: lane by lane in turn.
	return func() (chunk, bool) {
		if failed {
			return chunk{}, false
		}
		c, ok := <-lanes[k%readers]
		k++
		failed = !ok || c.err != nil
		return c, ok
	}
}

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
