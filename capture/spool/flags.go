package spool

import "flag"

// RegisterFlags registers the --spool-* flags on fs, bound to c's fields,
// with the defaults New applies; registering writes them into c.
// rollgate serve keeps one spool per store in a subfolder of --spool-dir.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	d := *c
	d.fillDefaults()
	fs.StringVar(&c.Dir, "spool-dir", d.Dir, "durable spool folder: captured rows wait here (checksummed, replayed in order) while the store is down or slow; empty = no spool (rows are dropped, counted, after retries). Created 0700 if missing; an existing folder must belong to the gateway's user and not be writable by group or others, and may hold no symbolic link (serve refuses to start otherwise)")
	fs.Int64Var(&c.MaxBytes, "spool-max-bytes", d.MaxBytes, "largest size of the spool")
	fs.StringVar((*string)(&c.FullPolicy), "spool-full-policy", string(d.FullPolicy), "when the spool is full: block (capture waits) or drop (rows dropped and counted in rollgate_spool_dropped_rows_total)")
	fs.DurationVar(&c.SyncInterval, "spool-sync-interval", d.SyncInterval, "fsync the spool at this interval instead of on every batch (0); an OS crash can lose up to one interval, a killed process loses nothing written")
}
