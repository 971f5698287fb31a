package tokenize

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// Toy ids for the consistency tests: 1000+ are special (template) tokens.
const (
	imStart = 1000
	imEnd   = 1001
	think   = 1002
)

func special(id uint32) bool { return id >= 1000 }

func u(ids ...uint32) []uint32 { return ids }

func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func call(seq uint64, prompt, resp []uint32) export.Call {
	return export.Call{RolloutID: "r", AttemptID: "a", SequenceID: seq, PromptTokenIDs: prompt, ResponseTokenIDs: resp,
		TokenSource: export.TokenSourceEngine}
}

// toyDecode decodes ids with a fixed table: id 10+i is the letter 'a'+i, and
// the pairs 40 = "ha", 41 = "ving", 42 = "hav", 43 = "ing" exist so that
// "having" = 40 41 = 42 43.
func toyDecode(ids []uint32) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id >= 10 && id < 36:
			b.WriteByte(byte('a' + id - 10))
		case id == 40:
			b.WriteString("ha")
		case id == 41:
			b.WriteString("ving")
		case id == 42:
			b.WriteString("hav")
		case id == 43:
			b.WriteString("ing")
		case id >= 1000:
			b.WriteString(fmt.Sprintf("<%d>", id))
		default:
			return "", fmt.Errorf("toy: unknown id %d", id)
		}
	}
	return b.String(), nil
}

