package ui

import (
	"fmt"
	"sort"
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

// maxCallsShown is how many calls one rollout page shows (the rest are
// paged with ?from=).
const maxCallsShown = 200

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
	From, Total                      int
	Next                             int // first call of the next page, 0 when none
}

// serveRollout serves a rollout's calls as a conversation.
func (s *Server) serveRollout(ctx *fasthttp.RequestCtx, id string) {
	if err := checkValue("rollout id", id); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad rollout id: "+err.Error()+".")
		return
	}
	qctx, cancel := s.queryCtx(ctx)
	defer cancel()
	det, err := s.store.Rollout(qctx, id)
	if err != nil {
		s.storeFailed(ctx, "rollout", err)
		return
	}
	if det == nil || (len(det.Attempts) == 0 && len(det.Calls) == 0 && len(det.Rewards) == 0) {
		s.fail(ctx, fasthttp.StatusNotFound, fmt.Sprintf("Rollout %q was not found in the store: no call, attempt or reward carries this id.", id))
		return
	}
	attempt := string(ctx.QueryArgs().Peek("attempt"))
	if attempt == "" {
		attempt = latestAttempt(det)
	}
	from, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("from")))
	p := buildRolloutPage(id, attempt, det, max(from, 0), s.air)
	s.render(ctx, fasthttp.StatusOK, "rollout", "Rollout "+id, p)
}

// latestAttempt is the attempt with the latest activity: its registered
// state's last update or its last call, whichever is later.
func latestAttempt(det *export.RolloutDetail) string {
	best, bestT := "", uint64(0)
	see := func(attempt string, t uint64) {
		if best == "" || t > bestT || (t == bestT && attempt > best) {
			best, bestT = attempt, t
		}
	}
	for _, a := range det.Attempts {
		see(a.AttemptID, a.UpdatedUnixNano)
	}
	for _, c := range det.Calls {
		see(c.AttemptID, c.StartTimeUnixNano)
	}
	if best == "" && len(det.Rewards) > 0 {
		best = det.Rewards[0].AttemptID
	}
	return best
}

// buildRolloutPage lays out attempt's calls from det, showing the calls
// from index from on; e, when set, adds the automatic intermediate rewards
// the trainer bridge would compute (unless stored ones already say so).
func buildRolloutPage(id, attempt string, det *export.RolloutDetail, from int, e *air.Engine) rolloutPage {
	p := rolloutPage{ID: id, Attempt: attempt, Attempts: det.Attempts, From: from}
	for _, a := range det.Attempts {
		if a.AttemptID == attempt {
			p.Status, p.Task, p.Group = a.Status, a.TaskID, a.GroupID
		}
	}
	steps := map[uint64][]rewardView{}
	for _, r := range det.Rewards {
		if r.AttemptID != attempt {
			continue
		}
		rv := rewardView{Name: r.Name, Source: r.Source, Value: strconv.FormatFloat(r.Value, 'f', -1, 64), Seq: r.SequenceID,
			AIR: len(r.Source) > 4 && r.Source[:4] == "air_"}
		if r.SequenceID == 0 {
			p.Episode = append(p.Episode, rv)
		} else {
			steps[r.SequenceID] = append(steps[r.SequenceID], rv)
		}
	}
	var calls []export.Call
	choices := map[uint64]int{}
	for _, c := range det.Calls {
		if c.AttemptID != attempt {
			continue
		}
		choices[c.SequenceID]++
		if c.ChoiceIndex == 0 {
			calls = append(calls, c)
		}
	}
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].SequenceID < calls[j].SequenceID })
	if e != nil {
		var all []export.Call
		for _, c := range det.Calls {
			if c.AttemptID == attempt {
				all = append(all, c)
			}
		}
		for _, r := range e.Evaluate(all, 0) {
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
	p.Total = len(calls)
	shown := 0 // request messages already shown, plus the replies
	var prevMsgs []string
	for i, c := range calls {
		msgs := gjson.Get(c.RequestBody, "messages").Array()
		raw := make([]string, len(msgs))
		for k, m := range msgs {
			raw[k] = m.Raw
		}
		cv := callView{Call: c, OK: c.Error == "" && c.HTTPStatus < 300, Rewards: steps[c.SequenceID], OtherChoices: choices[c.SequenceID] - 1}
		if c.EndTimeUnixNano > c.StartTimeUnixNano {
			cv.Duration = c.EndTimeUnixNano - c.StartTimeUnixNano
		}
		if why, ok := turnWhy[c.TurnKind]; ok {
			cv.MergeBreak, cv.MergeWhy = true, why
		}
		start := 0
		if i > 0 && extends(raw, prevMsgs) {
			start = min(shown, len(raw))
		} else if i > 0 {
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
		if i >= from && i < from+maxCallsShown {
			p.Calls = append(p.Calls, cv)
		}
	}
	if from+maxCallsShown < len(calls) {
		p.Next = from + maxCallsShown
	}
	return p
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
