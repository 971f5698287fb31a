package export

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/rollgate/rollgate/export/arrays"
)

// Reader is the typed reads of the captured tables that the viewer, the
// trainer bridge and the AGL API make: filters go in as typed values,
// typed rows come out, and values reach SQL only as bound parameters, so
// no user of a store writes SQL over its tables. Both stores implement it
// with SQLReads (the SQL is the same for SQLite and ClickHouse from 18.16:
// no common table expression, at most one JOIN per SELECT).
type Reader interface {
	// StoreVersion is a string that changes whenever a row is added to
	// llm_calls, rewards or rollouts (or a rollout's state is updated)
	// without reading those tables: what the viewer's live list compares.
	StoreVersion(ctx context.Context) (string, error)
	// RolloutPage reads one page of the rollout list, newest activity
	// first, and says whether more rollouts follow.
	RolloutPage(ctx context.Context, q RolloutPageQuery) (rows []RolloutSummary, more bool, err error)
	// RolloutAttempts reads a rollout's registered attempts and names the
	// one with the latest activity.
	RolloutAttempts(ctx context.Context, rolloutID string, limit int) (*AttemptList, error)
	// AttemptTotals counts an attempt's calls (first choices) and reads the
	// rewards a page of its calls shows.
	AttemptTotals(ctx context.Context, q AttemptTotalsQuery) (calls int, rewards []Reward, err error)
	// GroupMembers reads the latest attempt (by registered update) of each
	// rollout of a group, ordered by rollout id.
	GroupMembers(ctx context.Context, groupID string) ([]Rollout, error)
	// EachRolloutState hands f every rollouts row, ordered by rollout,
	// attempt and update time (several rows per attempt may come: the
	// latest wins), Metadata read only when GroupID is empty (rows of
	// releases that kept the group there alone), CreatedUnixNano left 0.
	// f may keep the row.
	EachRolloutState(ctx context.Context, f func(*Rollout) error) error
	// EachAttemptCalls hands f one aggregate per (rollout, attempt) of
	// llm_calls, ordered by rollout and attempt; calls attributed to no
	// rollout come as RolloutID "".
	EachAttemptCalls(ctx context.Context, f func(AttemptCalls) error) error
	// FailedToolSpans reads the agent spans of a rollout that report a
	// failed tool call (status error, a tool name or call id).
	FailedToolSpans(ctx context.Context) ([]Span, error)
	// CallHeads reads the keys, end times and body sizes of one attempt's
	// calls (not their rows), ordered by sequence id and choice.
	CallHeads(ctx context.Context, q CallHeadQuery) ([]CallHead, error)
	// AttemptFirstEnds reads, per attempt of a rollout, the earliest end
	// of its calls (q.AttemptID is ignored).
	AttemptFirstEnds(ctx context.Context, q CallHeadQuery) (map[string]uint64, error)
	// CallChecks reads what a check of the capture compares of the calls
	// of the rollouts in r (bench/load's Verify), without their bodies.
	CallChecks(ctx context.Context, r RolloutRange) ([]CallCheck, error)
}

// MaxRolloutPage bounds RolloutPageQuery.Limit: a page is held whole.
const MaxRolloutPage = 10000

// RolloutPageQuery asks Reader.RolloutPage for one page of the rollout
// list. Empty strings match everything; the others match exactly.
type RolloutPageQuery struct {
	// TaskID matches the calls' and the registered attempts' task.
	TaskID string
	// GroupID and Status match the rollouts table (a rollout with calls
	// counts when any of its registered rows matches).
	GroupID, Status string
	// AgentName and PolicyVersion match calls; with either set, rollouts
	// without a call are not listed.
	AgentName, PolicyVersion string
	// Since and Until (unix ns, 0 = unbounded) keep the activity (a
	// call's start, a state update) in [Since, Until).
	Since, Until uint64
	// Before and BeforeID are the keyset cursor: rollouts whose last
	// activity is older than Before, or equal with a smaller id (Before 0:
	// the first page).
	Before   uint64
	BeforeID string
	// Limit is the page's size, 1 to MaxRolloutPage.
	Limit int
}

