package ui

import (
	"context"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// maxShownText is how much of one message's text a page shows inline; the
// rest is on the call's raw page.
const maxShownText = 4000

// maxCallsShown is how many calls one rollout page shows; the next page
// (?after=, the last sequence id shown) reads on from there. A page reads
// its calls without their raw answers, so its memory is bounded by this
// many request bodies.
const maxCallsShown = 100

// maxRewardsRead bounds the reward rows one rollout page reads.
const maxRewardsRead = 10000

// maxAttemptsRead bounds the attempts one rollout page lists.
const maxAttemptsRead = 1000

// turnWhy explains each turn_kind that breaks a trajectory merge (the
// kinds of tokenize/consistency.go).
var turnWhy = map[string]string{
	"resend":      "the prompt repeats the previous prompt without its response (a retry or a resampled branch)",
	"template":    "the chat template renders the previous turn's boundary differently (generation prompt or end-of-turn token)",
	"retokenized": "the previous response's text was tokenized differently when sent back",
	"edited":      "the conversation history was edited (truncated, summarised or re-serialised tool arguments)",
	"no_ids":      "this call or the previous one has no token ids",
	"unordered":   "the calls of this attempt overlap in time, so no previous call can be named",
	"error":       "the call failed and is not compared",
}

// msgView is one message of the conversation.
type msgView struct {
	Role, Name, ToolCallID string
	Content, Reasoning     string
	Cut                    bool // Content or Reasoning was shortened (see the raw page)
	ToolCalls              []toolCallView
}

type toolCallView struct{ ID, Name, Arguments string }

// rewardView is one reward row.
type rewardView struct {
	Name, Source, Value string
	Seq                 uint64
	AIR                 bool
	Computed            bool // computed now by the AIR rules, not stored
}

// callView is one call (choice) of the conversation.
type callView struct {
	export.Call
	Duration     uint64
	OK           bool
	New          []msgView // request messages not shown with an earlier call
	Rewritten    bool      // the request does not extend the previous one's conversation
	Reply        msgView
	Rewards      []rewardView
	MergeBreak   bool
	MergeWhy     string
	OtherChoices int
}

// rolloutPage is the rollout template's data.
type rolloutPage struct {
	ID, Attempt, Status, Task, Group string
	Attempts                         []export.Rollout
	Calls                            []callView
	Episode                          []rewardView
	Total                            int
	Paged                            bool   // not the first page
	Next                             uint64 // ?after= of the next page, 0 when none
	PageSize                         int    // calls a page shows at most
	FirstSeq, LastSeq                uint64 // the sequence ids of the page's first and last calls
}

// serveRollout serves one page of a rollout's calls as a conversation:
// ?attempt= (default: the latest), ?after= (the sequence id the previous
// page ended with; the first page without).
func (s *Server) serveRollout(ctx *fasthttp.RequestCtx, id string) {
	if err := checkValue("rollout id", id); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad rollout id: "+err.Error()+".")
		return
	}
	a := ctx.QueryArgs()
	attempt := string(a.Peek("attempt"))
	if err := checkValue("attempt", attempt); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad attempt id: "+err.Error()+".")
		return
	}
	var after uint64
	paged := a.Has("after")
	if paged {
		var err error
		if after, err = strconv.ParseUint(string(a.Peek("after")), 10, 64); err != nil {
			s.fail(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("Bad after %q: a sequence id (the page's own link to later calls).", a.Peek("after")))
			return
		}
	}
	qctx, cancel := s.queryCtx(ctx)
	defer cancel()
	attempts, latest, found, err := s.rolloutAttempts(qctx, id)
	if err != nil {
		s.storeFailed(ctx, "rollout", err)
		return
	}
	if !found {
		s.fail(ctx, fasthttp.StatusNotFound, fmt.Sprintf("Rollout %q was not found in the store: no call, attempt or reward carries this id.", id))
		return
	}
	if attempt == "" {
		attempt = latest
	}
	var prev *export.Call // the previous page's last call: what its conversation showed
	if paged {
		if prev, err = s.store.Call(qctx, export.CallKey{RolloutID: id, AttemptID: attempt, SequenceID: after}); err != nil {
			s.storeFailed(ctx, "rollout calls", err)
			return
		}
	}
	calls, err := s.store.Calls(qctx, export.CallFilter{RolloutID: id, AttemptID: attempt, FromSequence: after + 1,
		Limit: maxCallsShown + 1, Omit: export.ReadOptions{NoResponseBody: true}})
	if err != nil {
		s.storeFailed(ctx, "rollout calls", err)
		return
	}
	var next uint64
	if len(calls) > maxCallsShown {
		// More calls follow: end the page before the last sequence id read,
		// whose other choices may not all have been read.
		last := calls[len(calls)-1].SequenceID
		keep := len(calls)
		for keep > 0 && calls[keep-1].SequenceID == last {
			keep--
		}
		if keep > 0 {
			calls = calls[:keep]
		}
		next = calls[len(calls)-1].SequenceID
	}
	p := rolloutPage{ID: id, Attempt: attempt, Attempts: attempts, Paged: paged, Next: next, PageSize: maxCallsShown}
	for _, at := range attempts {
		if at.AttemptID == attempt {
			p.Status, p.Task, p.Group = at.Status, at.TaskID, at.GroupID
		}
	}
	first, last := uint64(1), uint64(0) // no call: the episode's rewards alone
	if len(calls) > 0 {
		first, last = calls[0].SequenceID, calls[len(calls)-1].SequenceID
		p.FirstSeq, p.LastSeq = first, last
	}
	total, rewards, err := s.rolloutCounts(qctx, id, attempt, first, last)
	if err != nil {
		s.storeFailed(ctx, "rollout rewards", err)
		return
	}
	p.Total = total
	fillRolloutPage(&p, prev, calls, rewards, s.air)
	s.render(ctx, fasthttp.StatusOK, "rollout", "Rollout "+rolloutName(id), p)
}