func TestCompareTurn(t *testing.T) {
	sys := u(imStart, 1, 2, 3, imEnd, 4)           // system turn
	user := u(imStart, 5, 6, 7, 8, 9, imEnd, 4)    // user turn
	gen := u(imStart, 11)                          // generation prompt "<|im_start|>assistant"
	p1 := cat(sys, user, gen)                      // first prompt
	r1 := u(20, 21, 22, 23, 24, 25, 26, 27, imEnd) // response with end of turn
	next := u(4, imStart, 5, 9, imEnd, 4, imStart, 11)
	long := slices.Repeat(u(30), 20)

	type tc struct {
		name       string
		prev       []export.Call
		cur        export.Call
		opt        *TurnOptions
		kind       string
		prefix     int
		offset     int
		inResponse bool
	}
	sp := &TurnOptions{Special: special}
	dec := &TurnOptions{Special: special, Decode: toyDecode}
	cases := []tc{
		{name: "first", cur: call(1, p1, r1), kind: TurnFirst},
		{name: "prefix", prev: []export.Call{call(1, p1, r1)}, cur: call(2, cat(p1, r1, next), nil),
			kind: TurnPrefix, prefix: len(p1) + len(r1)},
		{name: "prefix, empty response", prev: []export.Call{call(1, p1, nil)}, cur: call(2, cat(p1, next), nil),
			kind: TurnPrefix, prefix: len(p1)},
		{name: "resend (retry)", prev: []export.Call{call(1, p1, r1)}, cur: call(2, p1, nil),
			kind: TurnResend, prefix: len(p1), offset: -len(r1)},
		// The response stopped on a stop string: no <|im_end|>; the template writes one.
		{name: "template: missing end of turn (special)", prev: []export.Call{call(1, p1, r1[:8])},
			cur: call(2, cat(p1, r1[:7], u(imEnd), next), nil), opt: sp,
			kind: TurnTemplate, prefix: len(p1) + 7, offset: -1, inResponse: true},
		// Qwen3: the reasoning block is dropped from history.
		{name: "template: reasoning stripped", prev: []export.Call{call(1, p1, cat(u(think, 50, 51, think), r1))},
			cur: call(2, cat(p1, r1, next), nil), opt: sp,
			kind: TurnTemplate, prefix: len(p1), offset: -len(r1) - 4, inResponse: true},
		// The generation prompt had "<think></think>" that history does not keep.
		{name: "template: generation prompt differs", prev: []export.Call{call(1, cat(p1, u(60, 61)), r1)},
			cur: call(2, cat(p1, r1, next), nil), opt: sp,
			kind: TurnTemplate, prefix: len(p1), offset: -len(r1) - 2},
		{name: "template: generation prompt differs, no specials", prev: []export.Call{call(1, cat(p1, u(60, 61)), r1)},
			cur:  call(2, cat(p1, r1, next), nil),
			kind: TurnTemplate, prefix: len(p1), offset: -len(r1) - 2},
		// "having" sampled as ha+ving, retokenised as hav+ing at the end of the response.
		{name: "retokenized tail (realigns)", prev: []export.Call{call(1, p1, cat(long, u(40, 41), r1[8:]))},
			cur: call(2, cat(p1, long, u(42, 43), r1[8:], next), nil), opt: sp,
			kind: TurnRetokenized, prefix: len(p1) + 20, offset: -3, inResponse: true},
		{name: "retokenized tail (at the very end)", prev: []export.Call{call(1, p1, cat(long, u(40, 41)))},
			cur: call(2, cat(p1, long, u(42, 43), next), nil), opt: sp,
			kind: TurnRetokenized, prefix: len(p1) + 20, offset: -2, inResponse: true},
		{name: "retokenized mid-response (realigns)", prev: []export.Call{call(1, p1, cat(u(40, 41), long))},
			cur:  call(2, cat(p1, u(42, 43), long, next), nil),
			kind: TurnRetokenized, prefix: len(p1), offset: -22, inResponse: true},
		{name: "retokenized confirmed by decode", prev: []export.Call{call(1, p1, cat(long, u(40, 41), r1))},
			cur: call(2, cat(p1, long, u(42, 43), r1, next), nil), opt: dec,
			kind: TurnRetokenized, prefix: len(p1) + 20, offset: -2 - len(r1), inResponse: true},
		{name: "decode says the text differs", prev: []export.Call{call(1, p1, cat(long, u(40, 41), r1))},
			cur: call(2, cat(p1, long, u(42, 44), r1, next), nil), opt: dec,
			kind: TurnEdited, prefix: len(p1) + 20, offset: -2 - len(r1), inResponse: true},
		// Tool-call arguments re-serialised: a different text of a different length.
		{name: "edited response (no realignment)", prev: []export.Call{call(1, p1, cat(long, r1))},
			cur: call(2, cat(p1, u(31, 32, 33, 34, 35, 36, 37, 38), next), nil), opt: sp,
			kind: TurnEdited, prefix: len(p1), offset: -len(long) - len(r1), inResponse: true},
		// History truncated: the system turn was removed.
		{name: "edited context (early divergence)", prev: []export.Call{call(1, p1, r1)},
			cur: call(2, cat(user, gen, r1, next), nil), opt: sp,
			kind: TurnEdited, prefix: 1, offset: 1 - len(p1) - len(r1)},
		{name: "edited context, special at divergence far before boundary", prev: []export.Call{call(1, cat(sys, sys, user, gen), r1)},
			cur: call(2, cat(sys, user, gen, r1, next), nil), opt: sp,
			kind: TurnEdited, prefix: len(sys) + 1, offset: len(sys) + 1 - len(sys)*2 - len(user) - len(gen) - len(r1)},
		{name: "no ids in this call", prev: []export.Call{call(1, p1, r1)}, cur: call(2, nil, nil), kind: TurnNoIDs},
		{name: "no ids in previous call", prev: []export.Call{call(1, nil, nil)}, cur: call(2, p1, r1), kind: TurnNoIDs},
		{name: "error call", prev: []export.Call{call(1, p1, r1)},
			cur: func() export.Call { c := call(2, p1, nil); c.HTTPStatus = 500; return c }(), kind: TurnError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := CompareTurn(c.prev, []export.Call{c.cur}, c.opt)
			if got.Kind != c.kind {
				t.Fatalf("kind = %q, want %q (%+v)", got.Kind, c.kind, got)
			}
			if c.kind == TurnFirst || c.kind == TurnNoIDs || c.kind == TurnError {
				return
			}
			if got.PrefixLen != c.prefix || got.BoundaryOffset != c.offset || got.InResponse != c.inResponse {
				t.Fatalf("prefix %d offset %d inResponse %v, want %d %d %v", got.PrefixLen, got.BoundaryOffset, got.InResponse,
					c.prefix, c.offset, c.inResponse)
			}
			if got.Mergeable() != (c.kind == TurnPrefix) {
				t.Fatalf("Mergeable = %v", got.Mergeable())
			}
		})
	}
}

