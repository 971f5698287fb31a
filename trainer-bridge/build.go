package bridge

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
	"github.com/rollgate/rollgate/trainer-bridge/air"
	"github.com/rollgate/rollgate/trainer-bridge/credit"
)

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
