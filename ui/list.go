package ui

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// listFilter is the rollout list's filter form.
type listFilter struct {
	Task, Group, Status, Agent, Policy string
	Since, Until                       string // as typed: RFC 3339 or 2006-01-02T15:04 (UTC)
	since, until                       uint64 // unix ns, 0 = unbounded
	// before and beforeID are the keyset cursor: rollouts whose last
	// activity is older than before (or equal, with a smaller id).
	before   uint64
	beforeID string
}

// rolloutRow is one line of the rollout list.
type rolloutRow struct {
	ID, Task, Group, Status, Attempt string
	Reward                           string // the latest attempt's episode reward, "" when none
	Calls, Errors, IDsOK             int
	PromptTokens, CompletionTokens   uint64
	First, Last                      uint64
}

// IDHealth renders the token-source health: of the calls that succeeded
// (failed ones are never training data), those with verified engine ids.
func (r rolloutRow) IDHealth() string {
	if r.Calls-r.Errors <= 0 {
		return "—"
	}
	return fmt.Sprintf("%d/%d", r.IDsOK, r.Calls-r.Errors)
}

// IDsBad says some successful calls lack verified ids.
func (r rolloutRow) IDsBad() bool { return r.IDsOK < r.Calls-r.Errors }

// listPage is the list template's data.
type listPage struct {
	F    listFilter
	Rows []rolloutRow
	Next template.URL // query string of the next page, "" on the last
	Live bool         // first page: the script refreshes it
	// Version is the store's version the page was read at (storeVersion).
	Version string
	// Statuses are the status filter's choices ("" = any).
	Statuses []string
	Elapsed  string
}

// parseListFilter reads the filter form from the query string.
func parseListFilter(a *fasthttp.Args) (listFilter, error) {
	f := listFilter{
		Task: string(a.Peek("task")), Group: string(a.Peek("group")), Status: string(a.Peek("status")),
		Agent: string(a.Peek("agent")), Policy: string(a.Peek("policy")),
		beforeID: string(a.Peek("before_id")),
	}
	for _, v := range []struct{ name, val string }{{"task", f.Task}, {"group", f.Group}, {"status", f.Status},
		{"agent", f.Agent}, {"policy", f.Policy}, {"before_id", f.beforeID}} {
		if err := checkValue(v.name, v.val); err != nil {
			return f, err
		}
	}
	var err error
	if f.Since, f.Until, f.since, f.until, err = parseWindow(a); err != nil {
		return f, err
	}
	if b := a.Peek("before"); len(b) > 0 {
		if f.before, err = strconv.ParseUint(string(b), 10, 64); err != nil {
			return f, fmt.Errorf("before must be a unix time in nanoseconds (the list's own next-page link)")
		}
	}
	return f, nil
}

// The times a filter can name: what a unix time in nanoseconds (uint64
// columns, int64 in Go) holds.
var (
	minFilterTime = time.Unix(0, 1).UTC()
	maxFilterTime = time.Unix(0, math.MaxInt64).UTC()
)

// parseWindow reads the since and until filters: as typed (trimmed) and
// as unix times in nanoseconds (0: unbounded).
func parseWindow(a *fasthttp.Args) (since, until string, sinceNs, untilNs uint64, err error) {
	since, until = strings.TrimSpace(string(a.Peek("since"))), strings.TrimSpace(string(a.Peek("until")))
	if sinceNs, err = parseTime("since", since); err != nil {
		return
	}
	untilNs, err = parseTime("until", until)
	return
}

// parseTime reads a filter time: RFC 3339, or a browser's datetime-local
// value taken as UTC.
func parseTime(what, s string) (uint64, error) {
	if s == "" {
		return 0, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			// UnixNano is undefined outside 1970..2262 (it wraps).
			if t.Before(minFilterTime) || t.After(maxFilterTime) {
				return 0, fmt.Errorf("%s %q is out of range: give a time from %s to %s", what, s,
					minFilterTime.Format(time.RFC3339), maxFilterTime.Format(time.RFC3339))
			}
			return uint64(t.UnixNano()), nil
		}
	}
	return 0, fmt.Errorf("%s %q is not a time: use 2006-01-02T15:04 (UTC) or RFC 3339", what, s)
}

