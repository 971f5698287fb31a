package export

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Axes of a training read (TrainingQuery.By).
const (
	// TrainingByPolicy aggregates attempts by the policy version that
	// served their first call (the trainer bridge's task+policy grouping
	// takes the same one); attempts without a call have version "".
	TrainingByPolicy = "policy"
	// TrainingByGroup aggregates attempts by their rollout's group_id, and
	// attempts of rollouts without one by task (TrainingStep.GroupID "").
	TrainingByGroup = "group"
)

// MaxTrainingSteps bounds TrainingQuery.Limit: what a training read returns
// is held whole.
const MaxTrainingSteps = 1000

// TrainingQuery asks Store.TrainingSteps for the aggregates of the latest
// training steps along one axis. Every attempt of every rollout counts
// (calls, registered state, episode reward): one row per step comes back,
// never a row per attempt.
type TrainingQuery struct {
	// By is TrainingByPolicy or TrainingByGroup.
	By string
	// Since and Until (unix ns, 0 = unbounded) keep the attempts whose
	// first call started in [Since, Until); an attempt without a call
	// counts at its latest registered update.
	Since, Until uint64
	// Limit is how many steps come back, the latest first (by the first
	// call of their first attempt): 1 to MaxTrainingSteps.
	Limit int
}

// Check says what is wrong with q, or returns nil.
func (q TrainingQuery) Check() error {
	if q.By != TrainingByPolicy && q.By != TrainingByGroup {
		return fmt.Errorf("training read: axis %q is not %q or %q", q.By, TrainingByPolicy, TrainingByGroup)
	}
	if q.Limit < 1 || q.Limit > MaxTrainingSteps {
		return fmt.Errorf("training read: limit %d is not between 1 and %d", q.Limit, MaxTrainingSteps)
	}
	if q.Until != 0 && q.Until <= q.Since {
		return fmt.Errorf("training read: until (%d) is not after since (%d)", q.Until, q.Since)
	}
	return nil
}

// TrainingStep is one step's aggregate over its attempts (one per
// (rollout, attempt) pair seen in llm_calls or rollouts).
type TrainingStep struct {
	// PolicyVersion is the step's policy version (TrainingByPolicy).
	PolicyVersion string
	// GroupID is the step's group (TrainingByGroup); "" for the attempts
	// of rollouts without a group_id, aggregated by TaskID.
	GroupID string
	// TaskID is the task of the step's attempts (the largest id when they
	// have several).
	TaskID string
	// FirstStart and LastStart are the earliest and latest first call of
	// its attempts (unix ns); LastActivity is its latest call, state update
	// or episode reward.
	FirstStart, LastStart, LastActivity uint64
	// Attempts counts the attempts; Succeeded and Failed those whose latest
	// registered status is so (the rest are queued, running, cancelled or
	// never registered).
	Attempts, Succeeded, Failed int
	// FinishedNoReward counts the succeeded and failed attempts without an
	// episode reward (the trainer bridge's default gives them 0).
	FinishedNoReward int
	// Rewarded counts the attempts with an episode reward (sequence 0,
	// name "primary"; the latest when several). One posted without
	// attempt_id is the rollout's and counts for each of its attempts, as
	// the trainer bridge counts it: an attempt's reward is the later of its
	// own and its rollout's, its own on a tie. RewardSum, RewardSumSq,
	// RewardMin and RewardMax are over those rewards (0 when none).
	Rewarded                                     int
	RewardSum, RewardSumSq, RewardMin, RewardMax float64
	// Calls counts the call rows (one per choice); FailedCalls those with
	// an error or an HTTP status of 300 or more; VerifiedCalls the others
	// whose token ids came from the engine or its tokenizer and passed
	// every check (token_source engine or tokenize, token_check '').
	Calls, FailedCalls, VerifiedCalls int
	// PromptTokens and CompletionTokens are the usage sums of its calls.
	PromptTokens, CompletionTokens uint64
}

// RewardMean is the mean episode reward of the rewarded attempts (NaN when none).
func (s TrainingStep) RewardMean() float64 {
	if s.Rewarded == 0 {
		return math.NaN()
	}
	return s.RewardSum / float64(s.Rewarded)
}

// RewardStd is the population standard deviation of the episode rewards
// (NaN when none).
func (s TrainingStep) RewardStd() float64 {
	if s.Rewarded == 0 {
		return math.NaN()
	}
	m := s.RewardMean()
	v := s.RewardSumSq/float64(s.Rewarded) - m*m
	if v < 0 { // rounding
		v = 0
	}
	return math.Sqrt(v)
}