// Check says what is wrong with q, or returns nil.
func (q RolloutPageQuery) Check() error {
	if q.Limit < 1 || q.Limit > MaxRolloutPage {
		return fmt.Errorf("rollout page: limit %d is not between 1 and %d", q.Limit, MaxRolloutPage)
	}
	for _, t := range []struct {
		name string
		v    uint64
	}{{"since", q.Since}, {"until", q.Until}, {"before", q.Before}} {
		if t.v > math.MaxInt64 {
			return fmt.Errorf("rollout page: %s %d is over %d (unix ns)", t.name, t.v, int64(math.MaxInt64))
		}
	}
	return nil
}

// RolloutSummary is one line of the rollout list.
type RolloutSummary struct {
	RolloutID string
	// TaskID and GroupID come from the registered attempts when they say
	// so, else TaskID from the calls (the largest).
	TaskID, GroupID string
	// AttemptID is the attempt with the latest activity; Status its latest
	// registered status ("" when never registered).
	AttemptID, Status string
	// Reward is that attempt's episode reward (sequence 0, "primary"; one
	// posted without attempt_id counts), the latest when several; Rewarded
	// says there is one.
	Reward   float64
	Rewarded bool
	// Calls counts the rollout's call rows; Errors those with an error or
	// an HTTP status of 300 or more; VerifiedCalls the others whose token
	// ids came from the engine or its tokenizer and passed every check.
	Calls, Errors, VerifiedCalls int
	// PromptTokens and CompletionTokens sum the calls' usage.
	PromptTokens, CompletionTokens uint64
	// FirstStart is the first call's start; LastActivity the page's sort
	// key (latest call start or state update), unix ns.
	FirstStart, LastActivity uint64
}

// AttemptList is a rollout's registered attempts (the latest state of
// each, ordered by attempt id) and the one with the latest activity: its
// state's last update or its last call, whichever is later; an attempt
// that only has rewards when nothing else is known. Found is false when
// the store knows nothing of the rollout.
type AttemptList struct {
	Attempts []Rollout
	Latest   string
	Found    bool
}

// AttemptTotalsQuery asks Reader.AttemptTotals about one attempt and the
// calls FirstSeq..LastSeq of one page (FirstSeq > LastSeq: none).
type AttemptTotalsQuery struct {
	RolloutID, AttemptID string
	FirstSeq, LastSeq    uint64
	// MaxRewards bounds the rewards read (1 or more).
	MaxRewards int
}

// AttemptCalls is the per-attempt aggregate of llm_calls that the trainer
// bridge's selection merges with the rollouts table.
type AttemptCalls struct {
	RolloutID, AttemptID string
	// TaskID is the largest task id of the calls.
	TaskID string
	// FirstStart is the earliest call's start (unix ns); Calls counts rows.
	FirstStart uint64
	Calls      int
}

// CallHeadQuery names the calls of a rollout's attempt made since a time
// (rows of an earlier rollout of the same id stay in llm_calls), embedding
// calls left out.
type CallHeadQuery struct {
	RolloutID, AttemptID string
	// Since keeps calls that started at or after it (unix ns).
	Since uint64
}

// CallHead is a call's key and sizes, without its row.
type CallHead struct {
	SpanID          string
	SequenceID      uint64
	ChoiceIndex     uint32
	EndTimeUnixNano uint64
	// BodyBytes is the length of its request and response bodies.
	BodyBytes uint64
}

// RolloutRange names the rollouts whose id is in [From, To): a range
// rather than LIKE, whose '_' is a wildcard ("run-" to "run." is every id
// that starts with "run-").
type RolloutRange struct{ From, To string }

// CallCheck is one call row as CallChecks reads it.
type CallCheck struct {
	SpanID, RolloutID, AttemptID string
	SequenceID                   uint64
	TokenSource, TokenCheck      string
	CompletionTokens             uint32
	// ResponseTokens is the number of response token ids stored.
	ResponseTokens int
}

// SQLReads implements Reader over a store's SQL. A store embeds the value
// NewSQLReads returns.
type SQLReads struct {
	each    func(ctx context.Context, query string, args []any, f func(row []string) error) error
	final   string
	in      string
	version string
}

