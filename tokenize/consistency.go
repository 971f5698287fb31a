package tokenize

import (
	"cmp"
	"slices"
	"sync"

	"github.com/rollgate/rollgate/export"
)

// Turn kinds: how a call's prompt ids relate to the previous call of the same
// rollout attempt (its prompt ids followed by its response ids). Only
// TurnPrefix lets a trainer merge the two turns into one sequence safely.
const (
	// TurnFirst: the first call of the attempt (nothing to compare with).
	TurnFirst = "first"
	// TurnPrefix: the prompt starts with the previous prompt + response ids.
	TurnPrefix = "prefix"
	// TurnResend: the prompt is exactly the previous prompt (a retry or a
	// resampled branch); the previous response is not part of the context.
	TurnResend = "resend"
	// TurnTemplate: the ids differ at the boundary because of template or role
	// tokens: the divergence lies in the previous prompt's last TemplateWindow
	// ids (its generation prompt, e.g. a "<think>\n\n</think>" the template
	// adds only to the open turn), or anywhere after that with a special id
	// (TurnOptions.Special) as the first differing id on either side (an
	// end-of-turn token the response lacks or the template replaces).
	TurnTemplate = "template"
	// TurnRetokenized: the previous response's text was rendered back and
	// tokenized differently (an "H"+"AVING" that becomes "HAV"+"ING"): the
	// divergence lies inside the previous response, no special id is
	// involved, and either Decode shows the same text, or (without Decode)
	// both sides realign within ResyncWindow ids and match to the end of the
	// response, or the divergence is within the response's last
	// ResyncWindow ids.
	TurnRetokenized = "retokenized"
	// TurnEdited: the context was edited: the divergence lies in the previous
	// prompt well before its end, or in the previous response without any
	// realignment (truncated history, a summarised or rewritten turn, tool
	// call arguments parsed and re-serialised).
	TurnEdited = "edited"
	// TurnNoIDs: this call or the previous one has no prompt or response ids.
	TurnNoIDs = "no_ids"
	// TurnError: the call failed (error or HTTP status >= 400); it is not
	// compared and never serves as a previous call.
	TurnError = "error"
	// TurnUnordered: the call reached a Tracker after a later call of its
	// attempt; it was not compared (only from Tracker.Observe).
	TurnUnordered = "unordered"
)

// TurnOptions tune the classification of breaks. The zero value works; its
// windows take the defaults below.
type TurnOptions struct {
	// Special reports whether id is a template, role or end-of-turn token of
	// the model's vocabulary (e.g. <|im_start|>, <|im_end|>, <|eot_id|>).
	// Nil: no id is treated as special, and template breaks are only found
	// through TemplateWindow.
	Special func(id uint32) bool
	// Decode, when set, turns ids into text; it confirms retokenized breaks
	// (same text, different ids). A local tokenizer (package tokenize/hf) or
	// an engine's /detokenize can serve.
	Decode func(ids []uint32) (string, error)
	// TemplateWindow is how many ids at the end of the previous prompt count
	// as its generation prompt (default 8).
	TemplateWindow int
	// ResyncWindow is how many ids either side may differ before both
	// sequences realign (default 4).
	ResyncWindow int
}

func (o *TurnOptions) windows() (tw, rw int) {
	tw, rw = 8, 4
	if o != nil && o.TemplateWindow > 0 {
		tw = o.TemplateWindow
	}
	if o != nil && o.ResyncWindow > 0 {
		rw = o.ResyncWindow
	}
	return tw, rw
}

// Turn is the consistency result of one call (one sequence id).
type Turn struct {
	RolloutID, AttemptID string
	SequenceID           uint64
	// Kind is one of the Turn* constants.
	Kind string
	// PrevSequenceID is the call compared with (0 for first, error, or when
	// no earlier successful call exists).
	PrevSequenceID uint64
	// PrevChoice is the choice of the previous call whose response matched
	// this prompt best (the one the agent continued).
	PrevChoice uint32
	// PrevLen is len(previous prompt) + len(previous response).
	PrevLen int
	// PrefixLen is the length of the common prefix of the previous prompt +
	// response and this prompt.
	PrefixLen int
	// BoundaryOffset is PrefixLen - PrevLen: 0 for prefix, negative when the
	// divergence lies before the end of the previous response.
	BoundaryOffset int
	// InResponse is true when the divergence lies inside the previous response.
	InResponse bool
	// MixedSources is true when the two calls' ids have different
	// token_source values (e.g. engine and retokenized): never merge those.
	MixedSources bool
}