// rolloutAttempts reads a rollout's registered attempts (the latest state
// of each) and names the attempt with the latest activity
// (export.Reader.RolloutAttempts); found is false when the store knows
// nothing of the rollout.
func (s *Server) rolloutAttempts(ctx context.Context, id string) (attempts []export.Rollout, latest string, found bool, err error) {
	l, err := s.store.RolloutAttempts(ctx, id, maxAttemptsRead)
	if err != nil {
		return nil, "", false, err
	}
	return l.Attempts, l.Latest, l.Found, nil
}

// rolloutCounts reads the number of calls of the attempt (first choices)
// and its rewards: the episode's and those of the calls first..last.
func (s *Server) rolloutCounts(ctx context.Context, id, attempt string, first, last uint64) (int, []export.Reward, error) {
	return s.store.AttemptTotals(ctx, export.AttemptTotalsQuery{RolloutID: id, AttemptID: attempt, FirstSeq: first, LastSeq: last,
		MaxRewards: maxRewardsRead})
}

// fillRolloutPage lays out one page of an attempt's calls (every choice,
// in order; prev, when set, the call the previous page ended with) and
// their rewards; e, when set, adds the automatic intermediate rewards the
// trainer bridge would compute (unless stored ones already say so), here
// over the page's calls.
func fillRolloutPage(p *rolloutPage, prev *export.Call, page []export.Call, rewards []export.Reward, e *air.Engine) {
	steps := map[uint64][]rewardView{}
	for _, r := range rewards {
		rv := rewardView{Name: r.Name, Source: r.Source, Value: strconv.FormatFloat(r.Value, 'f', -1, 64), Seq: r.SequenceID,
			AIR: len(r.Source) > 4 && r.Source[:4] == "air_"}
		if r.SequenceID == 0 {
			p.Episode = append(p.Episode, rv)
		} else {
			steps[r.SequenceID] = append(steps[r.SequenceID], rv)
		}
	}
	var calls []export.Call
	type try struct {
		seq   uint64
		retry uint16
	}
	choices := map[try]int{} // rows per try of a call (a retry is the same sequence id)
	for _, c := range page {
		choices[try{c.SequenceID, c.RetryCount}]++
		if c.ChoiceIndex == 0 {
			calls = append(calls, c)
		}
	}
	if e != nil {
		for _, r := range e.Evaluate(page, 0) {
			stored := false
			for _, have := range steps[r.SequenceID] {
				stored = stored || have.Source == r.Source
			}
			if !stored {
				steps[r.SequenceID] = append(steps[r.SequenceID], rewardView{Name: r.Name, Source: r.Source, Seq: r.SequenceID,
					Value: strconv.FormatFloat(r.Value, 'f', -1, 64), AIR: true, Computed: true})
			}
		}
	}
	shown := 0 // request messages already shown, plus the replies
	var prevMsgs []string
	if prev != nil {
		prevMsgs = rawOf(gjson.Get(prev.RequestBody, "messages").Array())
		shown = len(prevMsgs) + 1
	}
	for i, c := range calls {
		msgs := gjson.Get(c.RequestBody, "messages").Array()
		raw := rawOf(msgs)
		cv := callView{Call: c, OK: c.Error == "" && c.HTTPStatus < 300, Rewards: steps[c.SequenceID], OtherChoices: choices[try{c.SequenceID, c.RetryCount}] - 1}
		if c.EndTimeUnixNano > c.StartTimeUnixNano {
			cv.Duration = c.EndTimeUnixNano - c.StartTimeUnixNano
		}
		if why, ok := turnWhy[c.TurnKind]; ok {
			cv.MergeBreak, cv.MergeWhy = true, why
		}
		start := 0
		if (i > 0 || prev != nil) && extends(raw, prevMsgs) {
			start = min(shown, len(raw))
		} else if i > 0 || prev != nil {
			cv.Rewritten = true
		}
		if len(msgs) == 0 {
			if pr := gjson.Get(c.RequestBody, "prompt"); pr.Exists() {
				cv.New = []msgView{textMsg("prompt", pr.String())}
			}
		}
		for _, m := range msgs[start:] {
			cv.New = append(cv.New, messageView(m))
		}
		cv.Reply = replyView(c.ResponseMessage)
		shown, prevMsgs = len(raw)+1, raw
		p.Calls = append(p.Calls, cv)
	}
}