// query renders f (without the cursor) as a query string.
func (f listFilter) query() url.Values {
	v := url.Values{}
	for _, kv := range [][2]string{{"task", f.Task}, {"group", f.Group}, {"status", f.Status},
		{"agent", f.Agent}, {"policy", f.Policy}, {"since", f.Since}, {"until", f.Until}} {
		if kv[1] != "" {
			v.Set(kv[0], kv[1])
		}
	}
	return v
}

// QueryString is the filter (without the cursor) as a URL query, encoded
// by url.Values (so safe to place after "?" in an attribute).
func (f listFilter) QueryString() template.URL { return template.URL(f.query().Encode()) }

// pageSQL is the first query of a list page: the ids of the rollouts shown,
// newest activity first, from calls and from registered rollouts (which
// may have no call yet). Only the columns filtered on and the sort key are
// read; the page's details come from pageDetails by primary key.
func (s *Server) pageSQL(f listFilter, limit int) string {
	d := s.d
	final := ""
	if d == dialectClickHouse {
		final = " FINAL"
	}
	var cw, rw []string
	if f.Task != "" {
		cw = append(cw, "task_id = "+d.lit(f.Task))
		rw = append(rw, "task_id = "+d.lit(f.Task))
	}
	if f.Agent != "" {
		cw = append(cw, "agent_name = "+d.lit(f.Agent))
	}
	if f.Policy != "" {
		cw = append(cw, "policy_version = "+d.lit(f.Policy))
	}
	if f.since != 0 {
		cw = append(cw, "start_time_unix_nano >= "+u64(f.since))
		rw = append(rw, "updated_unix_nano >= "+u64(f.since))
	}
	if f.until != 0 {
		cw = append(cw, "start_time_unix_nano < "+u64(f.until))
		rw = append(rw, "updated_unix_nano < "+u64(f.until))
	}
	if f.Group != "" {
		cw = append(cw, "rollout_id IN (SELECT rollout_id FROM rollouts"+final+" WHERE group_id = "+d.lit(f.Group)+")")
		rw = append(rw, "group_id = "+d.lit(f.Group))
	}
	if f.Status != "" {
		cw = append(cw, "rollout_id IN (SELECT rollout_id FROM rollouts"+final+" WHERE status = "+d.lit(f.Status)+")")
		rw = append(rw, "status = "+d.lit(f.Status))
	}
	inner := "SELECT rollout_id, start_time_unix_nano AS t FROM llm_calls" + where(cw)
	if f.Agent == "" && f.Policy == "" {
		inner += " UNION ALL SELECT rollout_id, updated_unix_nano AS t FROM rollouts" + final + where(rw)
	}
	q := "SELECT rollout_id, max(t) AS t_last FROM (" + inner + ") GROUP BY rollout_id"
	if f.before != 0 {
		q += " HAVING max(t) < " + u64(f.before) + " OR (max(t) = " + u64(f.before) + " AND rollout_id < " + d.lit(f.beforeID) + ")"
	}
	return q + " ORDER BY t_last DESC, rollout_id DESC LIMIT " + strconv.Itoa(limit)
}

