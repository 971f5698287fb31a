package spool

import (
	"context"
	"sync/atomic"
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

// switchSink fails every write while down is set and takes every write,
// at no cost, otherwise.
type switchSink struct{ down atomic.Bool }

func (s *switchSink) Write(context.Context, *export.Batch) error {
	if s.down.Load() {
		return errDown
	}
	return nil
}

// BenchmarkReplay is the catch-up after an outage against a sink that
// costs nothing: ns/op is the replayer's own cost per spooled batch (read,
// decode, acknowledge), one batch per replay write and merged. Any pause
// between replay writes while the sink is healthy would show here.
func BenchmarkReplay(b *testing.B) {
	for _, bc := range []struct {
		name       string
		maxRecords int
	}{{"one-per-write", 1}, {"merged", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			sink := &switchSink{}
			sink.down.Store(true)
			s, err := New(Config{Dir: b.TempDir(), SyncInterval: time.Hour, ReplayMaxRecords: bc.maxRecords, RetryMin: time.Hour, RetryMax: time.Hour},
				sink, "bench", nil, quietLog())
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(context.Background())
			ctx := context.Background()
			bt := batch(1)
			for range b.N {
				if err := s.Write(ctx, bt); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			sink.down.Store(false)
			s.RetryNow()
			if err := s.Drain(ctx); err != nil {
				b.Fatal(err)
			}
		})
	}
}