// rawOf is the raw JSON of each message.
func rawOf(msgs []gjson.Result) []string {
	raw := make([]string, len(msgs))
	for k, m := range msgs {
		raw[k] = m.Raw
	}
	return raw
}

// extends says whether msgs continues prev: prev's messages come first,
// unchanged.
func extends(msgs, prev []string) bool {
	if len(msgs) < len(prev) {
		return false
	}
	for i := range prev {
		if msgs[i] != prev[i] {
			return false
		}
	}
	return true
}

// messageView reads one request message.
func messageView(m gjson.Result) msgView {
	v := msgView{Role: m.Get("role").String(), Name: m.Get("name").String(), ToolCallID: m.Get("tool_call_id").String()}
	v.Content, v.Cut = clip(contentText(m.Get("content")))
	if r := m.Get("reasoning_content"); r.Exists() {
		var cut bool
		v.Reasoning, cut = clip(r.String())
		v.Cut = v.Cut || cut
	}
	v.ToolCalls = toolCalls(m.Get("tool_calls"))
	return v
}

// replyView reads a captured response_message (a chat message or {"text"}).
func replyView(raw string) msgView {
	if raw == "" {
		return msgView{Role: "assistant"}
	}
	m := gjson.Parse(raw)
	if t := m.Get("text"); t.Exists() && !m.Get("role").Exists() {
		return textMsg("completion", t.String())
	}
	v := messageView(m)
	if v.Role == "" {
		v.Role = "assistant"
	}
	for _, k := range []string{"reasoning", "reasoning_content"} {
		if r := m.Get(k); r.Exists() && v.Reasoning == "" {
			var cut bool
			v.Reasoning, cut = clip(r.String())
			v.Cut = v.Cut || cut
		}
	}
	return v
}

func textMsg(role, text string) msgView {
	v := msgView{Role: role}
	v.Content, v.Cut = clip(text)
	return v
}

// contentText renders a message content: a string, or the text of its
// parts with a placeholder for other kinds (images, audio).
func contentText(c gjson.Result) string {
	if !c.IsArray() {
		return c.String()
	}
	var out []byte
	for _, part := range c.Array() {
		if len(out) > 0 {
			out = append(out, '\n')
		}
		if t := part.Get("text"); t.Exists() {
			out = append(out, t.String()...)
		} else {
			out = append(out, "["+part.Get("type").String()+"]"...)
		}
		if len(out) > 2*maxShownText {
			break
		}
	}
	return string(out)
}

func toolCalls(tc gjson.Result) []toolCallView {
	var out []toolCallView
	for _, t := range tc.Array() {
		args, _ := clip(t.Get("function.arguments").String())
		out = append(out, toolCallView{ID: t.Get("id").String(), Name: t.Get("function.name").String(), Arguments: args})
	}
	return out
}

// clip shortens s to maxShownText bytes at a character boundary.
func clip(s string) (string, bool) {
	if len(s) <= maxShownText {
		return s, false
	}
	cut := maxShownText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}
