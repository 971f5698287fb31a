package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/rollgate/rollgate/gateway/seqstore"
)

// sequenceConfig is the sequence store's setting of serve's config file
// (the store itself is the --queue database, else a file beside --db).
type sequenceConfig struct {
	// Retention deletes an attempt's row once no id was reserved for it
	// this long (0 = keep rows forever).
	Retention time.Duration `yaml:"sequence_retention"`
	// Lease bounds how long a gateway cut off from the PostgreSQL queue
	// database keeps handing out sequence ids (seqstore.Options.SessionLease).
	Lease time.Duration `yaml:"sequence_lease"`
}

// RegisterFlags registers --sequence-retention and --sequence-lease
// (--sequence-timeout is the gateway's: gateway.Config.SequenceStoreTimeout).
func (c *sequenceConfig) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Retention, "sequence-retention", c.Retention,
		"delete the rg_sequences row (180 B in SQLite, 270 B in PostgreSQL) of an attempt no sequence id was reserved for in this long, hourly; it must exceed the longest an attempt may still get calls, or its ids start again at 1 (0 = keep rows forever)")
	if c.Lease == 0 {
		c.Lease = seqstore.DefaultSessionLease
	}
	fs.DurationVar(&c.Lease, "sequence-lease", c.Lease,
		"with a PostgreSQL --queue: a gateway whose session to it stops answering (a silent network partition) hands out no sequence id more than half this after the last answer and answers 503 until the session is back; PostgreSQL ends the cut-off session about this long after its last packet, and a takeover from an unresponsive gateway waits half this plus 1s (at least 2s). Round trips to PostgreSQL, resends after packet loss included, must stay well below 3/8 of it (1.5s at 4s)")
}

// openSequenceStore opens where sequence ids are reserved: the task queue's
// database when it is PostgreSQL (several gateways share it); else a SQLite
// file beside the queue's (--queue) or the embedded store's (--db, also
// when capturing to ClickHouse), named by sequenceFile. The file is its own so
// that reservations, which commit with synchronous=FULL (a reservation
// survives a power loss) in groups, never wait behind the capture store's
// batch writes for SQLite's single writer lock (measured with bench/ab: in
// the store's own file, p99 rose from 31 to 90 ms at 32 agents).
func openSequenceStore(ctx context.Context, queueDSN, dbPath string, opt seqstore.Options) (seqstore.Store, error) {
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