// TrainingSQL renders q as one query over a store's per-attempt rows,
// sources: a UNION ALL of one SELECT per table, each grouped by rollout_id
// and attempt_id (a store writes them with its own aggregate functions,
// casts and join), with these columns, 0 or ” where the table has no such value:
//
//	rollout_id, attempt_id,
//	calls, failed, verified, pt, ct, task, t0, t1, pv   (llm_calls: counts, token sums, max task_id, first and last start, first call's policy_version)
//	st, grp, rtask, upd                                 (rollouts: the latest row's status, group_id, task_id and updated_unix_nano)
//	seen                                                (1 in the rows of llm_calls and rollouts)
//	tw, hasrw, reward                                   (rewards: the attempt's episode reward's time, 1, its value)
//
// The rewards rows are at most one per attempt, with the reward the
// trainer bridge takes: the later of the attempt's own latest and its
// rollout's latest posted without attempt_id, its own on a tie.
// An attempt is one seen in llm_calls or rollouts: a reward alone makes none.
// The rest is SQL that SQLite and ClickHouse (from 18.16: no JOIN, no
// common table expression) both run: the sources are merged per attempt,
// then per step. Only integers from q are spliced in. The row's columns are
// what ParseTrainingRow reads.
func TrainingSQL(q TrainingQuery, sources string) string {
	key := "a_pv AS k1, '' AS k2"
	if q.By == TrainingByGroup {
		key = "a_grp AS k1, CASE WHEN a_grp = '' THEN a_task ELSE '' END AS k2"
	}
	var where []string
	if q.Since != 0 {
		where = append(where, "a_t0 >= "+strconv.FormatUint(q.Since, 10))
	}
	if q.Until != 0 {
		where = append(where, "a_t0 < "+strconv.FormatUint(q.Until, 10))
	}
	cond := ""
	if len(where) > 0 {
		cond = " WHERE " + strings.Join(where, " AND ")
	}
	attempts := "SELECT sum(calls) AS a_calls, sum(failed) AS a_failed, sum(verified) AS a_verified, sum(pt) AS a_pt, sum(ct) AS a_ct," +
		" CASE WHEN max(rtask) != '' THEN max(rtask) ELSE max(task) END AS a_task," +
		" CASE WHEN sum(calls) > 0 THEN max(t0) ELSE max(upd) END AS a_t0, max(t1) AS a_t1, CASE WHEN max(upd) > max(tw) THEN max(upd) ELSE max(tw) END AS a_upd," +
		" max(pv) AS a_pv, max(st) AS a_status, max(grp) AS a_grp, max(hasrw) AS a_hasrw, sum(reward) AS a_reward" +
		" FROM (" + sources + ") GROUP BY rollout_id, attempt_id HAVING max(seen) = 1"
	return "SELECT " + key + ", max(a_task), min(a_t0), max(a_t0), max(a_t1), max(a_upd), count(*)," +
		" sum(CASE WHEN a_status = 'succeeded' THEN 1 ELSE 0 END), sum(CASE WHEN a_status = 'failed' THEN 1 ELSE 0 END)," +
		" sum(a_hasrw), sum(a_reward), sum(a_reward * a_reward)," +
		" min(CASE WHEN a_hasrw = 1 THEN a_reward ELSE 1e308 END), max(CASE WHEN a_hasrw = 1 THEN a_reward ELSE -1e308 END)," +
		" sum(a_calls), sum(a_failed), sum(a_verified), sum(a_pt), sum(a_ct)," +
		" sum(CASE WHEN a_status IN ('succeeded', 'failed') AND a_hasrw = 0 THEN 1 ELSE 0 END)" +
		" FROM (" + attempts + ")" + cond + " GROUP BY k1, k2 ORDER BY min(a_t0) DESC, k1 DESC, k2 DESC LIMIT " + strconv.Itoa(q.Limit)
}

// ParseTrainingRow reads one row of TrainingSQL's answer as rendered by
// Store.Query.
func ParseTrainingRow(by string, row []string) (TrainingStep, error) {
	var s TrainingStep
	if len(row) != 21 {
		return s, fmt.Errorf("training read: row with %d columns, want 21", len(row))
	}
	if by == TrainingByGroup {
		s.GroupID = row[0]
		if s.GroupID == "" {
			s.TaskID = row[1]
		}
	} else {
		s.PolicyVersion = row[0]
	}
	if s.TaskID == "" {
		s.TaskID = row[2]
	}
	var err error
	u := func(i int) uint64 {
		if err != nil {
			return 0
		}
		var n uint64
		if n, err = strconv.ParseUint(row[i], 10, 64); err != nil {
			err = fmt.Errorf("training read: column %d: %w", i, err)
		}
		return n
	}
	f := func(i int) float64 {
		if err != nil {
			return 0
		}
		var x float64
		if x, err = strconv.ParseFloat(row[i], 64); err != nil {
			err = fmt.Errorf("training read: column %d: %w", i, err)
		}
		return x
	}
	s.FirstStart, s.LastStart = u(3), u(4)
	s.LastActivity = max(u(5), u(6))
	s.Attempts, s.Succeeded, s.Failed, s.Rewarded = int(u(7)), int(u(8)), int(u(9)), int(u(10))
	s.RewardSum, s.RewardSumSq, s.RewardMin, s.RewardMax = f(11), f(12), f(13), f(14)
	if s.Rewarded == 0 { // the sentinels of an empty min and max
		s.RewardMin, s.RewardMax = 0, 0
	}
	s.Calls, s.FailedCalls, s.VerifiedCalls = int(u(15)), int(u(16)), int(u(17))
	s.PromptTokens, s.CompletionTokens = u(18), u(19)
	s.FinishedNoReward = int(u(20))
	return s, err
}

// ReadTrainingSteps is Store.TrainingSteps for a store that runs
// TrainingSQL through query: it checks q, runs the SQL and parses the rows.
func ReadTrainingSteps(q TrainingQuery, sources string, query func(string) (*Result, error)) ([]TrainingStep, error) {
	if err := q.Check(); err != nil {
		return nil, err
	}
	res, err := query(TrainingSQL(q, sources))
	if err != nil {
		return nil, fmt.Errorf("training read: %w", err)
	}
	out := make([]TrainingStep, 0, len(res.Rows))
	for _, row := range res.Rows {
		st, err := ParseTrainingRow(q.By, row)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}