// Mergeable reports whether this turn extends the previous one exactly.
func (t Turn) Mergeable() bool { return t.Kind == TurnPrefix && !t.MixedSources }

// RolloutTurns summarises the turns of one rollout attempt.
type RolloutTurns struct {
	RolloutID, AttemptID string
	Calls                int
	// Counts per Turn* kind.
	Counts map[string]int
	// Mergeable is true when every call after the first successful one is a
	// prefix extension of its predecessor with the same token source.
	Mergeable bool
	// FirstBreak is the sequence id of the first call that is neither first,
	// prefix nor error (0 when none).
	FirstBreak uint64
}

// CheckTurns classifies every call of calls (llm_calls rows, any order, any
// rollouts; several choices per sequence id allowed) against the previous
// successful call of its rollout attempt, ordered by sequence_id. It returns
// one Turn per (rollout, attempt, sequence id), ordered by rollout, attempt,
// sequence id, and one summary per attempt in the same order.
func CheckTurns(calls []export.Call, opt *TurnOptions) ([]Turn, []RolloutTurns) {
	rows := slices.Clone(calls)
	slices.SortStableFunc(rows, func(a, b export.Call) int {
		return cmp.Or(cmp.Compare(a.RolloutID, b.RolloutID), cmp.Compare(a.AttemptID, b.AttemptID),
			export.CompareTurns(&a, &b))
	})
	// One call per sequence id: the try the agent received.
	if sup := export.SupersededTries(rows); sup != nil {
		kept := rows[:0]
		for i := range rows {
			if !sup[i] {
				kept = append(kept, rows[i])
			}
		}
		rows = kept
	}
	var turns []Turn
	var sums []RolloutTurns
	var prev []turnIDs // choices of the previous successful call of the attempt
	for i := 0; i < len(rows); {
		j := i + 1
		for j < len(rows) && rows[j].RolloutID == rows[i].RolloutID && rows[j].AttemptID == rows[i].AttemptID &&
			rows[j].SequenceID == rows[i].SequenceID {
			j++
		}
		cur := rows[i:j]
		newAttempt := len(sums) == 0 || sums[len(sums)-1].RolloutID != cur[0].RolloutID ||
			sums[len(sums)-1].AttemptID != cur[0].AttemptID
		if newAttempt {
			prev = nil
			sums = append(sums, RolloutTurns{RolloutID: cur[0].RolloutID, AttemptID: cur[0].AttemptID,
				Counts: map[string]int{}, Mergeable: true})
		}
		t := compareTurn(prev, cur, opt)
		if t.Kind != TurnError {
			prev = idsOf(cur)
		}
		s := &sums[len(sums)-1]
		s.Calls++
		s.Counts[t.Kind]++
		if t.Kind != TurnFirst && t.Kind != TurnError && !t.Mergeable() {
			s.Mergeable = false
			if s.FirstBreak == 0 {
				s.FirstBreak = t.SequenceID
			}
		}
		turns = append(turns, t)
		i = j
	}
	return turns, sums
}

// CompareTurn classifies the call cur (its rows, one per choice) against prev
// (the rows of the previous successful call of the same attempt, nil when
// there is none). The capture pipeline calls it through a Tracker.
func CompareTurn(prev, cur []export.Call, opt *TurnOptions) Turn {
	return compareTurn(idsOf(prev), cur, opt)
}

// turnIDs is what comparing a turn reads of one choice of the previous
// call: its ids (shared with the row), sequence id, choice and token source.
type turnIDs struct {
	seq            uint64
	retry          uint16 // export.Call.RetryCount
	choice         uint32
	source         string
	prompt, output []uint32
	// noOutput: the choice's response ids could not be obtained
	// (response_token_source none, e.g. a llama.cpp chat stream): its
	// prompt ids alone say nothing about what the next prompt continues.
	noOutput bool
}

// idsOf returns the turnIDs of rows.
func idsOf(rows []export.Call) []turnIDs {
	if len(rows) == 0 {
		return nil
	}
	out := make([]turnIDs, len(rows))
	for i := range rows {
		r := &rows[i]
		out[i] = turnIDs{seq: r.SequenceID, retry: r.RetryCount, choice: r.ChoiceIndex, source: r.TokenSource,
			prompt: r.PromptTokenIDs, output: r.ResponseTokenIDs,
			noOutput: r.ResponseTokenSource == export.TokenSourceNone && len(r.ResponseTokenIDs) == 0}
	}
	return out
}

