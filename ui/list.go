package ui

import (
	"fmt"
	"html/template"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rollgate/rollgate/export"
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
		n, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil || n < 0 {
			return f, fmt.Errorf("before must be a unix time in nanoseconds (the list's own next-page link)")
		}
		f.before = uint64(n)
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

// storeVersion is the store's version (export.Reader.StoreVersion).
func (s *Server) storeVersion(fctx *fasthttp.RequestCtx) (string, error) {
	ctx, cancel := s.queryCtx(fctx)
	defer cancel()
	return s.store.StoreVersion(ctx)
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

// listRollouts reads one page of the list (export.Reader.RolloutPage).
func (s *Server) listRollouts(fctx *fasthttp.RequestCtx, f listFilter) ([]rolloutRow, bool, error) {
	ctx, cancel := s.queryCtx(fctx)
	defer cancel()
	page, more, err := s.store.RolloutPage(ctx, export.RolloutPageQuery{TaskID: f.Task, GroupID: f.Group, Status: f.Status,
		AgentName: f.Agent, PolicyVersion: f.Policy, Since: f.since, Until: f.until, Before: f.before, BeforeID: f.beforeID,
		Limit: s.cfg.PageSize})
	if err != nil {
		return nil, false, err
	}
	rows := make([]rolloutRow, len(page))
	for i, r := range page {
		rows[i] = rolloutRow{ID: r.RolloutID, Task: r.TaskID, Group: r.GroupID, Status: r.Status, Attempt: r.AttemptID,
			Calls: r.Calls, Errors: r.Errors, IDsOK: r.VerifiedCalls, PromptTokens: r.PromptTokens, CompletionTokens: r.CompletionTokens,
			First: r.FirstStart, Last: r.LastActivity}
		if r.Rewarded {
			rows[i].Reward = strconv.FormatFloat(r.Reward, 'g', -1, 64)
		}
	}
	return rows, more, nil
}
