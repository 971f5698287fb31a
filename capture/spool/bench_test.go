package spool

import (
	"context"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
)

type nopSink struct{}

func (nopSink) Write(context.Context, *export.Batch) error { return nil }

type downSink struct{}

func (downSink) Write(context.Context, *export.Batch) error { return errDown }

// BenchmarkWriteHealthy is the happy path: the spool is empty and the sink
// takes every batch.
func BenchmarkWriteHealthy(b *testing.B) {
	s, err := New(Config{Dir: b.TempDir()}, nopSink{}, "bench", nil, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close(context.Background())
	bt := batch(1)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Write(ctx, bt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteSpilled is the outage path: every batch (2 rows, ~750
// bytes encoded) goes to disk, fsynced per record or in the background.
func BenchmarkWriteSpilled(b *testing.B) {
	for _, bc := range []struct {
		name string
		sync time.Duration
	}{{"fsync-each", 0}, {"fsync-100ms", 100 * time.Millisecond}} {
		b.Run(bc.name, func(b *testing.B) {
			s, err := New(Config{Dir: b.TempDir(), SyncInterval: bc.sync, RetryMin: time.Hour, RetryMax: time.Hour},
				downSink{}, "bench", nil, quietLog())
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			bt := batch(1)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := s.Write(ctx, bt); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(AppendRecord(nil, bt))))
		})
	}
}
