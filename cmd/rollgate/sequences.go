package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/rollgate/rollgate/gateway"
	"github.com/rollgate/rollgate/gateway/seqstore"
)

// sequenceFlags are serve's flags of the sequence store.
type sequenceFlags struct {
	timeout, retention *time.Duration
}

// addSequenceFlags registers serve's sequence store flags on fs.
func addSequenceFlags(fs *flag.FlagSet) sequenceFlags {
	return sequenceFlags{
		timeout: fs.Duration("sequence-timeout", 5*time.Second,
			"longest a call waits for its sequence id to be reserved in the database (the first call of an attempt, one call per block of 16 to 1024 ids); past it the call gets 503 and counts in rollgate_calls_rejected_total{reason=\"sequence_store\"} (see also --queue, --db)"),
		retention: fs.Duration("sequence-retention", 0,
			"delete the rg_sequences row (180 B in SQLite, 270 B in PostgreSQL) of an attempt no sequence id was reserved for in this long, hourly; it must exceed the longest an attempt may still get calls, or its ids start again at 1 (0 = keep rows forever)"),
	}
}

// apply sets cfg's sequence settings from the flags given or the defaults
// the config file leaves unset.
func (f sequenceFlags) apply(set map[string]bool, cfg *gateway.Config) {
	if set["sequence-timeout"] || cfg.SequenceStoreTimeout == 0 {
		cfg.SequenceStoreTimeout = *f.timeout
	}
}

// openSequenceStore opens where sequence ids are reserved: the task queue's
// database when it is PostgreSQL (several gateways share it); else a SQLite
// file beside the queue's (--queue) or the embedded store's (--db, also
// when capturing to ClickHouse), named by sequenceFile. The file is its own so
// that reservations, which commit with synchronous=FULL (a reservation
// survives a power loss) in groups, never wait behind the capture store's
// batch writes for SQLite's single writer lock (measured with bench/ab: in
// the store's own file, p99 rose from 31 to 90 ms at 32 agents).
func openSequenceStore(ctx context.Context, queueDSN, dbPath string, f sequenceFlags, opt seqstore.Options) (seqstore.Store, error) {
	opt.Retention = *f.retention
	if queueDSN == "" {
		queueDSN = dbPath
	}
	if !strings.HasPrefix(queueDSN, "postgres://") && !strings.HasPrefix(queueDSN, "postgresql://") {
		queueDSN = sequenceFile(strings.TrimPrefix(queueDSN, "sqlite:"))
	}
	st, err := seqstore.Open(ctx, queueDSN, opt)
	if err != nil {
		return nil, fmt.Errorf("opening the sequence store (the --queue database, else --db): %w", err)
	}
	return st, nil
}

// sequenceFile is the SQLite file of sequence ids beside the database file
// path: rollgate.db -> rollgate.sequences.db.
func sequenceFile(path string) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + ".sequences" + ext
}
