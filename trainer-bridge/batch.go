package bridge

import (
	"context"
	"fmt"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
)

// batch is one Build between the selection and the result: what its passes
// (read, groups, whiten, hand) hand on to the next.
type batch struct {
	o   *Options
	res *Result
	// sp keeps the samples, when streaming (Options.Emit), until the
	// advantages are known; spilled counts them.
	sp      *spill
	spilled int
	// kept are the samples per unit, unless they are spilled; dec the
	// report items of each unit's samples (Options.Report).
	kept [][]*Sample
	dec  [][]int
	// reports are the selected attempts' reports by selection index (nil
	// for an attempt not reported).
	reports []*AttemptReport
	// units are the advantage units sorted by group, nUnits their number;
	// outcomes the units' advantages sorted back into build order.
	units, outcomes *sorter[unitRec]
	nUnits          int
	prog            *Progress
	toWrite         int // samples of the groups kept, for Progress
	white           advantage.Whitener
	tasks           taskAccumulator
}

func newBatch(o *Options, res *Result, selected int) *batch {
	return &batch{o: o, res: res, prog: &Progress{Phase: PhaseRead, TotalAttempts: selected}, tasks: taskAccumulator{},
		units:    newSorter(o.SpillDir, "advantage units", byGroup, encodeUnit, decodeUnit),
		outcomes: newSorter(o.SpillDir, "advantages", byIndex, encodeUnit, decodeUnit)}
}

// close removes the batch's temporary files.
func (b *batch) close() {
	b.outcomes.close()
	b.units.close()
	if b.sp != nil {
		b.sp.close()
	}
}

// read makes one pass over the store: every selected attempt's samples,
// kept in memory, or, when streaming, in a spill file until the advantages
// are known; its units (what an advantage is computed for) go to a sorter
// by group, so the group statistics see one group at a time.
func (b *batch) read(ctx context.Context, store export.Store, refs *recordFile) error {
	if b.o.Emit != nil {
		sp, err := newSpill(b.o.SpillDir)
		if err != nil {
			return err
		}
		b.sp = sp
	}
	return eachAttempt(ctx, store, func(n int) ([]AttemptRef, error) { return readRefs(refs, n) }, *b.o, &b.res.Stats, b.prog, b.add)
}

// add takes attempt i of the selection: its report, and its units unless it
// was left out whole.
func (b *batch) add(i int, ref AttemptRef, a attemptOut) error {
	if a.report != nil {
		a.report.Group = groupOf(ref, a, b.o.GroupBy)
		b.reports = append(b.reports, make([]*AttemptReport, i+1-len(b.reports))...)
		b.reports[i] = a.report
	}
	if !a.rewarded {
		return nil // reported only
	}
	for _, u := range unitsOf(a, i, ref, b.o) {
		for _, s := range u.samples {
			s.GroupUID = u.group
			for _, m := range s.ResponseMask {
				u.tokens += int(m)
			}
		}
		if b.sp != nil {
			for _, s := range u.samples {
				if err := b.sp.write(s); err != nil {
					return err
				}
			}
			b.spilled += len(u.samples)
		} else {
			b.kept = append(b.kept, u.samples)
		}
		if b.o.Report {
			b.dec = append(b.dec, u.dec)
		}
		err := b.units.add(unitRec{group: u.group, idx: b.nUnits, value: u.score, tokens: int32(u.tokens), ref: int32(i), n: int32(len(u.samples)), missing: u.missing})
		if err != nil {
			return err
		}
		b.nUnits++
	}
	return nil
}

// groups computes the advantages of the groups as sampled, one at a time:
// every unit counts, also those whose samples were all left out, so no
// exclusion moves a sibling's baseline. Each unit's outcome is sorted back
// into build order.
func (b *batch) groups() error {
	var (
		members     []unitRec
		scores, adv []float64
	)
	err := b.units.each(func(u *unitRec) error {
		if len(members) > 0 && members[0].group != u.group {
			if err := b.group(members, &scores, &adv); err != nil {
				return err
			}
			clear(members)
			members = members[:0]
		}
		members = append(members, *u)
		return nil
	})
	if err == nil && len(members) > 0 {
		err = b.group(members, &scores, &adv)
	}
	if err != nil {
		return err
	}
	b.units.close()
	return nil
}

