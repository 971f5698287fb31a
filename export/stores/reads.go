package stores

import (
	"context"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
)

// read runs f on the store once connected, or returns why it is not.
func read[T any](b *Background, f func(s *clickhouse.Store) (T, error)) (T, error) {
	s, err := b.get()
	if err != nil {
		var zero T
		return zero, err
	}
	return f(s)
}

// StoreVersion implements export.Reader.
func (b *Background) StoreVersion(ctx context.Context) (string, error) {
	return read(b, func(s *clickhouse.Store) (string, error) { return s.StoreVersion(ctx) })
}

// RolloutPage implements export.Reader.
func (b *Background) RolloutPage(ctx context.Context, q export.RolloutPageQuery) ([]export.RolloutSummary, bool, error) {
	s, err := b.get()
	if err != nil {
		return nil, false, err
	}
	return s.RolloutPage(ctx, q)
}

// RolloutAttempts implements export.Reader.
func (b *Background) RolloutAttempts(ctx context.Context, rolloutID string, limit int) (*export.AttemptList, error) {
	return read(b, func(s *clickhouse.Store) (*export.AttemptList, error) {
		return s.RolloutAttempts(ctx, rolloutID, limit)
	})
}

// AttemptTotals implements export.Reader.
func (b *Background) AttemptTotals(ctx context.Context, q export.AttemptTotalsQuery) (int, []export.Reward, error) {
	s, err := b.get()
	if err != nil {
		return 0, nil, err
	}
	return s.AttemptTotals(ctx, q)
}

// GroupMembers implements export.Reader.
func (b *Background) GroupMembers(ctx context.Context, groupID string) ([]export.Rollout, error) {
	return read(b, func(s *clickhouse.Store) ([]export.Rollout, error) { return s.GroupMembers(ctx, groupID) })
}

// EachRolloutState implements export.Reader.
func (b *Background) EachRolloutState(ctx context.Context, f func(*export.Rollout) error) error {
	_, err := read(b, func(s *clickhouse.Store) (struct{}, error) { return struct{}{}, s.EachRolloutState(ctx, f) })
	return err
}

// EachAttemptCalls implements export.Reader.
func (b *Background) EachAttemptCalls(ctx context.Context, f func(export.AttemptCalls) error) error {
	_, err := read(b, func(s *clickhouse.Store) (struct{}, error) { return struct{}{}, s.EachAttemptCalls(ctx, f) })
	return err
}

// FailedToolSpans implements export.Reader.
func (b *Background) FailedToolSpans(ctx context.Context) ([]export.Span, error) {
	return read(b, func(s *clickhouse.Store) ([]export.Span, error) { return s.FailedToolSpans(ctx) })
}

// CallHeads implements export.Reader.
func (b *Background) CallHeads(ctx context.Context, q export.CallHeadQuery) ([]export.CallHead, error) {
	return read(b, func(s *clickhouse.Store) ([]export.CallHead, error) { return s.CallHeads(ctx, q) })
}

// AttemptFirstEnds implements export.Reader.
func (b *Background) AttemptFirstEnds(ctx context.Context, q export.CallHeadQuery) (map[string]uint64, error) {
	return read(b, func(s *clickhouse.Store) (map[string]uint64, error) { return s.AttemptFirstEnds(ctx, q) })
}

// CallChecks implements export.Reader.
func (b *Background) CallChecks(ctx context.Context, r export.RolloutRange) ([]export.CallCheck, error) {
	return read(b, func(s *clickhouse.Store) ([]export.CallCheck, error) { return s.CallChecks(ctx, r) })
}
