// Package air computes automatic intermediate rewards (AIR): rules over the
// captured llm_calls rows of a rollout attempt that turn what the gateway can
// see (malformed tool arguments, truncated answers, backend errors, failing
// tool results, loops) into per-call rewards. Outcomes are export.Reward rows
// with Source = the rule name and SequenceID = the call's, so they can be
// written to the rewards table and inspected with SQL.
package air

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/internal/jsonscan"
)

// Rule names (the Source of the reward rows).
const (
	RuleToolArgs     = "air_tool_args"     // tool-call arguments not valid JSON, unknown tool, or not matching the declared schema
	RuleTruncated    = "air_truncated"     // finish_reason = length
	RuleBackendError = "air_backend_error" // error / non-2xx status / empty output
	RuleToolFailure  = "air_tool_failure"  // the tool result in the next request signals failure
	RuleRepeat       = "air_repeat"        // the same call repeated in a loop
	RuleToolSpan     = "air_tool_span"     // the agent reported (OTLP) a tool span with status error
)

// RuleNames lists every rule in a fixed order.
var RuleNames = []string{RuleToolArgs, RuleTruncated, RuleBackendError, RuleToolFailure, RuleRepeat, RuleToolSpan}

// DefaultFailurePatterns are the tool-result patterns that signal failure
// when Config.FailurePatterns is empty.
var DefaultFailurePatterns = []string{
	`(?i)^\s*(error|exception|fatal)\b`,
	`(?i)traceback \(most recent call last\)`,
	`(?i)\b(command not found|no such file or directory|permission denied|timed out|connection refused)\b`,
	`(?i)"(error|status)"\s*:\s*"(error|failed|failure)"`,
	`(?i)"error"\s*:\s*\{`,
}

// Rule is one rule's setting.
type Rule struct {
	Enabled bool
	Weight  float64 // the reward value of a hit (usually negative)
}

// Config selects and weighs the rules.
type Config struct {
	Rules map[string]Rule
	// FailurePatterns are regular expressions matched against tool results;
	// empty = DefaultFailurePatterns.
	FailurePatterns []string
	// MinRepeats is the run length from which identical consecutive calls
	// are hits (2 = the first repetition is a hit; default 2).
	MinRepeats int
	// RewardName is the Name of the reward rows (default "air").
	RewardName string
}

// DefaultConfig enables every rule with weight -0.5 (-1 for backend errors).
func DefaultConfig() Config {
	return Config{Rules: map[string]Rule{
		RuleToolArgs:     {Enabled: true, Weight: -0.5},
		RuleTruncated:    {Enabled: true, Weight: -0.5},
		RuleBackendError: {Enabled: true, Weight: -1},
		RuleToolFailure:  {Enabled: true, Weight: -0.5},
		RuleRepeat:       {Enabled: true, Weight: -0.5},
		RuleToolSpan:     {Enabled: true, Weight: -0.5},
	}}
}

// Engine evaluates a Config.
type Engine struct {
	cfg      Config
	patterns []pattern
	decls    *declCache // tool declarations decoded lately (read-only, shared by the requests that repeat them)
}

// New compiles cfg.
func New(cfg Config) (*Engine, error) {
	for name := range cfg.Rules {
		if !known(name) {
			return nil, fmt.Errorf("air: unknown rule %q (one of %s)", name, strings.Join(RuleNames, ", "))
		}
	}
	pats := cfg.FailurePatterns
	if len(pats) == 0 {
		pats = DefaultFailurePatterns
	}
	e := &Engine{cfg: cfg, decls: &declCache{}}
	for _, p := range pats {
		pat, err := compilePattern(p)
		if err != nil {
			return nil, fmt.Errorf("air: failure pattern %q: %w", p, err)
		}
		e.patterns = append(e.patterns, pat)
	}
	if e.cfg.MinRepeats < 2 {
		e.cfg.MinRepeats = 2
	}
	if e.cfg.RewardName == "" {
		e.cfg.RewardName = "air"
	}
	return e, nil
}