// TestCompareTurnChoosesContinuedChoice: with n=2 the agent continued choice 1.
func TestCompareTurnChoosesContinuedChoice(t *testing.T) {
	p := u(1, 2, 3)
	c0, c1 := call(1, p, u(7, 8)), call(1, p, u(9, 10))
	c1.ChoiceIndex = 1
	got := CompareTurn([]export.Call{c0, c1}, []export.Call{call(2, u(1, 2, 3, 9, 10, 11), nil)}, nil)
	if got.Kind != TurnPrefix || got.PrevChoice != 1 || got.PrevSequenceID != 1 {
		t.Fatalf("got %+v", got)
	}
	// Mixed sources are never mergeable.
	cur := call(2, u(1, 2, 3, 9, 10, 11), nil)
	cur.TokenSource = export.TokenSourceRetokenized
	got = CompareTurn([]export.Call{c0, c1}, []export.Call{cur}, nil)
	if got.Kind != TurnPrefix || !got.MixedSources || got.Mergeable() {
		t.Fatalf("mixed: %+v", got)
	}
}

func TestCheckTurns(t *testing.T) {
	p1, r1 := u(1, 2, 3), u(4, 5)
	p2 := cat(p1, r1, u(6))
	r2 := u(7)
	p3 := cat(p2, r2, u(8))
	failedCall := call(3, p3, nil)
	failedCall.Error = "upstream: connection reset"
	other := func(c export.Call, attempt string) export.Call { c.AttemptID = attempt; return c }
	rows := []export.Call{
		// Deliberately unordered, with a second attempt interleaved.
		call(4, p3, u(9)),
		other(call(2, u(1, 99), nil), "b"),
		call(2, p2, r2),
		failedCall,
		other(call(1, p1, r1), "b"),
		call(1, p1, r1),
		call(5, u(1, 2, 3, 4, 5, 6), nil), // history edited back
	}
	turns, sums := CheckTurns(rows, &TurnOptions{TemplateWindow: 1})
	var got []string
	for _, tr := range turns {
		got = append(got, fmt.Sprintf("%s/%d:%s", tr.AttemptID, tr.SequenceID, tr.Kind))
	}
	want := []string{"a/1:first", "a/2:prefix", "a/3:error", "a/4:prefix", "a/5:edited", "b/1:first", "b/2:edited"}
	if !slices.Equal(got, want) {
		t.Fatalf("turns\n got %v\nwant %v", got, want)
	}
	if turns[3].PrevSequenceID != 2 {
		t.Fatalf("call after the failed one compared with %d, want 2", turns[3].PrevSequenceID)
	}
	if len(sums) != 2 {
		t.Fatalf("summaries %+v", sums)
	}
	a := sums[0]
	if a.AttemptID != "a" || a.Calls != 5 || a.Mergeable || a.FirstBreak != 5 ||
		a.Counts[TurnPrefix] != 2 || a.Counts[TurnError] != 1 || a.Counts[TurnEdited] != 1 || a.Counts[TurnFirst] != 1 {
		t.Fatalf("summary a %+v", a)
	}
	// Only the clean calls: mergeable.
	_, sums = CheckTurns(rows[2:6], nil)
	if len(sums) != 2 || !sums[0].Mergeable || sums[0].FirstBreak != 0 || sums[1].Mergeable != true {
		t.Fatalf("clean summaries %+v", sums)
	}
}

func TestTracker(t *testing.T) {
	tr := NewTracker(TurnOptions{}, 2)
	p1, r1 := u(1, 2, 3), u(4, 5)
	obs := func(c export.Call) string { return tr.Observe([]export.Call{c}).Kind }
	if k := obs(call(1, p1, r1)); k != TurnFirst {
		t.Fatal(k)
	}
	if k := obs(call(3, cat(p1, r1, u(6)), u(7))); k != TurnPrefix {
		t.Fatal(k)
	}
	if k := obs(call(2, p1, nil)); k != TurnUnordered {
		t.Fatal(k)
	}
	tr.Forget("r", "a")
	if k := obs(call(4, u(1), nil)); k != TurnFirst {
		t.Fatal(k)
	}
	// Capacity 2: a third attempt evicts one; the tracker stays bounded.
	for _, at := range []string{"x", "y", "z"} {
		c := call(1, p1, r1)
		c.AttemptID = at
		tr.Observe([]export.Call{c})
	}
	if n := len(tr.last); n > 2 {
		t.Fatalf("tracker holds %d attempts", n)
	}
	if k := tr.Observe(nil).Kind; k != TurnNoIDs {
		t.Fatal(k)
	}
}

