package clickhouse

import (
	"context"
	"fmt"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/rollgate/rollgate/export"
)

// Row identities used by WriteOnce. A call is one (span_id, choice_index); a
// span is one (trace_id, span_id); rewards and rollout states have no id of
// their own, so every column that a writer sets (except free-form values) is
// part of theirs.
type (
	callKey struct {
		span   string
		choice uint32
	}
	rewardKey struct {
		rollout, attempt string
		seq              uint64
		name, source     string
		value            float64
		time             uint64
	}
	rolloutKey struct {
		rollout, attempt, status string
		updated                  uint64
	}
	spanKey struct{ trace, span string }
)

// WriteOnce writes the rows of b that the database does not hold yet, so a
// batch sent again after an unconfirmed insert (the server committed it and
// the connection dropped before the answer; an error after some of the
// batch's tables were written) is stored exactly once. It reads the
// candidate rows' identities first, one query per non-empty table, and then
// inserts the rest with Write.
//
// An insert that the server is still committing when WriteOnce reads is not
// seen and would be written twice; the spool's replay backoff (100 ms and
// more after a failure) leaves the server that time.
func (s *Store) WriteOnce(ctx context.Context, b *export.Batch) error {
	if b == nil || b.Len() == 0 {
		return nil
	}
	rest, err := s.unstored(ctx, b)
	if err != nil {
		return err
	}
	if rest.Len() == 0 {
		return nil
	}
	return s.Write(ctx, rest)
}

// unstored returns the rows of b that are not in the database.
func (s *Store) unstored(ctx context.Context, b *export.Batch) (*export.Batch, error) {
	var (
		out = &export.Batch{}
		err error
	)
	out.Calls, err = skipStored(ctx, s, "llm_calls", "SELECT span_id, choice_index FROM llm_calls WHERE span_id IN ?", b.Calls,
		func(c export.Call) (callKey, []any) { return callKey{c.SpanID, c.ChoiceIndex}, []any{c.SpanID} },
		func(k *callKey) []any { return []any{&k.span, &k.choice} })
	if err != nil {
		return nil, err
	}
	out.Rewards, err = skipStored(ctx, s, "rewards", "SELECT rollout_id, attempt_id, sequence_id, name, source, value, time_unix_nano"+
		" FROM rewards WHERE rollout_id IN ? AND time_unix_nano IN ?", b.Rewards,
		func(r export.Reward) (rewardKey, []any) {
			return rewardKey{r.RolloutID, r.AttemptID, r.SequenceID, r.Name, r.Source, r.Value, r.TimeUnixNano}, []any{r.RolloutID, r.TimeUnixNano}
		},
		func(k *rewardKey) []any {
			return []any{&k.rollout, &k.attempt, &k.seq, &k.name, &k.source, &k.value, &k.time}
		})
	if err != nil {
		return nil, err
	}
	out.Rollouts, err = skipStored(ctx, s, "rollouts", "SELECT rollout_id, attempt_id, status, updated_unix_nano"+
		" FROM rollouts WHERE rollout_id IN ? AND updated_unix_nano IN ?", b.Rollouts,
		func(r export.Rollout) (rolloutKey, []any) {
			return rolloutKey{r.RolloutID, r.AttemptID, r.Status, r.UpdatedUnixNano}, []any{r.RolloutID, r.UpdatedUnixNano}
		},
		func(k *rolloutKey) []any { return []any{&k.rollout, &k.attempt, &k.status, &k.updated} })
	if err != nil {
		return nil, err
	}
	out.Spans, err = skipStored(ctx, s, "agent_spans", "SELECT trace_id, span_id FROM agent_spans WHERE span_id IN ?", b.Spans,
		func(sp export.Span) (spanKey, []any) { return spanKey{sp.TraceID, sp.SpanID}, []any{sp.SpanID} },
		func(k *spanKey) []any { return []any{&k.trace, &k.span} })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// skipStored returns the rows whose key the database does not hold. query
// selects the key columns (dest gives a key's scan destinations in that
// order) of candidate rows; its ? placeholders are bound, in order, to the
// sets of the values that key returns with each row's key.
func skipStored[T any, K comparable](ctx context.Context, s *Store, table, query string, rows []T,
	key func(T) (K, []any), dest func(*K) []any) ([]T, error) {
	if len(rows) == 0 {
		return nil, nil
	}
	var sets [][]any
	for _, r := range rows {
		_, vals := key(r)
		if sets == nil {
			sets = make([][]any, len(vals))
		}
		for i, v := range vals {
			sets[i] = append(sets[i], v)
		}
	}
	args := make([]any, len(sets))
	for i, set := range sets {
		args[i] = clickhouse.GroupSet{Value: set} // binds as (v1, v2, ...)
	}
	have := map[K]bool{}
	wrap := func(err error) error {
		return fmt.Errorf("clickhouse: reading stored %s.%s keys before a repeated write: %w", s.db, table, err)
	}
	res, err := s.conn.Query(ctx, query, args...)
	if err != nil {
		return nil, wrap(err)
	}
	defer res.Close()
	for res.Next() {
		var k K
		if err := res.Scan(dest(&k)...); err != nil {
			return nil, wrap(err)
		}
		have[k] = true
	}
	if err := res.Err(); err != nil {
		return nil, wrap(err)
	}
	var out []T
	for _, r := range rows {
		if k, _ := key(r); !have[k] {
			have[k] = true // a row twice in rows (two spooled copies of a call replayed in one write) is stored once
			out = append(out, r)
		}
	}
	return out, nil
}
