package bridge

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"

	"github.com/rollgate/rollgate/export"
)

// Attempt choices for Selection.Attempts.
const (
	AttemptsLatest = "latest" // per rollout, the latest attempt that passes the status filter
	AttemptsAll    = "all"    // every attempt that passes the status filter
)

// Exclusion reasons counted in Stats.Excluded (calls unless noted).
const (
	ExclErrored       = "errored"              // error set or HTTP status >= 300
	ExclUnverified    = "unverified_ids"       // token_source not engine/tokenize, or no ids
	ExclRetokenize    = "retokenize_failed"    // token_source none and Options.Retokenize could not rebuild the ids (another endpoint, non-text content, a request with its own template)
	ExclAgent         = "agent_name"           // agent_name does not match the regex
	ExclPolicyVersion = "policy_version"       // policy_version below the minimum
	ExclTruncDropped  = "truncated"            // samples over a limit dropped by TruncDrop (samples)
	ExclPromptTooLong = "prompt_too_long"      // samples whose prompt exceeds MaxPrompt under TruncCut: the context the policy saw is never trimmed (samples)
	ExclNoLogprobs    = "no_logprobs"          // samples without the engine's sampling logprobs while the output carries rollout_log_probs (samples)
	ExclNoReward      = "no_reward"            // attempts without an episode reward, with MissingReward "drop" (attempts)
	ExclMissingGroup  = "missing_reward_group" // samples of a group with an unrewarded attempt, with MissingReward "drop-group" (samples)
	ExclNoSample      = "no_sample"            // attempts left without any sample (attempts); their score still counts in their group
	ExclSmallGroup    = "small_group"          // samples of a group sampled with fewer than MinGroupSize members (samples)
	ExclZeroVariance  = "zero_variance"        // samples of a group whose scores are all equal, with DropZeroVariance (samples)
	ExclUnfinished    = "unfinished"           // attempts selected as StatusUnregistered that have no episode reward yet (attempts)
)

// StatusUnregistered in Selection.Statuses selects the attempts the
// rollouts table does not know (calls made on the per-rollout URL without
// POST /api/v1/rollouts or the task queue) once they have an episode
// reward of Options.RewardName: for such a rollout the reward is the only
// sign that its episode ended, so one without it (still running, or never
// scored) is left out as ExclUnfinished before it joins a group, and never
// moves a sibling's baseline. The viewer shows these rollouts with this
// status too.
const StatusUnregistered = "unregistered"

// Reasons an attempt was not selected (Stats.NotSelected); "status:" is
// followed by the attempt's status (StatusUnregistered for attempts the
// rollouts table does not know).
const (
	SkipStatus   = "status:"
	SkipTasks    = "tasks"
	SkipRollouts = "rollouts"
	SkipTime     = "since_until"
	// SkipUnattributed counts call rows (not attempts) attributed to no
	// rollout: no rollout path or x-rollout-id header.
	SkipUnattributed = "unattributed_calls"
)

// Selection chooses rollout attempts and calls. The zero value selects every
// attempt of every status; DefaultSelection is the latest finished attempt.
type Selection struct {
	// Since and Until bound the start time of an attempt's first call
	// (Since inclusive, Until exclusive); zero = unbounded.
	Since, Until time.Time
	// TaskIDs keeps only these tasks (empty = all).
	TaskIDs []string
	// RolloutIDs keeps only these rollouts (empty = all); the task queue's
	// completion cursor resolves to such a list.
	RolloutIDs []string
	// Statuses keeps attempts whose latest status is one of these (empty =
	// any, including attempts never registered in the rollouts table;
	// StatusUnregistered names those, selected only once rewarded).
	Statuses []string
	// AgentName keeps only calls whose agent_name matches (nil = all).
	AgentName *regexp.Regexp
	// MinPolicyVersion drops calls served by an older policy version
	// (compared as integers when both are integers, optionally "v"-prefixed,
	// else as strings). Empty = no minimum.
	MinPolicyVersion string
	// Attempts is AttemptsLatest (default) or AttemptsAll.
	Attempts string
}