func failed(c *export.Call) bool { return c.Error != "" || c.HTTPStatus >= 400 }

func compareTurn(prev []turnIDs, cur []export.Call, opt *TurnOptions) Turn {
	c := &cur[0]
	t := Turn{RolloutID: c.RolloutID, AttemptID: c.AttemptID, SequenceID: c.SequenceID}
	switch {
	case failed(c):
		t.Kind = TurnError
		return t
	case len(prev) == 0:
		t.Kind = TurnFirst
		return t
	}
	t.PrevSequenceID = prev[0].seq
	if len(c.PromptTokenIDs) == 0 || !hasTurnIDs(prev) {
		t.Kind = TurnNoIDs
		return t
	}
	// The choice the agent continued: the longest common prefix.
	best, bestLCP := 0, -1
	for k := range prev {
		p := &prev[k]
		if len(p.prompt) == 0 || p.noOutput {
			continue
		}
		n := lcp2(p.prompt, p.output, c.PromptTokenIDs)
		if n > bestLCP {
			best, bestLCP = k, n
		}
	}
	p := &prev[best]
	t.PrevChoice = p.choice
	t.MixedSources = p.source != c.TokenSource
	pp, pr, cp := p.prompt, p.output, c.PromptTokenIDs
	t.PrevLen = len(pp) + len(pr)
	t.PrefixLen = bestLCP
	t.BoundaryOffset = bestLCP - t.PrevLen
	t.Kind = classify(pp, pr, cp, bestLCP, opt)
	t.InResponse = t.Kind != TurnPrefix && t.Kind != TurnResend && bestLCP >= len(pp)
	return t
}

func hasTurnIDs(rows []turnIDs) bool {
	for i := range rows {
		if len(rows[i].prompt) > 0 && !rows[i].noOutput {
			return true
		}
	}
	return false
}

// at returns element i of the concatenation a+b.
func at(a, b []uint32, i int) uint32 {
	if i < len(a) {
		return a[i]
	}
	return b[i-len(a)]
}

// lcp2 is the common prefix length of a+b and c.
func lcp2(a, b, c []uint32) int {
	n := min(len(a)+len(b), len(c))
	for i := 0; i < n; i++ {
		if at(a, b, i) != c[i] {
			return i
		}
	}
	return n
}

// classify decides the kind of a turn whose common prefix with the previous
// prompt pp + response pr is d ids long.
func classify(pp, pr, cp []uint32, d int, opt *TurnOptions) string {
	end := len(pp) + len(pr)
	if d == end {
		return TurnPrefix
	}
	if d == len(pp) && len(cp) == len(pp) {
		return TurnResend
	}
	tw, rw := opt.windows()
	if d < len(pp)-tw {
		return TurnEdited
	}
	if opt != nil && opt.Special != nil {
		if opt.Special(at(pp, pr, d)) || (d < len(cp) && opt.Special(cp[d])) {
			return TurnTemplate
		}
	}
	if d < len(pp) {
		return TurnTemplate
	}
	// Divergence inside the previous response.
	tail := pr[d-len(pp):]
	rest := cp[d:]
	if opt != nil && opt.Decode != nil {
		if sameTextPrefix(tail, rest, opt.Decode) {
			return TurnRetokenized
		}
		return TurnEdited
	}
	if len(tail) <= rw {
		return TurnRetokenized
	}
	for i := 1; i <= rw && i < len(tail); i++ {
		for k := 1; k <= rw && k < len(rest); k++ {
			if hasPrefix(rest[k:], tail[i:]) {
				return TurnRetokenized
			}
		}
	}
	return TurnEdited
}

func hasPrefix(s, prefix []uint32) bool {
	return len(s) >= len(prefix) && slices.Equal(s[:len(prefix)], prefix)
}

// sameTextPrefix reports whether some prefix of rest decodes to the same text
// as tail (decode errors count as different).
func sameTextPrefix(tail, rest []uint32, decode func([]uint32) (string, error)) bool {
	want, err := decode(tail)
	if err != nil || want == "" {
		return false
	}
	// A retokenization keeps the byte length; ids may be up to one per byte.
	for m := 1; m <= len(rest) && m <= len(want); m++ {
		got, err := decode(rest[:m])
		if err != nil {
			return false
		}
		if got == want {
			return true
		}
		if len(got) > len(want) {
			return false
		}
	}
	return false
}