// TestTrackerConcurrent runs attempts in parallel (for -race): each attempt's
// calls arrive in order, so every turn after the first is a prefix.
func TestTrackerConcurrent(t *testing.T) {
	tr := NewTracker(TurnOptions{}, 0)
	var wg sync.WaitGroup
	errs := make(chan string, 8)
	for g := range 8 {
		wg.Go(func() {
			prompt := u(uint32(g))
			for seq := uint64(1); seq <= 50; seq++ {
				c := call(seq, prompt, u(uint32(seq)))
				c.AttemptID = fmt.Sprint(g)
				k := tr.Observe([]export.Call{c}).Kind
				if (seq == 1 && k != TurnFirst) || (seq > 1 && k != TurnPrefix) {
					errs <- fmt.Sprintf("attempt %d seq %d: %s", g, seq, k)
					return
				}
				prompt = cat(prompt, u(uint32(seq)), u(7))
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func BenchmarkCompareTurn(b *testing.B) {
	p := slices.Repeat(u(1, 2, 3, 4), 2000)
	r := slices.Repeat(u(5), 500)
	prev := []export.Call{call(1, p, r)}
	cur := []export.Call{call(2, cat(p, r, u(6, 7)), nil)}
	b.ReportAllocs()
	for b.Loop() {
		if CompareTurn(prev, cur, nil).Kind != TurnPrefix {
			b.Fatal("not prefix")
		}
	}
}

// TestTrackerKeepsOnlyIDs: the tracker keeps the ids a comparison needs (its
// turnIDs hold no bodies), and at most maxBytes of them: older attempts are
// forgotten to make room, and a call larger than the whole budget is not kept.
func TestTrackerKeepsOnlyIDs(t *testing.T) {
	tr := NewTracker(TurnOptions{}, 0)
	big := make([]uint32, 30)
	// Room for three attempts of 32 ids with their keys and overhead.
	tr.maxBytes = 3*(32*4+len(call(1, nil, nil).RolloutID)+1+trackerEntryOverhead) + 40
	for a := range 10 {
		c := call(1, big, u(1, 2))
		c.AttemptID = fmt.Sprint(a)
		c.RequestBody, c.ResponseBody, c.ResponseMessage = "req", "resp", "msg"
		tr.Observe([]export.Call{c})
		sum := 0
		for k, rows := range tr.last {
			sum += entryBytes(k, rows)
		}
		if tr.bytes != sum || tr.bytes > tr.maxBytes {
			t.Fatalf("after %d attempts: %d bytes counted, %d kept, budget %d", a+1, tr.bytes, sum, tr.maxBytes)
		}
	}
	if n := len(tr.last); n != 3 { // 32 ids each: 3 fit in 100
		t.Fatalf("%d attempts kept, want 3", n)
	}
	// The latest attempt is still compared: its next turn extends it.
	c := call(2, cat(big, u(1, 2), u(9)), u(3))
	c.AttemptID = "9"
	if k := tr.Observe([]export.Call{c}).Kind; k != TurnPrefix {
		t.Fatalf("next turn of a kept attempt: %s, want %s", k, TurnPrefix)
	}
	// A call with more ids than the budget is classified but not kept.
	huge := call(1, make([]uint32, 400), nil)
	huge.AttemptID = "huge"
	tr.Observe([]export.Call{huge})
	if _, ok := tr.last[attemptKey{huge.RolloutID, "huge"}]; ok || tr.bytes > tr.maxBytes {
		t.Fatalf("a call over the budget was kept (%d bytes)", tr.bytes)
	}
	if n := len(tr.last); n != 3 {
		t.Fatalf("a call over the budget evicted others: %d attempts left, want 3", n)
	}
	tr.Forget(c.RolloutID, "9")
	sum := 0
	for k, rows := range tr.last {
		sum += entryBytes(k, rows)
	}
	if tr.bytes != sum {
		t.Fatalf("after Forget: %d bytes counted, %d kept", tr.bytes, sum)
	}
}

// TestTrackerCountsKeys: client-chosen ids are part of what an attempt costs,
// so many attempts with long ids and few token ids stay within the budget.
func TestTrackerCountsKeys(t *testing.T) {
	tr := NewTracker(TurnOptions{}, 1<<20)
	tr.maxBytes = 64 << 10
	long := strings.Repeat("r", 4096)
	for a := range 1000 {
		c := call(1, u(1, 2), u(3))
		c.RolloutID, c.AttemptID = long+fmt.Sprint(a), "1"
		tr.Observe([]export.Call{c})
	}
	keyBytes := 0
	for k := range tr.last {
		keyBytes += len(k.rollout) + len(k.attempt)
	}
	if keyBytes > tr.maxBytes || tr.bytes > tr.maxBytes {
		t.Fatalf("%d attempts hold %d bytes of keys (%d counted), budget %d", len(tr.last), keyBytes, tr.bytes, tr.maxBytes)
	}
}

// TestTurnWithoutResponseIDs: a previous call whose response ids could not be
// obtained (response_token_source none) is not compared by its prompt alone: the
// next call is no_ids, not a prefix of the prompt. Rows stored before the column
// existed (”) keep the old reading.
func TestTurnWithoutResponseIDs(t *testing.T) {
	p1 := u(1, 2, 3)
	prev := call(1, p1, nil)
	prev.ResponseTokenSource = export.TokenSourceNone
	cur := call(2, cat(p1, u(4, 5, 6)), u(7))
	if k := CompareTurn([]export.Call{prev}, []export.Call{cur}, nil).Kind; k != TurnNoIDs {
		t.Fatalf("kind %s", k)
	}
	prev.ResponseTokenSource = ""
	if k := CompareTurn([]export.Call{prev}, []export.Call{cur}, nil).Kind; k != TurnPrefix {
		t.Fatalf("old row: kind %s", k)
	}
}

// TestTrackerRetries: a later try of the latest call (same sequence id, a
// higher retry_count) is one call tried again, compared with the earlier
// try (resend), not a call out of order; the same try again, or an earlier
// one, is still out of order.
func TestTrackerRetries(t *testing.T) {
	tr := NewTracker(TurnOptions{}, 0)
	p1, r1 := u(1, 2, 3), u(4, 5)
	obs := func(c export.Call) string { return tr.Observe([]export.Call{c}).Kind }
	if k := obs(call(1, p1, r1)); k != TurnFirst {
		t.Fatal(k)
	}
	retry := call(1, p1, r1)
	retry.RetryCount = 1
	if k := obs(retry); k != TurnResend {
		t.Fatalf("a retry of the latest call: %s, want %s", k, TurnResend)
	}
	if k := obs(retry); k != TurnUnordered {
		t.Fatalf("the same try again: %s, want %s", k, TurnUnordered)
	}
	if k := obs(call(1, p1, r1)); k != TurnUnordered {
		t.Fatalf("an earlier try after a later one: %s, want %s", k, TurnUnordered)
	}
	if k := obs(call(2, cat(p1, r1, u(6)), u(7))); k != TurnPrefix {
		t.Fatalf("the next call: %s, want %s", k, TurnPrefix)
	}
}

// TestCheckTurnsRetries: CheckTurns over stored rows takes the tries of one
// sequence id as one call, the try the agent received: a failed first try
// neither hides the call nor breaks the next turn.
func TestCheckTurnsRetries(t *testing.T) {
	p1, r1 := u(1, 2, 3), u(4, 5)
	try1 := call(1, p1, r1)
	try1.RetryCount = 1
	try0 := call(1, nil, nil)
	try0.HTTPStatus, try0.Error = 499, "client disconnected before the response"
	turns, sums := CheckTurns([]export.Call{try0, try1, call(2, cat(p1, r1, u(6)), u(7))}, &TurnOptions{})
	var kinds []string
	for _, tn := range turns {
		kinds = append(kinds, tn.Kind)
	}
	if len(turns) != 2 || kinds[0] != TurnFirst || kinds[1] != TurnPrefix || sums[0].Calls != 2 || !sums[0].Mergeable {
		t.Fatalf("turns %v, summary %+v; want [first prefix], 2 calls, mergeable", kinds, sums[0])
	}
}