func where(conds []string) string {
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// versionSQL reads what changes when a row is added to a table the list
// shows, or a rollout's state is updated, without reading the tables:
// SQLite's largest rowids and the rollouts' latest update (an index each),
// ClickHouse's row counts (kept in its parts' metadata; an update of a
// rollout is an insert, and a merge that changes a count only costs one
// refresh).
func (s *Server) versionSQL() string {
	if s.d == dialectClickHouse {
		return "SELECT (SELECT count() FROM llm_calls), (SELECT count() FROM rewards), (SELECT count() FROM rollouts)"
	}
	return "SELECT (SELECT max(rowid) FROM llm_calls), (SELECT max(rowid) FROM rewards), (SELECT max(rowid) FROM rollouts)," +
		" (SELECT max(updated_unix_nano) FROM rollouts)"
}

// storeVersion is versionSQL's answer as one string.
func (s *Server) storeVersion(fctx *fasthttp.RequestCtx) (string, error) {
	ctx, cancel := s.queryCtx(fctx)
	defer cancel()
	res, err := s.store.Query(ctx, s.versionSQL())
	if err != nil {
		return "", err
	}
	if len(res.Rows) != 1 {
		return "", fmt.Errorf("store version: %d rows", len(res.Rows))
	}
	return strings.Join(res.Rows[0], "."), nil
}

// serveList serves the rollout list; ?part=rows serves only the table body
// (the script's live refresh), or 204 No Content when ?v= names the store
// version it was rendered at and nothing has been stored since (the
// version is in the X-Rollgate-Version header and the table's
// data-version): an open list costs one cheap query per refresh while
// nothing changes, not the list's aggregates.
func (s *Server) serveList(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	f, err := parseListFilter(ctx.QueryArgs())
	if err != nil {
		s.fail(ctx, fasthttp.StatusBadRequest, "Bad filter: "+err.Error()+".")
		return
	}
	var version string
	if f.before == 0 { // the first page: refreshed by the script
		if version, err = s.storeVersion(ctx); err != nil {
			s.storeFailed(ctx, "rollout list", err)
			return
		}
		ctx.Response.Header.Set("X-Rollgate-Version", version)
		if v := ctx.QueryArgs().Peek("v"); string(ctx.QueryArgs().Peek("part")) == "rows" && len(v) > 0 && string(v) == version {
			ctx.SetStatusCode(fasthttp.StatusNoContent)
			return
		}
	}
	rows, more, err := s.listRollouts(ctx, f)
	if err != nil {
		s.storeFailed(ctx, "rollout list", err)
		return
	}
	p := listPage{F: f, Rows: rows, Live: f.before == 0, Version: version,
		Statuses: []string{"", "queued", "running", "succeeded", "failed", "cancelled"}}
	if more && len(rows) > 0 {
		last := rows[len(rows)-1]
		q := f.query()
		q.Set("before", u64(last.Last))
		q.Set("before_id", last.ID)
		p.Next = template.URL(q.Encode()) // encoded by url.Values: safe in an href
	}
	p.Elapsed = time.Since(start).Round(time.Millisecond).String()
	ctx.Response.Header.Set("Server-Timing", "store;dur="+strconv.FormatFloat(float64(time.Since(start).Microseconds())/1000, 'f', 1, 64))
	if string(ctx.QueryArgs().Peek("part")) == "rows" {
		s.renderTemplate(ctx, fasthttp.StatusOK, "list", "rows", p)
		return
	}
	s.render(ctx, fasthttp.StatusOK, "list", "Rollouts", p)
}

// listRollouts reads one page of the list: a keyset query for the ids,
// then their calls, attempts and rewards by primary key.
func (s *Server) listRollouts(fctx *fasthttp.RequestCtx, f listFilter) ([]rolloutRow, bool, error) {
	ctx, cancel := s.queryCtx(fctx)
	defer cancel()
	res, err := s.store.Query(ctx, s.pageSQL(f, s.cfg.PageSize+1))
	if err != nil {
		return nil, false, err
	}
	more := len(res.Rows) > s.cfg.PageSize
	if more {
		res.Rows = res.Rows[:s.cfg.PageSize]
	}
	rows := make([]rolloutRow, len(res.Rows))
	ids := make([]string, len(res.Rows))
	byID := map[string]*rolloutRow{}
	for i, r := range res.Rows {
		if len(r) < 2 {
			return nil, false, fmt.Errorf("rollout page: row with %d columns", len(r))
		}
		rows[i].ID, ids[i] = r[0], r[0]
		rows[i].Last, _ = strconv.ParseUint(r[1], 10, 64)
		byID[r[0]] = &rows[i]
	}
	if len(ids) == 0 {
		return rows, false, nil
	}
	if err := s.pageDetails(ctx, ids, byID); err != nil {
		return nil, false, err
	}
	return rows, more, nil
}

// pageDetails fills the rows of one page: call aggregates, the latest
// attempt's state and its episode reward.
func (s *Server) pageDetails(ctx context.Context, ids []string, byID map[string]*rolloutRow) error {
	in := s.d.list(ids)
	res, err := s.store.Query(ctx, "SELECT rollout_id, count(*), sum(prompt_tokens), sum(completion_tokens),"+
		" sum(CASE WHEN error != '' OR http_status >= 300 THEN 1 ELSE 0 END),"+
		" sum(CASE WHEN token_source IN ('engine', 'tokenize') AND token_check = '' AND error = '' AND http_status < 300 THEN 1 ELSE 0 END),"+
		" min(start_time_unix_nano), max(task_id) FROM llm_calls WHERE rollout_id IN "+in+" GROUP BY rollout_id")
	if err != nil {
		return err
	}
	for _, r := range res.Rows {
		row := byID[r[0]]
		if row == nil || len(r) < 8 {
			continue
		}
		row.Calls = atoi(r[1])
		row.PromptTokens, _ = strconv.ParseUint(r[2], 10, 64)
		row.CompletionTokens, _ = strconv.ParseUint(r[3], 10, 64)
		row.Errors, row.IDsOK = atoi(r[4]), atoi(r[5])
		row.First, _ = strconv.ParseUint(r[6], 10, 64)
		row.Task = r[7]
	}
	type att struct {
		id string
		t  uint64
	}
	latest := map[string]att{}
	see := func(row *rolloutRow, attempt string, t uint64) {
		if cur, ok := latest[row.ID]; ok && (t < cur.t || (t == cur.t && attempt <= cur.id)) {
			return
		}
		latest[row.ID] = att{attempt, t}
		row.Attempt = attempt
	}
	// The latest attempt is the one with the latest activity (its state's
	// last update or its last call): its status and episode reward are shown.
	res, err = s.store.Query(ctx, "SELECT rollout_id, attempt_id, max(start_time_unix_nano) FROM llm_calls WHERE rollout_id IN "+in+" GROUP BY rollout_id, attempt_id")
	if err != nil {
		return err
	}
	for _, r := range res.Rows {
		if row := byID[r[0]]; row != nil && len(r) >= 3 {
			t, _ := strconv.ParseUint(r[2], 10, 64)
			see(row, r[1], t)
		}
	}
	res, err = s.store.Query(ctx, "SELECT rollout_id, attempt_id, task_id, group_id, status, updated_unix_nano FROM rollouts WHERE rollout_id IN "+in)
	if err != nil {
		return err
	}
	states := map[[2]string][2]string{} // (rollout, attempt) -> (status, updated)
	for _, r := range res.Rows {
		row := byID[r[0]]
		if row == nil || len(r) < 6 {
			continue
		}
		upd, _ := strconv.ParseUint(r[5], 10, 64)
		k := [2]string{r[0], r[1]}
		if prev, ok := states[k]; ok {
			if pu, _ := strconv.ParseUint(prev[1], 10, 64); pu > upd {
				continue
			}
		}
		states[k] = [2]string{r[4], r[5]}
		see(row, r[1], upd)
		if r[2] != "" {
			row.Task = r[2]
		}
		if r[3] != "" {
			row.Group = r[3]
		}
	}
	for _, row := range byID {
		row.Status = states[[2]string{row.ID, row.Attempt}][0]
	}
	res, err = s.store.Query(ctx, "SELECT rollout_id, attempt_id, value, time_unix_nano FROM rewards WHERE rollout_id IN "+in+
		" AND sequence_id = 0 AND name = 'primary' ORDER BY time_unix_nano")
	if err != nil {
		return err
	}
	for _, r := range res.Rows {
		row := byID[r[0]]
		// A reward without attempt_id is the rollout's, whatever its attempt.
		if row == nil || len(r) < 4 || (r[1] != "" && row.Attempt != "" && r[1] != row.Attempt) {
			continue
		}
		row.Reward = r[2] // the last (latest) wins
	}
	return nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
