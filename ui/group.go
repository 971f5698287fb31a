package ui

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	bridge "github.com/rollgate/rollgate/trainer-bridge"
	"github.com/rollgate/rollgate/trainer-bridge/advantage"
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
	Members    []groupMember
	Excluded   []string // "reason: n" over the group
	Filled     int      // attempts given reward 0
	Note       string
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
	est, err := advantage.Parse(orDefault(string(a.Peek("estimator")), "grpo"))
	if err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	mode := orDefault(string(a.Peek("mode")), bridge.ModeTransitions)
	if mode != bridge.ModeTransitions && mode != bridge.ModeTrajectories {
		s.fail(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("mode must be %s or %s", bridge.ModeTransitions, bridge.ModeTrajectories))
		return
	}
	qctx, cancel := s.queryCtx(ctx)
	defer cancel()
	res, err := s.store.Query(qctx, "SELECT rollout_id, attempt_id, status, updated_unix_nano FROM rollouts WHERE group_id = "+s.d.lit(id)+" ORDER BY rollout_id, attempt_id")
	if err != nil {
		s.storeFailed(ctx, "group", err)
		return
	}
	type att struct {
		attempt, status string
		upd             uint64
	}
	latest := map[string]att{}
	var ids []string
	for _, r := range res.Rows {
		if len(r) < 4 {
			continue
		}
		upd, _ := strconv.ParseUint(r[3], 10, 64)
		cur, ok := latest[r[0]]
		if !ok {
			ids = append(ids, r[0])
		}
		if !ok || upd > cur.upd {
			latest[r[0]] = att{r[1], r[2], upd}
		}
	}
	if len(ids) == 0 {
		s.fail(ctx, fasthttp.StatusNotFound, fmt.Sprintf("Group %q was not found: no rollout in the store has this group_id.", id))
		return
	}
	opt := bridge.Options{Selection: bridge.DefaultSelection(), Mode: mode, Estimator: est, Report: true,
		MaxResponse: a.GetUintOrZero("max_response"), GroupBy: bridge.GroupGroup}
	opt.Selection.RolloutIDs = ids
	out, err := bridge.Build(qctx, s.store, opt)
	p := groupPage{ID: id, Estimator: string(est), Mode: mode,
		Estimators: []string{"grpo", "drgrpo", "rloo", "reinforce++-baseline", "none"}}
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
	if err := s.fillAIR(qctx, ids, members); err != nil {
		s.storeFailed(ctx, "group rewards", err)
		return
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

// fillAIR counts the stored automatic intermediate rewards of each rollout
// by rule.
func (s *Server) fillAIR(ctx context.Context, ids []string, members map[string]*groupMember) error {
	res, err := s.store.Query(ctx, "SELECT rollout_id, attempt_id, source, count(*) FROM rewards WHERE rollout_id IN "+s.d.list(ids)+
		" AND source IN "+s.d.list(air.RuleNames)+" GROUP BY rollout_id, attempt_id, source ORDER BY rollout_id, source")
	if err != nil {
		return err
	}
	for _, r := range res.Rows {
		if m := members[r[0]]; m != nil && len(r) >= 4 && r[1] == m.AttemptID {
			m.AIRHits = append(m.AIRHits, r[2]+" ×"+r[3])
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