// Tracker classifies calls as they are captured, remembering for each rollout
// attempt the token ids of its latest successful call. Calls of one attempt are
// sequential (an agent sends the next call after reading the previous
// answer), but capture workers may assemble them out of order: a call that
// arrives after a later call of its attempt is reported as TurnUnordered
// (CheckTurns over the stored rows classifies it properly). Safe for
// concurrent use.
//
// Per attempt it keeps only what the next comparison reads (sequence id,
// choice index, token source and the id slices), not the whole rows: their
// bodies made a tracker full of finished attempts hold hundreds of MiB.
type Tracker struct {
	opt      TurnOptions
	max      int
	maxBytes int

	mu    sync.Mutex
	last  map[attemptKey][]turnIDs
	bytes int // of the ids kept in last
}

// TrackerMaxIDBytes bounds what a Tracker keeps: the token ids (4 bytes
// each), the attempts' key strings and a fixed overhead per attempt; when a
// call would take it past this, other attempts are forgotten first.
const TrackerMaxIDBytes = 32 << 20

type attemptKey struct{ rollout, attempt string }

// NewTracker returns a Tracker keeping at most maxAttempts attempts (default
// 65536) and TrackerMaxIDBytes of token ids; when full, arbitrary attempts
// are forgotten (the next call of one is then reported as first).
func NewTracker(opt TurnOptions, maxAttempts int) *Tracker {
	if maxAttempts <= 0 {
		maxAttempts = 65536
	}
	return &Tracker{opt: opt, max: maxAttempts, maxBytes: TrackerMaxIDBytes, last: map[attemptKey][]turnIDs{}}
}

// trackerEntryOverhead approximates what an attempt costs a Tracker beyond
// its ids and key strings (map entry, slice headers, turnIDs fields).
const trackerEntryOverhead = 192

// entryBytes is what an attempt's entry accounts for against maxBytes: its
// ids, its key strings (client-chosen ids) and a fixed overhead.
func entryBytes(k attemptKey, rows []turnIDs) int {
	return idBytes(rows) + len(k.rollout) + len(k.attempt) + trackerEntryOverhead
}

// idBytes is the size of the ids kept for an attempt.
func idBytes(rows []turnIDs) int {
	n := 0
	for i := range rows {
		n += 4 * (len(rows[i].prompt) + len(rows[i].output))
	}
	return n
}

// Observe classifies the rows of one call (all its choices, as capture.Rows
// returns them; rows[0] carries the attribution) and remembers them as the
// attempt's latest call. Its id slices are kept by reference and only read;
// the caller must not modify them afterwards.
func (tr *Tracker) Observe(rows []export.Call) Turn {
	if len(rows) == 0 {
		return Turn{Kind: TurnNoIDs}
	}
	k := attemptKey{rows[0].RolloutID, rows[0].AttemptID}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	prev, known := tr.last[k]
	// A later try of the latest call (a client retry, same sequence id) is
	// compared with the earlier try (TurnResend when its prompt is the
	// same), not taken for a call out of order.
	if known && (prev[0].seq > rows[0].SequenceID || prev[0].seq == rows[0].SequenceID && prev[0].retry >= rows[0].RetryCount) {
		return Turn{RolloutID: k.rollout, AttemptID: k.attempt, SequenceID: rows[0].SequenceID, Kind: TurnUnordered}
	}
	t := compareTurn(prev, rows, &tr.opt)
	if t.Kind != TurnError {
		keep := idsOf(rows)
		size := entryBytes(k, keep)
		if known {
			tr.bytes -= entryBytes(k, prev)
			delete(tr.last, k)
		}
		if size <= tr.maxBytes { // else not kept: its next call is reported as first
			for old, rs := range tr.last {
				if len(tr.last) < tr.max && tr.bytes+size <= tr.maxBytes {
					break
				}
				tr.bytes -= entryBytes(old, rs)
				delete(tr.last, old)
			}
			tr.last[k] = keep
			tr.bytes += size
		}
	}
	return t
}

// Forget drops what the tracker remembers of an attempt (call it when a
// rollout is finished).
func (tr *Tracker) Forget(rolloutID, attemptID string) {
	tr.mu.Lock()
	k := attemptKey{rolloutID, attemptID}
	if rs, ok := tr.last[k]; ok {
		tr.bytes -= entryBytes(k, rs)
		delete(tr.last, k)
	}
	tr.mu.Unlock()
}