// group computes the advantages of one group's members (scores and adv are
// buffers kept between groups) and says which are left out.
func (b *batch) group(members []unitRec, scores, adv *[]float64) error {
	held("group", len(members))
	*scores, *adv = (*scores)[:0], (*adv)[:0]
	unrewarded := false
	for _, m := range members {
		*scores, *adv = append(*scores, m.value), append(*adv, 0)
		unrewarded = unrewarded || m.missing
	}
	st := &b.res.Stats
	small := len(members) < b.o.MinGroupSize
	if small {
		st.SmallGroups++
	}
	dropped, err := advantage.Group(b.o.Estimator, *scores, *adv, advantage.Options{DropZeroVariance: b.o.DropZeroVariance})
	if err != nil {
		return fmt.Errorf("bridge: group %q: %w", members[0].group, err)
	}
	if dropped {
		st.DroppedGroups++
	}
	counted := false
	for k, m := range members {
		why := reasonNone
		switch {
		case b.o.MissingReward == MissingDropGroup && unrewarded:
			why = reasonMissingGroup
		case small:
			why = reasonSmallGroup
		case dropped:
			why = reasonZeroVariance
		}
		if why == reasonNone && m.n > 0 {
			b.toWrite += int(m.n)
			if !counted {
				st.Groups++
				counted = true
			}
		}
		if err := b.outcomes.add(unitRec{idx: m.idx, value: (*adv)[k], tokens: m.tokens, n: m.n, ref: m.ref, reason: uint8(why)}); err != nil {
			return err
		}
	}
	return nil
}

// whiten makes REINFORCE++-baseline's batch-wide whitening (over the whole
// batch, in build order) ready for hand; other estimators have none.
func (b *batch) whiten() error {
	if b.o.Estimator != advantage.ReinforcePP {
		return nil
	}
	for k, pass := range []func(a, w float64){b.white.Add, b.white.AddDeviation} {
		err := b.outcomes.each(func(x *unitRec) error {
			if x.reason != reasonZeroVariance {
				pass(x.value, float64(x.tokens))
			}
			return nil
		})
		if err == nil && k == 0 {
			if err = b.white.Mean(); err != nil {
				err = fmt.Errorf("bridge: %w", err)
			}
		}
		if err != nil {
			return err
		}
	}
	b.white.Scale()
	return nil
}

// hand hands the samples out in build order, with their advantages: to
// Result.Samples, or, when streaming, from the spill file one by one,
// decoded by a goroutine while the previous ones are emitted.
func (b *batch) hand() error {
	if b.o.Emit == nil {
		return b.outcomes.each(func(x *unitRec) error {
			return b.keep(x, b.kept[x.idx], b.collect)
		})
	}
	if err := b.sp.rewind(); err != nil {
		return err
	}
	next := b.sp.readAhead(b.spilled)
	defer next.stop()
	emit := b.o.Emit
	if b.o.Progress != nil {
		b.prog.Phase, b.prog.TotalSamples = PhaseWrite, b.toWrite
		b.o.Progress(b.prog)
		emit = func(s *Sample) error {
			if err := b.o.Emit(s); err != nil {
				return err
			}
			b.prog.Samples++
			b.o.Progress(b.prog)
			return nil
		}
	}
	var samples []*Sample
	return b.outcomes.each(func(x *unitRec) error {
		samples = samples[:0]
		for range x.n {
			s, err := next.sample()
			if err != nil {
				return err
			}
			samples = append(samples, s)
		}
		return b.keep(x, samples, emit)
	})
}

// collect appends s to Result.Samples (hand without Emit).
func (b *batch) collect(s *Sample) error {
	b.res.Samples = append(b.res.Samples, s)
	return nil
}

// keep gives the samples of unit x their advantage and emits them, or
// counts them as left out with x's reason; it reports either.
func (b *batch) keep(x *unitRec, samples []*Sample, emit func(*Sample) error) error {
	st := &b.res.Stats
	why := reasons[x.reason]
	a := x.value
	if b.o.Estimator == advantage.ReinforcePP && x.reason != reasonZeroVariance {
		a = b.white.Apply(a, float64(x.tokens))
	}
	if why == ExclZeroVariance {
		st.DroppedSamples += len(samples)
	}
	if b.o.Report {
		if rep := b.reports[x.ref]; rep != nil {
			if why != "" && b.o.Level == LevelRollout {
				rep.Reason = why
			}
			for _, d := range b.dec[x.idx] {
				rep.Items[d].Included, rep.Items[d].Reason, rep.Items[d].Advantage = why == "", why, a
			}
		}
	}
	if why != "" {
		st.Excluded[why] += len(samples)
		return nil
	}
	for _, s := range samples {
		s.Advantage = a
		b.tasks.add(s)
		st.Samples++
		if s.TokenSource == export.TokenSourceRetokenized {
			st.RetokenizedSamples++
		}
		if err := emit(s); err != nil {
			return err
		}
	}
	return nil
}

// finish fills the per-task statistics and the report of Result.
func (b *batch) finish() {
	b.res.Stats.Tasks = b.tasks.stats()
	if b.o.Report {
		b.res.Report = make([]AttemptReport, 0, len(b.reports))
		for _, r := range b.reports {
			if r != nil {
				b.res.Report = append(b.res.Report, *r)
			}
		}
	}
}
