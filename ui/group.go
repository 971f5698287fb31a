package ui

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
	bridge "github.com/rollgate/rollgate/trainer-bridge"
	"github.com/rollgate/rollgate/trainer-bridge/air"
)

// groupMember is one rollout of a group, as the trainer bridge sees it.
type groupMember struct {
	RolloutID, AttemptID, Status string
	Selected                     bool // the bridge's default selection took it
	Score                        string
	RewardMissing                bool
	Advantage                    string // of its first included sample
	Samples, Included            int
	ResponseTokens               int
	Truncated                    int
	AIRHits                      []string // "rule ×n"
	Reasons                      []string // why it or some of its samples were left out
}

// groupPage is the group template's data.
type groupPage struct {
	ID         string
	Estimator  string
	Estimators []string
	Mode       string
	AIR        bool // automatic intermediate rewards on (?air=off turns them off)
	Members    []groupMember
	Excluded   []string // "reason: n" over the group
	Filled     int      // attempts given reward 0
	Note       string
	// Cmd is the rollgate bridge command of this group's rollouts with the
	// page's options ("" with CmdNote when none can be written).
	Cmd, CmdNote string
}

// serveGroup serves a group's rollouts side by side with the trainer
// bridge's scores, advantages and exclusions (?estimator, ?mode,
// ?max_response as the bridge takes them).
func (s *Server) serveGroup(ctx *fasthttp.RequestCtx, id string) {
	if err := checkValue("group id", id); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad group id: "+err.Error()+".")
		return
	}
	a := ctx.QueryArgs()
	req := bridge.Request{Estimator: orDefault(string(a.Peek("estimator")), string(bridge.DefaultEstimator)),
		Mode: string(a.Peek("mode")), MaxResponse: a.GetUintOrZero("max_response"), Report: true}
	airOn := string(a.Peek("air")) != "off"
	req.AIR = &airOn
	if _, err := req.Options(); err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad group option: "+err.Error())
		return
	}
	qctx, cancel := s.queryCtx(ctx)
	defer cancel()
	latestOf, err := s.store.GroupMembers(qctx, id)
	if err != nil {
		s.storeFailed(ctx, "group", err)
		return
	}
	type att struct {
		attempt, status string
		upd             uint64
	}
	latest := map[string]att{}
	ids := make([]string, len(latestOf))
	for i, m := range latestOf {
		ids[i], latest[m.RolloutID] = m.RolloutID, att{m.AttemptID, m.Status, m.UpdatedUnixNano}
	}
	if len(ids) == 0 {
		s.fail(ctx, fasthttp.StatusNotFound, fmt.Sprintf("Group %q was not found: no rollout in the store has this group_id.", id))
		return
	}
	req.RolloutIDs = ids
	opt, err := req.Options()
	if err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad group option: "+err.Error())
		return
	}
	out, err := bridge.Build(qctx, s.store, opt)
	var optErr *bridge.OptionError
	if errors.As(err, &optErr) {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad group option: "+err.Error())
		return
	}
	p := groupPage{ID: id, Estimator: string(opt.Estimator), Mode: orDefault(opt.Mode, bridge.ModeTransitions), AIR: airOn,
		Estimators: []string{"grpo", "drgrpo", "rloo", "reinforce++-baseline", "none"}}
	cmd := []any{"--rollouts", ids, "--estimator", p.Estimator, "--mode", p.Mode}
	if !airOn {
		cmd = append(cmd, "--air=false", nil)
	}
	if opt.MaxResponse > 0 {
		cmd = append(cmd, "--max-response", strconv.Itoa(opt.MaxResponse))
	}
	p.Cmd, p.CmdNote = s.bridgeCmd(cmd...)
	if err != nil {
		s.log.Warn("ui: trainer bridge failed for a group", "group", id, "err", err)
		p.Note = "The trainer bridge could not score this group; the gateway's log has the error."
	}
	members := map[string]*groupMember{}
	for _, rid := range ids {
		l := latest[rid]
		members[rid] = &groupMember{RolloutID: rid, AttemptID: l.attempt, Status: l.status}
	}
	if out != nil {
		s.fillFromBridge(out, members, &p)
	}
	if opt.AIR != nil {
		if err := s.fillAIR(qctx, opt.AIR, members); err != nil {
			s.storeFailed(ctx, "group calls", err)
			return
		}
	}
	for _, rid := range ids {
		m := members[rid]
		if !m.Selected {
			m.Reasons = append(m.Reasons, "not selected: status "+orDefault(m.Status, "unknown")+" (the bridge takes succeeded and failed attempts)")
		}
		p.Members = append(p.Members, *m)
	}
	s.render(ctx, fasthttp.StatusOK, "group", "Group "+id, p)
}

func (s *Server) fillFromBridge(out *bridge.Result, members map[string]*groupMember, p *groupPage) {
	for _, rep := range out.Report {
		m := members[rep.RolloutID]
		if m == nil {
			continue
		}
		m.Selected, m.AttemptID, m.Status = true, rep.AttemptID, rep.Status
		m.Score, m.RewardMissing = fmtFloat(rep.Score), rep.RewardMissing
		if rep.Reason != "" {
			m.Reasons = append(m.Reasons, "attempt excluded: "+rep.Reason)
		}
		for _, it := range rep.Items {
			if it.Kind != "sample" {
				if !it.Included {
					m.Reasons = append(m.Reasons, fmt.Sprintf("call %s choice %d excluded: %s", seqList(it.SequenceIDs), it.ChoiceIndex, it.Reason))
				}
				continue
			}
			m.Samples++
			if it.Truncated {
				m.Truncated++
			}
			if it.Included {
				if m.Included == 0 {
					m.Advantage = fmtFloat(it.Advantage)
				}
				m.Included++
			} else {
				m.Reasons = append(m.Reasons, fmt.Sprintf("sample of call %s excluded: %s", seqList(it.SequenceIDs), it.Reason))
			}
		}
	}
	for _, smp := range out.Samples {
		if m := members[smp.RolloutID]; m != nil {
			m.ResponseTokens += len(smp.Response)
		}
	}
	for r, n := range out.Stats.Excluded {
		p.Excluded = append(p.Excluded, fmt.Sprintf("%s: %d", r, n))
	}
	sort.Strings(p.Excluded)
	p.Filled = out.Stats.FilledRewards
}

// fillAIR counts the automatic intermediate rewards the bridge computes
// for each member's attempt, by rule.
func (s *Server) fillAIR(ctx context.Context, e *air.Engine, members map[string]*groupMember) error {
	for _, m := range members {
		if !m.Selected {
			continue
		}
		calls, err := s.store.Calls(ctx, export.CallFilter{RolloutID: m.RolloutID, AttemptID: m.AttemptID})
		if err != nil {
			return err
		}
		counts := air.Counts(e.Evaluate(calls, 0))
		for _, rule := range air.RuleNames {
			if n := counts[rule]; n > 0 {
				m.AIRHits = append(m.AIRHits, fmt.Sprintf("%s ×%d", rule, n))
			}
		}
	}
	return nil
}

func seqList(ids []uint64) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = "#" + u64(id)
	}
	return strings.Join(parts, "+")
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