// DefaultStatuses are the statuses DefaultSelection selects.
var DefaultStatuses = []string{"succeeded", "failed", StatusUnregistered}

// DefaultSelection selects the latest finished attempt of every rollout:
// succeeded or failed in the rollouts table (failed attempts are trained
// on with their reward, 0 when none, as Agent Lightning does), or never
// registered there and rewarded (StatusUnregistered: the natural path of
// calls on the per-rollout URL plus POST .../rewards); cancelled, queued
// and running ones are not selected.
func DefaultSelection() Selection {
	return Selection{Statuses: slices.Clone(DefaultStatuses), Attempts: AttemptsLatest}
}

// AttemptRef names one selected attempt.
type AttemptRef struct {
	RolloutID, AttemptID, TaskID, Status string
	// GroupID is the rollout's training group, the rollouts table's
	// group_id (set per task per enqueue call by POST /api/v1/tasks, or
	// given to POST /api/v1/rollouts), or for rows written before that
	// column existed the "group_id" of their metadata; "" when it has none.
	GroupID           string
	FirstCallUnixNano uint64
}

// SelectAttempts lists the attempts sel chooses, ordered by rollout and
// attempt (see selectEach; Build does not hold this list).
func SelectAttempts(ctx context.Context, store export.Store, sel Selection) ([]AttemptRef, error) {
	var out []AttemptRef
	err := selectEach(ctx, store, sel, "", func(a AttemptRef) error {
		out = append(out, a)
		return nil
	}, nil)
	return out, err
}

