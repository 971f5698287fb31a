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
	ExclSuperseded    = "superseded_retry"     // a try of a call the agent retried and received a later try of (export.SupersededTries)
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
	ExclMixedPolicy   = "mixed_policy"         // samples whose tokens more than one policy version sampled, with MixedPolicy "drop" (samples)
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
// granule of its own). It reads the rollouts table
// (export.Reader.EachRolloutState) and a per-attempt aggregate of llm_calls
// (EachAttemptCalls), each in key order, and merges them as they come: the
// rollouts rows (one per attempt once merged) wait in a temporary file in
// dir while the aggregate is read, so memory holds one rollout's attempts,
// not the selection. Filtering happens here, not in the store. skip, when
// set, is told why each attempt with calls that sel leaves out was left
// out (the Skip* reasons), and about calls attributed to no rollout
// (SkipUnattributed, once per call row).
func selectEach(ctx context.Context, store export.Store, sel Selection, dir string, f func(AttemptRef) error, skip func(reason string, n int)) error {
	if sel.Attempts != "" && sel.Attempts != AttemptsLatest && sel.Attempts != AttemptsAll {
		return fmt.Errorf("bridge: attempt choice %q is not %q or %q", sel.Attempts, AttemptsLatest, AttemptsAll)
	}
	listed, err := newRecordFile(dir, "selection", 64<<10)
	if err != nil {
		return err
	}
	defer listed.close()
	if err := listAttempts(ctx, store, listed); err != nil {
		return err
	}
	if err := listed.rewind(); err != nil {
		return err
	}
	if skip == nil {
		skip = func(string, int) {}
	}
	m := &attemptMerge{listed: listed, choose: chooser(sel, f, skip)}
	if err := m.advance(); err != nil {
		return err
	}
	var last attemptRow
	err = store.EachAttemptCalls(ctx, func(c export.AttemptCalls) error {
		if c.RolloutID == "" {
			// Calls attributed to no rollout: counted, never selected.
			skip(SkipUnattributed, c.Calls)
			return nil
		}
		a := attemptRow{AttemptRef: AttemptRef{RolloutID: c.RolloutID, AttemptID: c.AttemptID}}
		if last.RolloutID != "" && compareAttempts(&last, &a) >= 0 {
			return errOrder
		}
		last = a
		return m.withCalls(a, c)
	})
	for err == nil && m.next != nil {
		err = m.addNext()
	}
	if err != nil {
		return fmt.Errorf("bridge: listing attempts of llm_calls: %w", err)
	}
	if len(m.run) > 0 {
		return m.choose(m.run)
	}
	return nil
}

// listAttempts writes one record per attempt of the rollouts table to
// listed, in key order: the latest row's status (ReplacingMergeTree may
// hold several rows), the latest task id and group that are not empty (a
// row of an older release kept the group in its metadata alone).
func listAttempts(ctx context.Context, store export.Store, listed *recordFile) error {
	var rec recordEncoder
	write := func(a *attemptRow) error {
		rec = rec[:0]
		encodeRef(&rec, &a.AttemptRef, a.updated)
		return listed.append(rec)
	}
	var cur attemptRow
	have := false
	err := store.EachRolloutState(ctx, func(r *export.Rollout) error {
		a := attemptRow{AttemptRef: AttemptRef{RolloutID: r.RolloutID, AttemptID: r.AttemptID, TaskID: r.TaskID, Status: r.Status, GroupID: r.GroupID},
			updated: r.UpdatedUnixNano}
		if a.GroupID == "" {
			if g := gjson.Get(r.Metadata, "group_id"); g.Type == gjson.String {
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
	return nil
}

// attemptMerge merges the listed attempts (read back one ahead) with the
// aggregate of llm_calls, and hands choose the attempts of one rollout at a
// time.
type attemptMerge struct {
	listed *recordFile
	next   *attemptRow // the next listed attempt, nil after the last
	run    []attemptRow
	choose func(run []attemptRow) error
}

// advance reads the next listed attempt.
func (m *attemptMerge) advance() error {
	b, err := m.listed.next()
	if err == io.EOF {
		m.next = nil
		return nil
	}
	if err != nil {
		return err
	}
	a := &attemptRow{}
	if a.AttemptRef, a.updated, err = decodeRef(b); err != nil {
		return m.listed.readErr(err)
	}
	m.next = a
	return nil
}

// add adds a to the current rollout's run, handing the run to choose first
// when a starts another rollout.
func (m *attemptMerge) add(a attemptRow) error {
	if len(m.run) > 0 && m.run[0].RolloutID != a.RolloutID {
		if err := m.choose(m.run); err != nil {
			return err
		}
		clear(m.run)
		m.run = m.run[:0]
	}
	m.run = append(m.run, a)
	return nil
}

// addNext adds the next listed attempt (one without calls so far).
func (m *attemptMerge) addNext() error {
	if err := m.add(*m.next); err != nil {
		return err
	}
	return m.advance()
}

// withCalls adds the attempt a of the aggregate row c, after the listed
// attempts before it (which have no calls), merged with its listed entry
// when it has one (else an attempt never registered in the rollouts table).
func (m *attemptMerge) withCalls(a attemptRow, c export.AttemptCalls) error {
	for m.next != nil && compareAttempts(m.next, &a) < 0 {
		if err := m.addNext(); err != nil {
			return err
		}
	}
	if m.next != nil && compareAttempts(m.next, &a) == 0 {
		a = *m.next
		if err := m.advance(); err != nil {
			return err
		}
	}
	a.hasCalls, a.FirstCallUnixNano = true, c.FirstStart
	if a.TaskID == "" {
		a.TaskID = c.TaskID
	}
	return m.add(a)
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
