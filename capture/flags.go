package capture

import (
	"flag"
	"time"
)

// DefaultWALSyncInterval is the default of --capture-wal-sync-interval
// (WALConfig.RegisterFlags); the zero WALConfig never fsyncs.
const DefaultWALSyncInterval = time.Second

// RegisterFlags registers a flag (--capture-*) for each setting of c that
// rollgate serve's config file has under capture:, bound to c's field,
// with the defaults New applies; registering writes them into c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.setDefaults()
	fs.IntVar(&c.QueueSize, "capture-queue", d.QueueSize, "calls that may wait for capture; when full, calls are dropped from capture and counted (rollgate_capture_dropped_total)")
	fs.IntVar(&c.QueueBytes, "capture-queue-bytes", d.QueueBytes, "memory the calls waiting for capture may hold (bodies, token ids); past it calls are dropped from capture and counted, as for --capture-queue")
	fs.IntVar(&c.Workers, "capture-workers", d.Workers, "goroutines assembling captured calls into rows")
	fs.IntVar(&c.BatchSize, "capture-batch-size", d.BatchSize, "rows that make the capture write a batch to the store")
	fs.IntVar(&c.BatchBytes, "capture-batch-bytes", d.BatchBytes, "bytes of bodies and ids that make the capture write a batch before --capture-batch-size rows")
	fs.DurationVar(&c.FlushInterval, "capture-flush-interval", d.FlushInterval, "longest a captured row waits before it is written")
}

// RegisterFlags registers the write-ahead log's size and fsync flags
// (--capture-wal-*) on fs, bound to c's fields; registering writes the
// defaults into c. Dir is the caller's (rollgate serve: in --spool-dir).
func (c *WALConfig) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.fillDefaults()
	fs.Int64Var(&c.MaxBytes, "capture-wal-max-bytes", d.MaxBytes, "largest size of the capture write-ahead log; when full, answered calls are captured unlogged (a kill before they are stored loses them) and counted in rollgate_capture_wal_skipped_total{reason=\"full\"}")
	fs.DurationVar(&c.SyncInterval, "capture-wal-sync-interval", DefaultWALSyncInterval, "fsync the capture write-ahead log at this interval when it has new records (0 = never): a killed process loses nothing either way; an OS crash or power loss can lose the calls answered in the last interval")
}