// selectEach hands f the attempts sel chooses, one at a time, ordered by
// rollout and attempt: the order of the stores' primary keys, so that
// reading them in chunks reads neighbouring rows (ClickHouse reads whole
// granules of 8,192 rows: in task order, each rollout of a chunk cost a
// granule of its own). It reads the rollouts table and a per-attempt
// aggregate of llm_calls through Store.Query with SQL that SQLite and
// ClickHouse both run, each in key order, and merges them as they come:
// the rollouts rows (one per attempt once merged) wait in a temporary file
// in dir while the aggregate is read, so memory holds one rollout's
// attempts, not the selection. Filtering happens here so no value is
// spliced into SQL. skip, when set, is told why each attempt with calls
// that sel leaves out was left out (the Skip* reasons), and about calls
// attributed to no rollout (SkipUnattributed, once per call row).
func selectEach(ctx context.Context, store export.Store, sel Selection, dir string, f func(AttemptRef) error, skip func(reason string, n int)) error {
	if sel.Attempts != "" && sel.Attempts != AttemptsLatest && sel.Attempts != AttemptsAll {
		return fmt.Errorf("bridge: attempt choice %q is not %q or %q", sel.Attempts, AttemptsLatest, AttemptsAll)
	}
	listed, err := newRecordFile(dir, "selection", 64<<10)
	if err != nil {
		return err
	}
	defer listed.close()
	var rec recordEncoder
	write := func(a *attemptRow) error {
		rec = rec[:0]
		encodeRef(&rec, &a.AttemptRef, a.updated)
		return listed.append(rec)
	}
	// One entry per attempt: the latest row's status (ReplacingMergeTree may
	// hold several rows), the latest task id and group that are not empty.
	var cur attemptRow
	have := false
	// Metadata only where group_id is empty: rows of older releases kept the
	// group there alone (and metadata can be large).
	err = queryEach(ctx, store, "SELECT rollout_id, attempt_id, task_id, status, updated_unix_nano, group_id,"+
		" CASE WHEN group_id = '' THEN metadata ELSE '' END FROM rollouts ORDER BY rollout_id, attempt_id, updated_unix_nano", func(row []string) error {
		if len(row) < 7 {
			return fmt.Errorf("row with %d columns", len(row))
		}
		upd, err := strconv.ParseUint(row[4], 10, 64)
		if err != nil {
			return fmt.Errorf("updated_unix_nano %q: %w", row[4], err)
		}
		a := attemptRow{AttemptRef: AttemptRef{RolloutID: row[0], AttemptID: row[1], TaskID: row[2], Status: row[3], GroupID: row[5]},
			updated: upd}
		if a.GroupID == "" {
			if g := gjson.Get(row[6], "group_id"); g.Type == gjson.String {
				a.GroupID = g.Str
			}
		}
		if have {
			switch c := compareAttempts(&cur, &a); {
			case c == 0 && cur.updated <= a.updated:
				task, group := cmp.Or(a.TaskID, cur.TaskID), cmp.Or(a.GroupID, cur.GroupID)
				cur = a
				cur.TaskID, cur.GroupID = task, group
				return nil
			case c >= 0:
				return errOrder
			}
			if err := write(&cur); err != nil {
				return err
			}
		}
		cur, have = a, true
		return nil
	})
	if err == nil && have {
		err = write(&cur)
	}
	if err != nil {
		if strings.Contains(err.Error(), "group_id") {
			return fmt.Errorf("bridge: listing rollouts: the rollouts table has no group_id (made by an older rollgate; opening it with this one adds the column, on a cluster see deploy/clickhouse/cluster.sql): %w", err)
		}
		return fmt.Errorf("bridge: listing rollouts: %w", err)
	}
	if err := listed.rewind(); err != nil {
		return err
	}
	// The listed attempts, read back one ahead of the aggregate's rows.
	var next *attemptRow
	advance := func() error {
		b, err := listed.next()
		if err == io.EOF {
			next = nil
			return nil
		}
		if err != nil {
			return err
		}
		a := &attemptRow{}
		if a.AttemptRef, a.updated, err = decodeRef(b); err != nil {
			return listed.readErr(err)
		}
		next = a
		return nil
	}
	if err := advance(); err != nil {
		return err
	}
	if skip == nil {
		skip = func(string, int) {}
	}
	choose := chooser(sel, f, skip)
	var run []attemptRow // the attempts of one rollout
	add := func(a attemptRow) error {
		if len(run) > 0 && run[0].RolloutID != a.RolloutID {
			if err := choose(run); err != nil {
				return err
			}
			clear(run)
			run = run[:0]
		}
		run = append(run, a)
		return nil
	}
	var last attemptRow
	err = queryEach(ctx, store, "SELECT rollout_id, attempt_id, max(task_id), min(start_time_unix_nano), count(*) FROM llm_calls"+
		" GROUP BY rollout_id, attempt_id ORDER BY rollout_id, attempt_id", func(row []string) error {
		if len(row) < 5 {
			return fmt.Errorf("row with %d columns", len(row))
		}
		first, err := strconv.ParseUint(row[3], 10, 64)
		if err != nil {
			return fmt.Errorf("start time %q: %w", row[3], err)
		}
		if row[0] == "" {
			// Calls attributed to no rollout: counted, never selected.
			n, _ := strconv.Atoi(row[4])
			skip(SkipUnattributed, n)
			return nil
		}
		a := attemptRow{AttemptRef: AttemptRef{RolloutID: row[0], AttemptID: row[1]}}
		if last.RolloutID != "" && compareAttempts(&last, &a) >= 0 {
			return errOrder
		}
		last = a
		// Listed attempts before this one have no calls.
		for next != nil && compareAttempts(next, &a) < 0 {
			if err := add(*next); err != nil {
				return err
			}
			if err := advance(); err != nil {
				return err
			}
		}
		if next != nil && compareAttempts(next, &a) == 0 {
			a = *next
			if err := advance(); err != nil {
				return err
			}
		} // else an attempt never registered in the rollouts table
		a.hasCalls, a.FirstCallUnixNano = true, first
		if a.TaskID == "" {
			a.TaskID = row[2]
		}
		return add(a)
	})
	for err == nil && next != nil {
		if err = add(*next); err == nil {
			err = advance()
		}
	}
	if err != nil {
		return fmt.Errorf("bridge: listing attempts of llm_calls: %w", err)
	}
	if len(run) > 0 {
		return choose(run)
	}
	return nil
}

