package bridge

import (
	"cmp"
	"context"
	"fmt"
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
	// any, including attempts never registered in the rollouts table).
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

// DefaultSelection selects the latest succeeded or failed attempt of every
// rollout: failed attempts are trained on with their reward (0 when none),
// as Agent Lightning does; cancelled and running ones are not selected.
func DefaultSelection() Selection {
	return Selection{Statuses: []string{"succeeded", "failed"}, Attempts: AttemptsLatest}
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
// attempt: the order of the stores' primary keys, so that reading them in
// chunks reads neighbouring rows (ClickHouse reads whole granules of 8,192
// rows: in task order, each rollout of a chunk cost a granule of its own). It reads the rollouts table and a per-attempt aggregate of
// llm_calls through Store.Query with SQL that SQLite and ClickHouse both run;
// filtering happens here so no value is spliced into SQL.
func SelectAttempts(ctx context.Context, store export.Store, sel Selection) ([]AttemptRef, error) {
	if sel.Attempts != "" && sel.Attempts != AttemptsLatest && sel.Attempts != AttemptsAll {
		return nil, fmt.Errorf("bridge: attempt choice %q is not %q or %q", sel.Attempts, AttemptsLatest, AttemptsAll)
	}
	// Every attempt in one slice, sorted and merged here rather than in
	// maps: a few hundred bytes per attempt less at the peak (maps, one
	// allocation per attempt and a second map per rollout held 640 bytes
	// per attempt at 2×10^5 attempts).
	var as []attemptRow
	// Metadata only where group_id is empty: rows of older releases kept the
	// group there alone (and metadata can be large).
	err := queryEach(ctx, store, "SELECT rollout_id, attempt_id, task_id, status, updated_unix_nano, group_id,"+
		" CASE WHEN group_id = '' THEN metadata ELSE '' END FROM rollouts", func(row []string) error {
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
		as = append(as, a)
		return nil
	})
	if err != nil {
		if strings.Contains(err.Error(), "group_id") {
			return nil, fmt.Errorf("bridge: listing rollouts: the rollouts table has no group_id (made by an older rollgate; opening it with this one adds the column, on a cluster see deploy/clickhouse/cluster.sql): %w", err)
		}
		return nil, fmt.Errorf("bridge: listing rollouts: %w", err)
	}
	// One entry per attempt: the latest row's status (ReplacingMergeTree may
	// hold several rows), the latest task id that is not empty.
	slices.SortFunc(as, func(a, b attemptRow) int {
		return cmp.Or(strings.Compare(a.RolloutID, b.RolloutID), strings.Compare(a.AttemptID, b.AttemptID), cmp.Compare(a.updated, b.updated))
	})
	as = mergeRuns(as, sameAttempt, func(into *attemptRow, a attemptRow) {
		task, group := cmp.Or(a.TaskID, into.TaskID), cmp.Or(a.GroupID, into.GroupID)
		*into = a
		into.TaskID, into.GroupID = task, group
	})
	listed := len(as)
	err = queryEach(ctx, store, "SELECT rollout_id, attempt_id, max(task_id), min(start_time_unix_nano) FROM llm_calls GROUP BY rollout_id, attempt_id", func(row []string) error {
		if len(row) < 4 {
			return fmt.Errorf("row with %d columns", len(row))
		}
		first, err := strconv.ParseUint(row[3], 10, 64)
		if err != nil {
			return fmt.Errorf("start time %q: %w", row[3], err)
		}
		if row[0] == "" {
			return nil // calls not attributed to any rollout
		}
		i, found := slices.BinarySearchFunc(as[:listed], [2]string{row[0], row[1]}, func(a attemptRow, k [2]string) int {
			return cmp.Or(strings.Compare(a.RolloutID, k[0]), strings.Compare(a.AttemptID, k[1]))
		})
		if !found {
			// An attempt never registered in the rollouts table.
			as = append(as, attemptRow{AttemptRef: AttemptRef{RolloutID: row[0], AttemptID: row[1]}})
			i = len(as) - 1
		}
		a := &as[i]
		a.hasCalls, a.FirstCallUnixNano = true, first
		if a.TaskID == "" {
			a.TaskID = row[2]
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bridge: listing attempts of llm_calls: %w", err)
	}
	if len(as) > listed {
		slices.SortFunc(as, func(a, b attemptRow) int {
			return cmp.Or(strings.Compare(a.RolloutID, b.RolloutID), strings.Compare(a.AttemptID, b.AttemptID))
		})
	}
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
	// Rollout by rollout: the group from any of its rows, then the attempts
	// that pass the filters, all or the latest, marked chosen; counted first
	// so that the list is allocated once.
	chosen := 0
	for start := 0; start < len(as); {
		end := start + 1
		for end < len(as) && as[end].RolloutID == as[start].RolloutID {
			end++
		}
		run := as[start:end]
		start = end
		group := ""
		for _, a := range run {
			group = cmp.Or(group, a.GroupID)
		}
		var best *attemptRow
		for i := range run {
			a := &run[i]
			switch {
			case !a.hasCalls,
				len(tasks) > 0 && !tasks[a.TaskID],
				len(rollouts) > 0 && !rollouts[a.RolloutID],
				len(statuses) > 0 && !statuses[a.Status],
				since != 0 && a.FirstCallUnixNano < since,
				until != 0 && a.FirstCallUnixNano >= until:
				continue
			}
			a.GroupID = group
			if sel.Attempts == AttemptsAll {
				a.chosen = true
				chosen++
			} else if best == nil || later(a.updated, a.FirstCallUnixNano, a.AttemptID, best.updated, best.FirstCallUnixNano, best.AttemptID) {
				best = a
			}
		}
		if best != nil {
			best.chosen = true
			chosen++
		}
	}
	out := make([]AttemptRef, 0, chosen)
	for _, a := range as {
		if a.chosen {
			out = append(out, a.AttemptRef)
		}
	}
	return out, nil
}

// attemptRow is an attempt as the selection reads it.
type attemptRow struct {
	AttemptRef
	updated  uint64
	hasCalls bool
	chosen   bool // selected
}

func sameAttempt(a, b *attemptRow) bool {
	return a.RolloutID == b.RolloutID && a.AttemptID == b.AttemptID
}

// mergeRuns folds each run of neighbouring elements that same puts together
// into its first element with merge (called with every later element in
// order), in place, and returns the shortened slice.
func mergeRuns[T any](xs []T, same func(a, b *T) bool, merge func(into *T, x T)) []T {
	n := 0
	for i := range xs {
		if n > 0 && same(&xs[n-1], &xs[i]) {
			merge(&xs[n-1], xs[i])
			continue
		}
		xs[n] = xs[i]
		n++
	}
	clear(xs[n:])
	return xs[:n]
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
