package bridge

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// Build selects attempts from store, assembles samples, credits rewards and
// computes advantages: the selection (to a file), one pass over the store
// (batch.read), the group statistics (batch.groups), REINFORCE++'s batch
// whitening (batch.whiten) and the samples handed out (batch.hand).
func Build(ctx context.Context, store export.Store, o Options) (*Result, error) {
	if err := o.resolve(); err != nil {
		return nil, err
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
	b := newBatch(&o, res, selected)
	defer b.close()
	if err := b.read(ctx, store, refs); err != nil {
		return nil, err
	}
	if err := b.groups(); err != nil {
		return nil, err
	}
	if err := b.whiten(); err != nil {
		return nil, err
	}
	if err := b.hand(); err != nil {
		return nil, err
	}
	b.finish()
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