// NewSQLReads returns the reads of a store: each runs query, binding args
// (strings, uint64, int) to its ? placeholders in order, and hands f each
// row rendered as Store.Query renders it (f may keep the slice); final
// follows "rollouts" where replaced rows must be merged at read time
// (" FINAL" on ClickHouse), "" otherwise; in is the operator of a filter
// by a subquery over another table ("IN"; "GLOBAL IN" on ClickHouse, where
// a cluster's Distributed tables refuse a distributed subquery inside a
// distributed query: distributed_product_mode); version is the store's
// StoreVersion query (one row).
func NewSQLReads(each func(ctx context.Context, query string, args []any, f func(row []string) error) error, final, in, version string) *SQLReads {
	return &SQLReads{each: each, final: final, in: in, version: version}
}

// row reads the values of one rendered row; the first error sticks.
type row struct {
	what string
	vals []string
	err  error
}

// newRow checks that vals has n columns.
func newRow(what string, vals []string, n int) *row {
	r := &row{what: what, vals: vals}
	if len(vals) != n {
		r.err = fmt.Errorf("%s: row with %d columns, want %d", what, len(vals), n)
	}
	return r
}

func (r *row) s(i int) string {
	if r.err != nil {
		return ""
	}
	return r.vals[i]
}

func (r *row) u(i int) uint64 {
	if r.err != nil {
		return 0
	}
	n, err := strconv.ParseUint(r.vals[i], 10, 64)
	if err != nil {
		r.err = fmt.Errorf("%s: column %d: %w", r.what, i, err)
	}
	return n
}

func (r *row) f(i int) float64 {
	if r.err != nil {
		return 0
	}
	x, err := strconv.ParseFloat(r.vals[i], 64)
	if err != nil {
		r.err = fmt.Errorf("%s: column %d: %w", r.what, i, err)
	}
	return x
}

// placeholders is "(?, ?, ...)" with n marks, and ids as arguments.
func placeholders(ids []string) (string, []any) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return "(" + strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ") + ")", args
}

// conds collects the conditions of a WHERE clause and their arguments.
type conds struct {
	list []string
	args []any
}

func (c *conds) add(cond string, args ...any) {
	c.list = append(c.list, cond)
	c.args = append(c.args, args...)
}

func (c *conds) where() string {
	if len(c.list) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(c.list, " AND ")
}