func known(name string) bool {
	for _, n := range RuleNames {
		if n == name {
			return true
		}
	}
	return false
}

func (e *Engine) on(rule string) bool { return e.cfg.Rules[rule].Enabled }

// Evaluate applies the enabled rules to calls, which may hold several
// rollouts and attempts in any order. It returns one reward row per (rollout,
// attempt, sequence id, rule) that hit — a rule hitting on several choices of
// one request counts once — stamped with timeUnixNano, ordered by rollout,
// attempt, sequence id and rule order.
func (e *Engine) Evaluate(calls []export.Call, timeUnixNano uint64) []export.Reward {
	return e.EvaluateSpans(calls, nil, timeUnixNano)
}

// Enabled reports whether a rule is on.
func (e *Engine) Enabled(rule string) bool { return e.on(rule) }

// ReadsRequests reports whether an enabled rule reads the calls' request
// bodies (tool declarations, tool results, repeats); the others read only
// the response message, status and finish reason.
func (e *Engine) ReadsRequests() bool {
	return e.on(RuleToolArgs) || e.on(RuleToolFailure) || e.on(RuleRepeat)
}

// EvaluateSpans is Evaluate with the agent's own spans (agent_spans rows, any
// rollouts): a tool span with status error is a hit of air_tool_span on the
// call that asked for the tool — the call whose tool_calls carry the span's
// gen_ai.tool.call.id, else the last call of the attempt that ended before
// the span started.
func (e *Engine) EvaluateSpans(calls []export.Call, spans []export.Span, timeUnixNano uint64) []export.Reward {
	type key struct{ r, a string }
	bySpan := map[key][]export.Span{}
	for _, s := range spans {
		k := key{s.RolloutID, s.AttemptID}
		bySpan[k] = append(bySpan[k], s)
	}
	if len(calls) > 0 && oneAttemptInOrder(calls) {
		// One attempt's calls in order (what the trainer bridge passes):
		// read in place, not copied.
		if out := e.attempt(calls, bySpan[key{calls[0].RolloutID, calls[0].AttemptID}], timeUnixNano); len(out) > 0 {
			return out
		}
		return nil
	}
	groups := map[key][]export.Call{}
	var keys []key
	for _, c := range calls {
		k := key{c.RolloutID, c.AttemptID}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], c)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].r != keys[j].r {
			return keys[i].r < keys[j].r
		}
		return keys[i].a < keys[j].a
	})
	var out []export.Reward
	for _, k := range keys {
		g := groups[k]
		sort.SliceStable(g, func(i, j int) bool { return callBefore(&g[i], &g[j]) })
		out = append(out, e.attempt(g, bySpan[key{k.r, k.a}], timeUnixNano)...)
	}
	return out
}

// callBefore orders an attempt's calls by sequence id, then choice.
func callBefore(a, b *export.Call) bool { return export.CompareTurns(a, b) < 0 }

// oneAttemptInOrder reports whether calls are of one attempt and ordered by
// callBefore (ties in any order).
func oneAttemptInOrder(calls []export.Call) bool {
	for i := 1; i < len(calls); i++ {
		if calls[i].RolloutID != calls[0].RolloutID || calls[i].AttemptID != calls[0].AttemptID || callBefore(&calls[i], &calls[i-1]) {
			return false
		}
	}
	return true
}

// parsed is what the rules need from one call row.
type parsed struct {
	c         *export.Call // not modified
	msg       message      // the response message
	reqMsgs   []message
	tools     map[string]map[string]any // declared tool name -> parameters schema (nil = no schema); read-only, shared with other calls (declCache)
	toolsSeen bool                      // the request declared tools
	reqDone   bool                      // reqMsgs, tools and toolsSeen are read (request)
}

type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  []toolCall      `json:"tool_calls"`
}