// errOrder is a store handing out rows out of the order asked for.
var errOrder = errors.New("rows out of order (the store does not sort strings byte by byte?)")

// compareAttempts orders attempts by rollout id, then attempt id.
func compareAttempts(a, b *attemptRow) int {
	return cmp.Or(strings.Compare(a.RolloutID, b.RolloutID), strings.Compare(a.AttemptID, b.AttemptID))
}

// chooser returns what selectEach does with the attempts of one rollout,
// in attempt order: the group from any of them, then the attempts that
// pass sel's filters, all or the latest, handed to f.
func chooser(sel Selection, f func(AttemptRef) error, skip func(string, int)) func(run []attemptRow) error {
	tasks := set(sel.TaskIDs)
	rollouts := set(sel.RolloutIDs)
	statuses := set(sel.Statuses)
	var since, until uint64
	if !sel.Since.IsZero() {
		since = uint64(sel.Since.UnixNano())
	}
	if !sel.Until.IsZero() {
		until = uint64(sel.Until.UnixNano())
	}
	return func(run []attemptRow) error {
		held("rollout", len(run))
		group := ""
		for _, a := range run {
			group = cmp.Or(group, a.GroupID)
		}
		var best *attemptRow
		for i := range run {
			a := &run[i]
			status := a.Status
			if status == "" && len(statuses) > 0 {
				status = StatusUnregistered
			}
			why := ""
			switch {
			case !a.hasCalls:
				continue
			case len(rollouts) > 0 && !rollouts[a.RolloutID]:
				why = SkipRollouts
			case len(tasks) > 0 && !tasks[a.TaskID]:
				why = SkipTasks
			case since != 0 && a.FirstCallUnixNano < since,
				until != 0 && a.FirstCallUnixNano >= until:
				why = SkipTime
			case len(statuses) > 0 && !statuses[status]:
				why = SkipStatus + status
			}
			if why != "" {
				skip(why, 1)
				continue
			}
			a.GroupID, a.Status = group, status
			if sel.Attempts == AttemptsAll {
				if err := f(a.AttemptRef); err != nil {
					return err
				}
			} else if best == nil || later(a.updated, a.FirstCallUnixNano, a.AttemptID, best.updated, best.FirstCallUnixNano, best.AttemptID) {
				best = a
			}
		}
		if best != nil {
			return f(best.AttemptRef)
		}
		return nil
	}
}

// attemptRow is an attempt as the selection reads it.
type attemptRow struct {
	AttemptRef
	updated  uint64
	hasCalls bool
}

// queryEach hands the rows of query to f one at a time when the store can
// (export.RowStreamer: the selection then never holds every row of the
// rollouts table as text), else from Store.Query's result.
func queryEach(ctx context.Context, store export.Store, query string, f func(row []string) error) error {
	if rs, ok := store.(export.RowStreamer); ok {
		return rs.QueryEach(ctx, query, f)
	}
	res, err := store.Query(ctx, query)
	if err != nil {
		return err
	}
	for _, row := range res.Rows {
		if err := f(row); err != nil {
			return err
		}
	}
	return nil
}

// later orders attempts by last status update, then first call, then id.
func later(upd, first uint64, id string, bUpd, bFirst uint64, bID string) bool {
	if upd != bUpd {
		return upd > bUpd
	}
	if first != bFirst {
		return first > bFirst
	}
	return id > bID
}

func set(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		if x = strings.TrimSpace(x); x != "" {
			m[x] = true
		}
	}
	return m
}

// versionBelow reports whether version v is older than min.
func versionBelow(v, min string) bool {
	if min == "" {
		return false
	}
	a, errA := strconv.ParseInt(strings.TrimPrefix(strings.TrimPrefix(v, "v"), "V"), 10, 64)
	b, errB := strconv.ParseInt(strings.TrimPrefix(strings.TrimPrefix(min, "v"), "V"), 10, 64)
	if errA == nil && errB == nil {
		return a < b
	}
	return v < min
}