// StoreVersion implements Reader.
func (r *SQLReads) StoreVersion(ctx context.Context) (string, error) {
	var out []string
	n := 0
	err := r.each(ctx, r.version, nil, func(row []string) error {
		out, n = row, n+1
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("store version: %w", err)
	}
	if n != 1 {
		return "", fmt.Errorf("store version: %d rows", n)
	}
	return strings.Join(out, "."), nil
}

// pageSQL is the first query of a list page: the ids of the rollouts shown,
// newest activity first, from calls and from registered rollouts (which
// may have no call yet). Only the columns filtered on and the sort key are
// read; the page's details come from pageDetails by primary key.
func (r *SQLReads) pageSQL(q RolloutPageQuery) (string, []any) {
	var cw, rw conds
	if q.TaskID != "" {
		cw.add("task_id = ?", q.TaskID)
		rw.add("task_id = ?", q.TaskID)
	}
	if q.AgentName != "" {
		cw.add("agent_name = ?", q.AgentName)
	}
	if q.PolicyVersion != "" {
		cw.add("policy_version = ?", q.PolicyVersion)
	}
	if q.Since != 0 {
		cw.add("start_time_unix_nano >= ?", q.Since)
		rw.add("updated_unix_nano >= ?", q.Since)
	}
	if q.Until != 0 {
		cw.add("start_time_unix_nano < ?", q.Until)
		rw.add("updated_unix_nano < ?", q.Until)
	}
	if q.GroupID != "" {
		cw.add("rollout_id "+r.in+" (SELECT rollout_id FROM rollouts"+r.final+" WHERE group_id = ?)", q.GroupID)
		rw.add("group_id = ?", q.GroupID)
	}
	if q.Status != "" {
		cw.add("rollout_id "+r.in+" (SELECT rollout_id FROM rollouts"+r.final+" WHERE status = ?)", q.Status)
		rw.add("status = ?", q.Status)
	}
	inner, args := "SELECT rollout_id, start_time_unix_nano AS t FROM llm_calls"+cw.where(), cw.args
	if q.AgentName == "" && q.PolicyVersion == "" {
		inner += " UNION ALL SELECT rollout_id, updated_unix_nano AS t FROM rollouts" + r.final + rw.where()
		args = append(args, rw.args...)
	}
	sql := "SELECT rollout_id, max(t) AS t_last FROM (" + inner + ") GROUP BY rollout_id"
	if q.Before != 0 {
		sql += " HAVING max(t) < ? OR (max(t) = ? AND rollout_id < ?)"
		args = append(args, q.Before, q.Before, q.BeforeID)
	}
	return sql + " ORDER BY t_last DESC, rollout_id DESC LIMIT " + strconv.Itoa(q.Limit+1), args
}

// RolloutPage implements Reader: a keyset query for the ids, then their
// calls, attempts and rewards by primary key.
func (r *SQLReads) RolloutPage(ctx context.Context, q RolloutPageQuery) ([]RolloutSummary, bool, error) {
	if err := q.Check(); err != nil {
		return nil, false, err
	}
	sql, args := r.pageSQL(q)
	rows, err := readAll(ctx, r, "rollout page", 2, sql, args, func(p *row) RolloutSummary {
		return RolloutSummary{RolloutID: p.s(0), LastActivity: p.u(1)}
	})
	if err != nil {
		return nil, false, err
	}
	more := len(rows) > q.Limit
	if more {
		rows = rows[:q.Limit]
	}
	if len(rows) == 0 {
		return rows, false, nil
	}
	if err := r.pageDetails(ctx, rows); err != nil {
		return nil, false, fmt.Errorf("rollout page: %w", err)
	}
	return rows, more, nil
}

// pageDetails fills the rows of one page: call aggregates, the latest
// attempt's state and its episode reward.
func (r *SQLReads) pageDetails(ctx context.Context, rows []RolloutSummary) error {
	byID := make(map[string]*RolloutSummary, len(rows))
	ids := make([]string, len(rows))
	for i := range rows {
		byID[rows[i].RolloutID], ids[i] = &rows[i], rows[i].RolloutID
	}
	in, args := placeholders(ids)
	err := r.each(ctx, "SELECT rollout_id, count(*), sum(prompt_tokens), sum(completion_tokens),"+
		" sum(CASE WHEN error != '' OR http_status >= 300 THEN 1 ELSE 0 END),"+
		" sum(CASE WHEN token_source IN ('engine', 'tokenize') AND token_check = '' AND error = '' AND http_status < 300 THEN 1 ELSE 0 END),"+
		" min(start_time_unix_nano), max(task_id) FROM llm_calls WHERE rollout_id IN "+in+" GROUP BY rollout_id", args, func(vals []string) error {
		p := newRow("calls", vals, 8)
		if s := byID[p.s(0)]; s != nil {
			s.Calls, s.PromptTokens, s.CompletionTokens = int(p.u(1)), p.u(2), p.u(3)
			s.Errors, s.VerifiedCalls = int(p.u(4)), int(p.u(5))
			s.FirstStart, s.TaskID = p.u(6), p.s(7)
		}
		return p.err
	})
	if err != nil {
		return err
	}
	type att struct {
		id string
		t  uint64
	}
	latest := map[string]att{}
	see := func(s *RolloutSummary, attempt string, t uint64) {
		if cur, ok := latest[s.RolloutID]; ok && (t < cur.t || (t == cur.t && attempt <= cur.id)) {
			return
		}
		latest[s.RolloutID] = att{attempt, t}
		s.AttemptID = attempt
	}
	// The latest attempt is the one with the latest activity (its state's
	// last update or its last call): its status and episode reward are shown.
	err = r.each(ctx, "SELECT rollout_id, attempt_id, max(start_time_unix_nano) FROM llm_calls WHERE rollout_id IN "+in+
		" GROUP BY rollout_id, attempt_id", args, func(vals []string) error {
		p := newRow("attempts", vals, 3)
		if s := byID[p.s(0)]; s != nil && p.err == nil {
			see(s, p.s(1), p.u(2))
		}
		return p.err
	})
	if err != nil {
		return err
	}
	type state struct {
		status string
		upd    uint64
	}
	states := map[[2]string]state{}
	err = r.each(ctx, "SELECT rollout_id, attempt_id, task_id, group_id, status, updated_unix_nano FROM rollouts WHERE rollout_id IN "+in,
		args, func(vals []string) error {
			p := newRow("rollouts", vals, 6)
			s, upd := byID[p.s(0)], p.u(5)
			if s == nil || p.err != nil {
				return p.err
			}
			k := [2]string{p.s(0), p.s(1)}
			if prev, ok := states[k]; ok && prev.upd > upd {
				return nil
			}
			states[k] = state{p.s(4), upd}
			see(s, p.s(1), upd)
			if t := p.s(2); t != "" {
				s.TaskID = t
			}
			if g := p.s(3); g != "" {
				s.GroupID = g
			}
			return nil
		})
	if err != nil {
		return err
	}
	for _, s := range byID {
		s.Status = states[[2]string{s.RolloutID, s.AttemptID}].status
	}
	return r.each(ctx, "SELECT rollout_id, attempt_id, value, time_unix_nano FROM rewards WHERE rollout_id IN "+in+
		" AND sequence_id = 0 AND name = 'primary' ORDER BY time_unix_nano", args, func(vals []string) error {
		p := newRow("rewards", vals, 4)
		s, v := byID[p.s(0)], p.f(2)
		// A reward without attempt_id is the rollout's, whatever its attempt.
		if s == nil || p.err != nil || (p.s(1) != "" && s.AttemptID != "" && p.s(1) != s.AttemptID) {
			return p.err
		}
		s.Reward, s.Rewarded = v, true // the last (latest) wins
		return nil
	})
}

// RolloutAttempts implements Reader: at most limit attempts.
func (r *SQLReads) RolloutAttempts(ctx context.Context, rolloutID string, limit int) (*AttemptList, error) {
	if limit < 1 {
		return nil, fmt.Errorf("rollout attempts: limit %d is below 1", limit)
	}
	out := &AttemptList{}
	bestT := uint64(0)
	see := func(attempt string, t uint64) {
		if !out.Found || t > bestT || (t == bestT && attempt > out.Latest) {
			out.Latest, bestT, out.Found = attempt, t, true
		}
	}
	lim := " LIMIT " + strconv.Itoa(limit)
	err := r.each(ctx, "SELECT attempt_id, task_id, group_id, status, updated_unix_nano FROM rollouts"+r.final+
		" WHERE rollout_id = ? ORDER BY attempt_id, updated_unix_nano"+lim, []any{rolloutID}, func(vals []string) error {
		p := newRow("rollout attempts", vals, 5)
		a := Rollout{RolloutID: rolloutID, AttemptID: p.s(0), TaskID: p.s(1), GroupID: p.s(2), Status: p.s(3), UpdatedUnixNano: p.u(4)}
		if p.err != nil {
			return p.err
		}
		if n := len(out.Attempts); n > 0 && out.Attempts[n-1].AttemptID == a.AttemptID {
			out.Attempts[n-1] = a // ordered by update: the later row wins
		} else {
			out.Attempts = append(out.Attempts, a)
		}
		see(a.AttemptID, a.UpdatedUnixNano)
		return nil
	})
	if err == nil {
		err = r.each(ctx, "SELECT attempt_id, max(start_time_unix_nano) FROM llm_calls WHERE rollout_id = ?"+
			" GROUP BY attempt_id"+lim, []any{rolloutID}, func(vals []string) error {
			p := newRow("rollout attempts", vals, 2)
			if t := p.u(1); p.err == nil {
				see(p.s(0), t)
			}
			return p.err
		})
	}
	if err == nil && !out.Found {
		err = r.each(ctx, "SELECT attempt_id FROM rewards WHERE rollout_id = ? ORDER BY attempt_id LIMIT 1", []any{rolloutID},
			func(vals []string) error {
				p := newRow("rollout attempts", vals, 1)
				out.Latest, out.Found = p.s(0), p.err == nil
				return p.err
			})
	}
	if err != nil {
		return nil, fmt.Errorf("rollout attempts: %w", err)
	}
	return out, nil
}

// AttemptTotals implements Reader. A reward posted without attempt_id is
// the rollout's: it counts for every attempt, as the trainer bridge counts
// it. Rewards come ordered by sequence id, time and name.
func (r *SQLReads) AttemptTotals(ctx context.Context, q AttemptTotalsQuery) (int, []Reward, error) {
	if q.MaxRewards < 1 {
		return 0, nil, fmt.Errorf("attempt totals: reward limit %d is below 1", q.MaxRewards)
	}
	calls := 0
	err := r.each(ctx, "SELECT count(*) FROM llm_calls WHERE rollout_id = ? AND attempt_id = ? AND choice_index = 0",
		[]any{q.RolloutID, q.AttemptID}, func(vals []string) error {
			p := newRow("attempt totals", vals, 1)
			calls = int(p.u(0))
			return p.err
		})
	if err != nil {
		return 0, nil, fmt.Errorf("attempt totals: %w", err)
	}
	rewards, err := readAll(ctx, r, "attempt rewards", 4, "SELECT sequence_id, name, value, source FROM rewards"+
		" WHERE rollout_id = ? AND (attempt_id = ? OR attempt_id = '') AND (sequence_id = 0 OR (sequence_id >= ? AND sequence_id <= ?))"+
		" ORDER BY sequence_id, time_unix_nano, name LIMIT "+strconv.Itoa(q.MaxRewards),
		[]any{q.RolloutID, q.AttemptID, q.FirstSeq, q.LastSeq}, func(p *row) Reward {
			return Reward{RolloutID: q.RolloutID, AttemptID: q.AttemptID, SequenceID: p.u(0), Name: p.s(1), Value: p.f(2), Source: p.s(3)}
		})
	if err != nil {
		return 0, nil, fmt.Errorf("attempt totals: %w", err)
	}
	return calls, rewards, nil
}

// GroupMembers implements Reader: of a rollout's attempts, the one
// updated last (the first in attempt order on a tie).
func (r *SQLReads) GroupMembers(ctx context.Context, groupID string) ([]Rollout, error) {
	var out []Rollout
	err := r.each(ctx, "SELECT rollout_id, attempt_id, status, updated_unix_nano FROM rollouts WHERE group_id = ? ORDER BY rollout_id, attempt_id",
		[]any{groupID}, func(vals []string) error {
			p := newRow("group members", vals, 4)
			a := Rollout{RolloutID: p.s(0), AttemptID: p.s(1), GroupID: groupID, Status: p.s(2), UpdatedUnixNano: p.u(3)}
			if p.err != nil {
				return p.err
			}
			if n := len(out); n > 0 && out[n-1].RolloutID == a.RolloutID {
				if a.UpdatedUnixNano > out[n-1].UpdatedUnixNano {
					out[n-1] = a
				}
				return nil
			}
			out = append(out, a)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("group members: %w", err)
	}
	return out, nil
}

// EachRolloutState implements Reader.
func (r *SQLReads) EachRolloutState(ctx context.Context, f func(*Rollout) error) error {
	return r.each(ctx, "SELECT rollout_id, attempt_id, task_id, status, updated_unix_nano, group_id,"+
		" CASE WHEN group_id = '' THEN metadata ELSE '' END FROM rollouts ORDER BY rollout_id, attempt_id, updated_unix_nano", nil,
		func(vals []string) error {
			p := newRow("rollout states", vals, 7)
			a := &Rollout{RolloutID: p.s(0), AttemptID: p.s(1), TaskID: p.s(2), Status: p.s(3), UpdatedUnixNano: p.u(4), GroupID: p.s(5), Metadata: p.s(6)}
			if p.err != nil {
				return p.err
			}
			return f(a)
		})
}

// EachAttemptCalls implements Reader.
func (r *SQLReads) EachAttemptCalls(ctx context.Context, f func(AttemptCalls) error) error {
	return r.each(ctx, "SELECT rollout_id, attempt_id, max(task_id), min(start_time_unix_nano), count(*) FROM llm_calls"+
		" GROUP BY rollout_id, attempt_id ORDER BY rollout_id, attempt_id", nil, func(vals []string) error {
		p := newRow("attempt calls", vals, 5)
		a := AttemptCalls{RolloutID: p.s(0), AttemptID: p.s(1), TaskID: p.s(2), FirstStart: p.u(3), Calls: int(p.u(4))}
		if p.err != nil {
			return p.err
		}
		return f(a)
	})
}

// readAll runs query and collects what parse reads of each row of n
// columns (parse may set p.err); what names the read in errors.
func readAll[T any](ctx context.Context, r *SQLReads, what string, n int, query string, args []any, parse func(p *row) T) ([]T, error) {
	var out []T
	err := r.each(ctx, query, args, func(vals []string) error {
		p := newRow(what, vals, n)
		v := parse(p)
		if p.err != nil {
			return p.err
		}
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// FailedToolSpans implements Reader (StatusCode "error" and the columns
// rollout_id, attempt_id, span_id, tool_name, tool_call_id and
// start_time_unix_nano set; the others left empty).
func (r *SQLReads) FailedToolSpans(ctx context.Context) ([]Span, error) {
	return readAll(ctx, r, "failed tool spans", 6, "SELECT rollout_id, attempt_id, span_id, tool_name, tool_call_id, start_time_unix_nano FROM agent_spans"+
		" WHERE status_code = 'error' AND rollout_id != '' AND (tool_name != '' OR tool_call_id != '')", nil, func(p *row) Span {
		return Span{RolloutID: p.s(0), AttemptID: p.s(1), SpanID: p.s(2), ToolName: p.s(3), ToolCallID: p.s(4), StatusCode: "error", StartTimeUnixNano: p.u(5)}
	})
}

// CallHeads implements Reader.
func (r *SQLReads) CallHeads(ctx context.Context, q CallHeadQuery) ([]CallHead, error) {
	return readAll(ctx, r, "call heads", 5, "SELECT span_id, sequence_id, choice_index, end_time_unix_nano, length(request_body) + length(response_body) FROM llm_calls"+
		" WHERE rollout_id = ? AND attempt_id = ? AND start_time_unix_nano >= ? AND endpoint != 'embeddings' ORDER BY sequence_id, choice_index",
		[]any{q.RolloutID, q.AttemptID, q.Since}, func(p *row) CallHead {
			return CallHead{SpanID: p.s(0), SequenceID: p.u(1), ChoiceIndex: uint32(min(p.u(2), math.MaxUint32)), EndTimeUnixNano: p.u(3), BodyBytes: p.u(4)}
		})
}

// AttemptFirstEnds implements Reader.
func (r *SQLReads) AttemptFirstEnds(ctx context.Context, q CallHeadQuery) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := r.each(ctx, "SELECT attempt_id, min(end_time_unix_nano) FROM llm_calls"+
		" WHERE rollout_id = ? AND start_time_unix_nano >= ? AND endpoint != 'embeddings' GROUP BY attempt_id",
		[]any{q.RolloutID, q.Since}, func(vals []string) error {
			p := newRow("attempt ends", vals, 2)
			out[p.s(0)] = p.u(1)
			return p.err
		})
	if err != nil {
		return nil, fmt.Errorf("attempt ends: %w", err)
	}
	return out, nil
}

// CallChecks implements Reader.
func (r *SQLReads) CallChecks(ctx context.Context, rr RolloutRange) ([]CallCheck, error) {
	return readAll(ctx, r, "call checks", 8, "SELECT span_id, rollout_id, attempt_id, sequence_id, token_source, token_check, completion_tokens, response_token_ids"+
		" FROM llm_calls WHERE rollout_id >= ? AND rollout_id < ?", []any{rr.From, rr.To}, func(p *row) CallCheck {
		c := CallCheck{SpanID: p.s(0), RolloutID: p.s(1), AttemptID: p.s(2), SequenceID: p.u(3), TokenSource: p.s(4), TokenCheck: p.s(5),
			CompletionTokens: uint32(min(p.u(6), math.MaxUint32))}
		if p.err == nil {
			ids, err := arrays.ParseUint32s(p.s(7))
			if err != nil {
				p.err = fmt.Errorf("response_token_ids of span %q: %w", c.SpanID, err)
			}
			c.ResponseTokens = len(ids)
		}
		return c
	})
}
