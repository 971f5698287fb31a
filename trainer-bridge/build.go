package bridge

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
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
	if o.RetokenizeAll && o.Retokenize == nil {
		return nil, optionErrorf("bridge: --retokenize-all needs --retokenize (the model's tokenizer and chat template)")
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
	// The selection waits in a file: memory holds a chunk of it at a time.
	refs, err := newRecordFile(o.SpillDir, "selection", 64<<10)
	if err != nil {
		return nil, err
	}
	defer refs.close()
	selected := 0
	var rec recordEncoder
	notSelected := map[string]int{}
	unattributed := 0
	err = selectEach(ctx, store, o.Selection, o.SpillDir, func(a AttemptRef) error {
		selected++
		rec = rec[:0]
		encodeRef(&rec, &a, a.FirstCallUnixNano)
		return refs.append(rec)
	}, func(why string, n int) {
		if why == SkipUnattributed {
			unattributed += n
		} else {
			notSelected[why] += n
		}
	})
	if err != nil {
		return nil, err
	}
	if err := refs.rewind(); err != nil {
		return nil, err
	}
	if o.AIR != nil && o.AIR.Enabled(air.RuleToolSpan) {
		if o.toolSpans, err = failedToolSpans(ctx, store); err != nil {
			return nil, err
		}
	}
	res := &Result{Stats: Stats{Attempts: selected, MinGroupSize: o.MinGroupSize, NotSelected: notSelected, UnattributedCalls: unattributed, Excluded: map[string]int{}, Breaks: map[string]int{}, AIRHits: map[string]int{}, Tasks: map[string]TaskStat{}}}
	// One pass over the store: every selected attempt's samples, kept in
	// memory, or, when streaming, in a spill file until the advantages are
	// known; its units (what an advantage is computed for) go to a sorter
	// by group, so the group statistics see one group at a time.
	var sp *spill
	if o.Emit != nil {
		if sp, err = newSpill(o.SpillDir); err != nil {
			return nil, err
		}
		defer sp.close()
	}
	units := newSorter(o.SpillDir, "advantage units", byGroup, encodeUnit, decodeUnit)
	defer units.close()
	var (
		kept    [][]*Sample // per unit, unless the samples are spilled
		dec     [][]int     // per unit, with Options.Report
		reports []*AttemptReport
		spilled int
		nUnits  int
	)
	prog := &Progress{Phase: PhaseRead, TotalAttempts: selected}
	err = eachAttempt(ctx, store, func(n int) ([]AttemptRef, error) { return readRefs(refs, n) }, o, &res.Stats, prog, func(i int, ref AttemptRef, a attemptOut) error {
		if a.report != nil {
			a.report.Group = groupOf(ref, a, o.GroupBy)
			reports = append(reports, make([]*AttemptReport, i+1-len(reports))...)
			reports[i] = a.report
		}
		if !a.rewarded {
			return nil // reported only
		}
		for _, u := range unitsOf(a, i, ref, &o) {
			for _, s := range u.samples {
				s.GroupUID = u.group
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
				spilled += len(u.samples)
			} else {
				kept = append(kept, u.samples)
			}
			if o.Report {
				dec = append(dec, u.dec)
			}
			err := units.add(unitRec{group: u.group, idx: nUnits, value: u.score, tokens: int32(u.tokens), ref: int32(i), n: int32(len(u.samples)), missing: u.missing})
			if err != nil {
				return err
			}
			nUnits++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Groups as sampled, one at a time: every unit counts, also those whose
	// samples were all left out, so no exclusion moves a sibling's
	// baseline. Each unit's outcome is sorted back into build order.
	outcomes := newSorter(o.SpillDir, "advantages", byIndex, encodeUnit, decodeUnit)
	defer outcomes.close()
	var (
		members     []unitRec
		scores, adv []float64
		toWrite     int
	)
	group := func() error {
		held("group", len(members))
		scores, adv = scores[:0], adv[:0]
		unrewarded := false
		for _, m := range members {
			scores, adv = append(scores, m.value), append(adv, 0)
			unrewarded = unrewarded || m.missing
		}
		small := len(members) < o.MinGroupSize
		if small {
			res.Stats.SmallGroups++
		}
		dropped, err := advantage.Group(o.Estimator, scores, adv, advantage.Options{DropZeroVariance: o.DropZeroVariance})
		if err != nil {
			return fmt.Errorf("bridge: group %q: %w", members[0].group, err)
		}
		if dropped {
			res.Stats.DroppedGroups++
		}
		counted := false
		for k, m := range members {
			why := reasonNone
			switch {
			case o.MissingReward == MissingDropGroup && unrewarded:
				why = reasonMissingGroup
			case small:
				why = reasonSmallGroup
			case dropped:
				why = reasonZeroVariance
			}
			if why == reasonNone && m.n > 0 {
				toWrite += int(m.n)
				if !counted {
					res.Stats.Groups++
					counted = true
				}
			}
			if err := outcomes.add(unitRec{idx: m.idx, value: adv[k], tokens: m.tokens, n: m.n, ref: m.ref, reason: uint8(why)}); err != nil {
				return err
			}
		}
		clear(members)
		members = members[:0]
		return nil
	}
	err = units.each(func(u *unitRec) error {
		if len(members) > 0 && members[0].group != u.group {
			if err := group(); err != nil {
				return err
			}
		}
		members = append(members, *u)
		return nil
	})
	if err == nil && len(members) > 0 {
		err = group()
	}
	if err != nil {
		return nil, err
	}
	units.close()
	// REINFORCE++-baseline whitens over the whole batch, in build order.
	var white advantage.Whitener
	if o.Estimator == advantage.ReinforcePP {
		for k, pass := range []func(a, w float64){white.Add, white.AddDeviation} {
			err := outcomes.each(func(x *unitRec) error {
				if x.reason != reasonZeroVariance {
					pass(x.value, float64(x.tokens))
				}
				return nil
			})
			if err == nil && k == 0 {
				if err = white.Mean(); err != nil {
					err = fmt.Errorf("bridge: %w", err)
				}
			}
			if err != nil {
				return nil, err
			}
		}
		white.Scale()
	}
	tasks := taskAccumulator{}
	keep := func(x *unitRec, samples []*Sample, emit func(*Sample) error) error {
		why := reasons[x.reason]
		a := x.value
		if o.Estimator == advantage.ReinforcePP && x.reason != reasonZeroVariance {
			a = white.Apply(a, float64(x.tokens))
		}
		if why == ExclZeroVariance {
			res.Stats.DroppedSamples += len(samples)
		}
		if o.Report {
			if rep := reports[x.ref]; rep != nil {
				if why != "" && o.Level == LevelRollout {
					rep.Reason = why
				}
				for _, d := range dec[x.idx] {
					rep.Items[d].Included, rep.Items[d].Reason, rep.Items[d].Advantage = why == "", why, a
				}
			}
		}
		if why != "" {
			res.Stats.Excluded[why] += len(samples)
			return nil
		}
		for _, s := range samples {
			s.Advantage = a
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
		err = outcomes.each(func(x *unitRec) error {
			return keep(x, kept[x.idx], func(s *Sample) error { res.Samples = append(res.Samples, s); return nil })
		})
		if err != nil {
			return nil, err
		}
	} else {
		// Hand the spilled samples out one by one, in the order they were
		// built, decoded by a goroutine while the previous ones are emitted.
		if err := sp.rewind(); err != nil {
			return nil, err
		}
		next := sp.readAhead(spilled)
		defer next.stop()
		emit := o.Emit
		if o.Progress != nil {
			prog.Phase, prog.TotalSamples = PhaseWrite, toWrite
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
		var samples []*Sample
		err = outcomes.each(func(x *unitRec) error {
			samples = samples[:0]
			for range x.n {
				s, err := next.sample()
				if err != nil {
					return err
				}
				samples = append(samples, s)
			}
			return keep(x, samples, emit)
		})
		if err != nil {
			return nil, err
		}
	}
	res.Stats.Tasks = tasks.stats()
	if o.Report {
		res.Report = make([]AttemptReport, 0, len(reports))
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
}

// unitRec is a unit as Build sorts it, first by group for the group
// statistics (value is its score), then back into build order (value is
// its advantage before any batch whitening, reason why its samples are left
// out, if they are): what the statistics need, without the samples.
type unitRec struct {
	group   string // "" once sorted back
	idx     int    // position in build order
	value   float64
	tokens  int32
	ref     int32 // index of the attempt in the selection
	n       int32 // samples
	missing bool
	reason  uint8 // index in reasons
}

// Reasons a whole group is left out, in unitRec.reason.
const (
	reasonNone = iota
	reasonMissingGroup
	reasonSmallGroup
	reasonZeroVariance
)

var reasons = [...]string{reasonNone: "", reasonMissingGroup: ExclMissingGroup, reasonSmallGroup: ExclSmallGroup, reasonZeroVariance: ExclZeroVariance}

func byGroup(a, b *unitRec) int {
	return cmp.Or(strings.Compare(a.group, b.group), cmp.Compare(a.idx, b.idx))
}

func byIndex(a, b *unitRec) int { return cmp.Compare(a.idx, b.idx) }

func encodeUnit(e *recordEncoder, u *unitRec) {
	e.string(u.group)
	e.uvarint(uint64(u.idx))
	e.float64(u.value)
	for _, v := range []int32{u.tokens, u.ref, u.n} {
		e.uvarint(uint64(v))
	}
	e.uvarint(boolBit(u.missing))
	e.uvarint(uint64(u.reason))
}

func decodeUnit(d *spillDecoder) unitRec {
	u := unitRec{group: d.string(), idx: int(d.uvarint()), value: math.Float64frombits(d.u64()), tokens: int32(d.uvarint()),
		ref: int32(d.uvarint()), n: int32(d.uvarint()), missing: d.uvarint() != 0}
	if r := d.uvarint(); r < uint64(len(reasons)) {
		u.reason = uint8(r)
	} else {
		d.bad = true
	}
	return u
}

func boolBit(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// encodeRef and decodeRef keep an attempt in a recordFile, with one more
// number (the selection's update time, or the first call's).
func encodeRef(e *recordEncoder, a *AttemptRef, extra uint64) {
	for _, v := range []string{a.RolloutID, a.AttemptID, a.TaskID, a.Status, a.GroupID} {
		e.string(v)
	}
	e.uvarint(extra)
}

func decodeRef(b []byte) (a AttemptRef, extra uint64, err error) {
	d := spillDecoder{b: b}
	for _, v := range []*string{&a.RolloutID, &a.AttemptID, &a.TaskID, &a.Status, &a.GroupID} {
		*v = d.string()
	}
	extra = d.uvarint()
	if d.bad || len(d.b) != 0 {
		return a, 0, errSpillCorrupt
	}
	return a, extra, nil
}

// readRefs reads up to n more attempts of the selection (none at its end).
func readRefs(f *recordFile, n int) ([]AttemptRef, error) {
	var out []AttemptRef
	for len(out) < n {
		b, err := f.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		a, first, err := decodeRef(b)
		if err != nil {
			return nil, f.readErr(err)
		}
		a.FirstCallUnixNano = first
		out = append(out, a)
	}
	return out, nil
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
	spans, err := store.FailedToolSpans(ctx)
	if err != nil {
		return nil, fmt.Errorf("bridge: reading failed tool spans: %w", err)
	}
	out := map[[2]string][]export.Span{}
	for _, sp := range spans {
		k := [2]string{sp.RolloutID, sp.AttemptID}
		out[k] = append(out[k], sp)
	}
	return out, nil
}

// bulkChunk is how many rollouts Build reads per query from a bulk reader.
const bulkChunk = 500

// chunk is up to bulkChunk selected attempts and, from a bulk reader,
// the details of their rollouts, or why they could not be read.
type chunk struct {
	refs []AttemptRef
	m    map[string]*export.RolloutDetail
	err  error
}

// readAhead reads the rollouts of the chunks of attempts that refs hands
// out (none at the end), ahead of their consumer, with two queries in
// flight (the store prepares the next chunks while the bridge builds the
// samples of this one; a server with a core to spare runs both at once).
// It returns next, which hands out the chunks in order and false after the
// last one, after an error or when ctx ends. Each reader holds at most one
// chunk (read, or being read) until next takes it, so memory holds at most
// three chunks, one of them in use, and one list of attempts waiting for a
// reader. Once ctx ends, wait returns when refs is no longer called.
func readAhead(ctx context.Context, bulk export.BulkRolloutReader, refs func() ([]AttemptRef, error), ro export.ReadOptions) (next func() (chunk, bool), wait func()) {
	const readers = 2
	var jobs, lanes [readers]chan chunk
	for w := range lanes {
		jobs[w], lanes[w] = make(chan chunk), make(chan chunk)
		go func(jobs <-chan chunk, lane chan<- chunk) {
			defer close(lane)
			for c := range jobs {
				if c.err == nil {
					ids := make([]string, 0, len(c.refs))
					seen := map[string]bool{}
					for _, r := range c.refs {
						if !seen[r.RolloutID] {
							seen[r.RolloutID] = true
							ids = append(ids, r.RolloutID)
						}
					}
					c.m, c.err = bulk.Rollouts(ctx, ids, ro)
				}
				select {
				case lane <- c:
				case <-ctx.Done():
					return
				}
				if c.err != nil {
					return
				}
			}
		}(jobs[w], lanes[w])
	}
	// The lists of attempts, to the readers in turn.
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		defer func() {
			for _, j := range jobs {
				close(j)
			}
		}()
		for w := 0; ; w = (w + 1) % readers {
			rs, err := refs()
			if err == nil && len(rs) == 0 {
				return
			}
			select {
			case jobs[w] <- chunk{refs: rs, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
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
	}, func() { <-fed }
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