type toolCall struct {
	ID       string `json:"id"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// text is the content as plain text: a string, or the text parts of a list.
// A string is unquoted as json.Unmarshal unquotes it; the rest is
// textDecoded's.
func (m message) text() string {
	if len(m.Content) > 0 && m.Content[0] == '"' {
		if end, ok := jsonscan.ValidValue(m.Content, 0); ok && end == len(m.Content) {
			return unquote(m.Content[1 : end-1])
		}
	}
	return m.textDecoded()
}

// textDecoded is text, with encoding/json.
func (m message) textDecoded() string {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(m.Content)
}

// parse reads the response message; the request body is read by request,
// when a rule first needs it (a call with tool calls, or the request after
// one): most calls make no tool calls, and their request bodies, which
// repeat the whole conversation so far, are never decoded. The response
// message is decoded as json.Unmarshal decodes it (decodeMessage).
func parse(c *export.Call) parsed {
	p := parsed{c: c}
	decodeMessage(c.ResponseMessage, &p.msg)
	return p
}

// attempt evaluates the calls of one attempt, ordered by callBefore, which
// it does not modify.
func (e *Engine) attempt(calls []export.Call, spans []export.Span, now uint64) []export.Reward {
	ps := make([]parsed, len(calls))
	for i := range calls {
		ps[i] = parse(&calls[i])
	}
	type hit struct {
		seq  uint64
		rule int
	}
	hits := map[hit]bool{}
	add := func(seq uint64, rule string) {
		for i, n := range RuleNames {
			if n == rule {
				hits[hit{seq, i}] = true
			}
		}
	}
	// next[i] is the index of the first call of the next request (higher sequence id).
	next := make([]int, len(ps))
	j := len(ps)
	for i := len(ps) - 1; i >= 0; i-- {
		if i+1 < len(ps) && ps[i+1].c.SequenceID != ps[i].c.SequenceID {
			j = i + 1
		}
		next[i] = j
	}
	prevSig, run := "", 0
	var prevSeq uint64
	superseded := export.SupersededTries(calls)
	for i := range ps {
		p := &ps[i]
		c := p.c
		if superseded != nil && superseded[i] {
			continue // a try the agent retried and recovered from: no rule judges it
		}
		failed := c.Error != "" || c.HTTPStatus >= 300
		if e.on(RuleBackendError) && (failed || (len(p.msg.ToolCalls) == 0 && len(c.ResponseTokenIDs) == 0 && p.msg.text() == "")) {
			add(c.SequenceID, RuleBackendError)
		}
		if failed {
			continue
		}
		if e.on(RuleTruncated) && c.FinishReason == "length" {
			add(c.SequenceID, RuleTruncated)
		}
		if e.on(RuleToolArgs) && e.badToolArgs(p) {
			add(c.SequenceID, RuleToolArgs)
		}
		if e.on(RuleToolFailure) && next[i] < len(ps) && e.toolFailed(p, &ps[next[i]]) {
			add(c.SequenceID, RuleToolFailure)
		}
		if e.on(RuleRepeat) && c.ChoiceIndex == 0 {
			sig := signature(p.msg)
			if sig != "" && sig == prevSig && c.SequenceID != prevSeq {
				run++
			} else {
				run = 1
			}
			if run >= e.cfg.MinRepeats {
				add(c.SequenceID, RuleRepeat)
			}
			prevSig, prevSeq = sig, c.SequenceID
		}
	}
	if e.on(RuleToolSpan) {
		for _, sp := range spans {
			if sp.StatusCode != "error" || (sp.ToolName == "" && sp.ToolCallID == "") {
				continue
			}
			if seq, ok := issuer(ps, sp); ok {
				add(seq, RuleToolSpan)
			}
		}
	}
	out := make([]export.Reward, 0, len(hits))
	for h := range hits {
		out = append(out, export.Reward{RolloutID: calls[0].RolloutID, AttemptID: calls[0].AttemptID, SequenceID: h.seq,
			Name: e.cfg.RewardName, Value: e.cfg.Rules[RuleNames[h.rule]].Weight, Source: RuleNames[h.rule], TimeUnixNano: now})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].SequenceID != out[j].SequenceID {
			return out[i].SequenceID < out[j].SequenceID
		}
		return ruleIndex(out[i].Source) < ruleIndex(out[j].Source)
	})
	return out
}

// issuer finds the call (ps sorted by sequence id) that asked for the tool
// call a span reports.
func issuer(ps []parsed, sp export.Span) (uint64, bool) {
	if sp.ToolCallID != "" {
		for _, p := range ps {
			for _, tc := range p.msg.ToolCalls {
				if tc.ID == sp.ToolCallID {
					return p.c.SequenceID, true
				}
			}
		}
	}
	var seq uint64
	found := false
	for _, p := range ps {
		if p.c.EndTimeUnixNano != 0 && p.c.EndTimeUnixNano <= sp.StartTimeUnixNano {
			seq, found = p.c.SequenceID, true
		}
	}
	return seq, found
}

func ruleIndex(name string) int {
	for i, n := range RuleNames {
		if n == name {
			return i
		}
	}
	return len(RuleNames)
}

// badToolArgs: a tool call whose arguments are not a JSON object, name a tool
// the request did not declare, or do not match its parameters schema.
func (e *Engine) badToolArgs(p *parsed) bool {
	if len(p.msg.ToolCalls) > 0 {
		p.request(e.decls)
	}
	for _, tc := range p.msg.ToolCalls {
		v, ok := toolArgs(tc.Function.Arguments)
		if !ok {
			return true
		}
		if !p.toolsSeen {
			continue
		}
		schema, declared := p.tools[tc.Function.Name]
		if !declared {
			return true
		}
		if checkSchema(schema, v, "$") != "" {
			return true
		}
	}
	return false
}

// toolFailed: one of p's tool calls has, in the next request, a tool message
// (matched by tool_call_id) whose content matches a failure pattern.
func (e *Engine) toolFailed(p, next *parsed) bool {
	if len(p.msg.ToolCalls) == 0 {
		return false
	}
	next.request(e.decls)
	ids := map[string]bool{}
	for _, tc := range p.msg.ToolCalls {
		ids[tc.ID] = true
	}
	var mt matcher
	for _, m := range next.reqMsgs {
		if m.Role != "tool" || !ids[m.ToolCallID] {
			continue
		}
		mt.reset(m.text())
		for i := range e.patterns {
			if mt.match(&e.patterns[i]) {
				return true
			}
		}
	}
	return false
}

// signature identifies "the same call": its tool calls (name and canonical
// arguments) or, without tool calls, its text.
func signature(m message) string {
	if len(m.ToolCalls) == 0 {
		return strings.TrimSpace(m.text())
	}
	var b bytes.Buffer
	for _, tc := range m.ToolCalls {
		b.WriteString(tc.Function.Name)
		b.WriteByte('(')
		var v any
		if json.Unmarshal([]byte(tc.Function.Arguments), &v) == nil {
			canon, _ := json.Marshal(v) // map keys sorted
			b.Write(canon)
		} else {
			b.WriteString(tc.Function.Arguments)
		}
		b.WriteString(")")
	}
	return b.String()
}

// Counts tallies reward rows per rule (Source).
func Counts(rs []export.Reward) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.Source]++
	}
	return m
}

// Write stores the rule outcomes in the rewards table.
func Write(ctx context.Context, s export.Sink, rs []export.Reward) error {
	if len(rs) == 0 {
		return nil
	}
	if err := s.Write(ctx, &export.Batch{Rewards: rs}); err != nil {
		return fmt.Errorf("air: writing %d rewards: %w", len(rs), err)
	}
	return nil
}
