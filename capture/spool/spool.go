// Package spool is a durable, bounded, ordered buffer in front of an export
// sink: when the sink fails or is slow, batches go to local append-only
// segment files and a replayer sends them to the sink, in order, once it is
// back. A spooled batch is removed only after the sink's Write returned nil.
//
// # Durability
//
// Write returns nil only once the batch is stored in the sink or written to a
// segment file. Each record is handed to the kernel with one write(2) before
// Write returns, so killing the process (SIGKILL, OOM kill, panic) loses no
// acknowledged batch. With Config.SyncInterval 0 (the default) every record is
// also fsynced before Write returns, so an OS crash or power loss loses
// nothing acknowledged either; with SyncInterval > 0 records are fsynced in
// the background at that interval, and an OS crash or power loss can lose the
// records acknowledged during the last SyncInterval. What the spool never
// sees cannot be saved by it: batches still in the capture pipeline's memory
// when the process dies are lost.
//
// A batch whose write the sink committed but did not confirm (a timeout after
// the commit, a crash between the sink's answer and the spool recording it)
// is sent again. Replays go through export.WriteAgain, so a sink that
// implements export.OnceWriter (ClickHouse) skips the rows it already holds
// and each row is stored exactly once; other sinks get at-least-once delivery.
//
// # Layout
//
// Config.Dir holds segment files NNNNNNNNNNNNNNNNNNNN.seg, each an 8-byte
// magic followed by records (see AppendRecord: length, CRC-32C, payload), a
// file "ack" with the position of the next unacknowledged record, and a lock
// file that keeps a second process out; every file is FileMode in a folder
// CheckDir accepts, and none is opened through a symbolic link. At New,
// segments are scanned; a damaged region (bad length, checksum or magic) is
// copied to a quarantine file beside its segment
// (<segment>.<offset>.quarantine), counted in
// rollgate_spool_corrupt_records_total (its rows, when its payload still
// decodes, in rollgate_spool_dropped_rows_total) and skipped: the scan
// resynchronises on the next valid record (ScanRecords) and everything not
// acknowledged after it is replayed. A torn tail is truncated.
package spool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rollgate/rollgate/export"
)

// FullPolicy is what Write does when a batch does not fit in the spool.
type FullPolicy string

const (
	// Block waits until the replayer frees space, the caller's context ends
	// or the spool is closed. Nothing is dropped by the spool; the caller
	// sees the error and decides.
	Block FullPolicy = "block"
	// Drop refuses the batch at once with an error wrapping ErrFull and
	// counts its rows in rollgate_spool_dropped_rows_total.
	Drop FullPolicy = "drop"
)

// Errors returned by Write.
var (
	// ErrFull means the batch did not fit in the spool (policy Drop, a
	// record larger than MaxBytes, or policy Block and the context ended).
	ErrFull = errors.New("spool: full")
	// ErrClosed means the spool was closed.
	ErrClosed = errors.New("spool: closed")
)

// Config sizes the spool. Zero values take the documented defaults; Dir is required.
type Config struct {
	// Dir holds the segment files. It is created if missing; only one
	// process may use it at a time.
	Dir string `yaml:"dir"`
	// MaxBytes bounds the spooled records' total size (default 1 GiB).
	MaxBytes int64 `yaml:"max_bytes"`
	// SegmentBytes is the size at which a new segment file is started
	// (default MaxBytes/8, at most 64 MiB). A segment is deleted once all
	// its records are acknowledged.
	SegmentBytes int64 `yaml:"-"`
	// FullPolicy is Block (default) or Drop.
	FullPolicy FullPolicy `yaml:"full_policy"`
	// SyncInterval is how often spooled records are fsynced. 0 (default)
	// fsyncs every record before Write returns; > 0 fsyncs in the background
	// at this interval (faster spilling; an OS crash may lose the last
	// interval's records; a process kill loses nothing either way).
	SyncInterval time.Duration `yaml:"sync_interval"`
	// DirectTimeout bounds a direct sink write before the batch is spooled
	// instead, and a Write's wait for a nearly drained spool to empty so
	// that it can write directly again (default 5s).
	DirectTimeout time.Duration `yaml:"-"`
	// ReplayTimeout bounds one replay write to the sink (default 30s).
	ReplayTimeout time.Duration `yaml:"-"`
	// ReplayMaxRecords and ReplayMaxBytes bound how many spooled records
	// (batches as the capture pipeline wrote them), and how many bytes of
	// them, one replay write merges (defaults 256 and 8 MiB; 1 replays one
	// record per write).
	ReplayMaxRecords int   `yaml:"-"`
	ReplayMaxBytes   int64 `yaml:"-"`
	// RetryMin and RetryMax bound the replayer's exponential backoff after a
	// failed replay (defaults 100ms and 10s).
	RetryMin, RetryMax time.Duration `yaml:"-"`
}

func (c *Config) setDefaults() error {
	if c.Dir == "" {
		return errors.New("spool: Config.Dir is required (e.g. --spool-dir /var/lib/rollgate/spool)")
	}
	c.fillDefaults()
	switch c.FullPolicy {
	case Block, Drop:
	default:
		return fmt.Errorf("spool: unknown full policy %q (use %q or %q)", c.FullPolicy, Block, Drop)
	}
	return nil
}

// fillDefaults sets the zero values to their defaults.
func (c *Config) fillDefaults() {
	if c.MaxBytes <= 0 {
		c.MaxBytes = 1 << 30
	}
	if c.SegmentBytes <= 0 {
		c.SegmentBytes = min(c.MaxBytes/8, 64<<20)
	}
	if c.FullPolicy == "" {
		c.FullPolicy = Block
	}
	if c.DirectTimeout <= 0 {
		c.DirectTimeout = 5 * time.Second
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 30 * time.Second
	}
	if c.ReplayMaxRecords <= 0 {
		c.ReplayMaxRecords = 256
	}
	if c.ReplayMaxBytes <= 0 {
		c.ReplayMaxBytes = 8 << 20
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(10*time.Second, c.RetryMin)
	}
}

// Stats is a snapshot of the spool's state and counters.
type Stats struct {
	Records        int   // spooled batches not yet acknowledged
	Bytes          int64 // their size on disk
	Segments       int   // segment files holding them
	SpilledRows    uint64
	ReplayedRows   uint64
	DroppedRows    uint64
	CorruptRecords uint64
	ReplayErrors   uint64
}

// Spool is an export.Sink that forwards to another sink and spools to disk
// what that sink does not take. It is safe for concurrent use; concurrent
// Writes are serialized, and batches reach the sink in the order their
// Writes were admitted.
type Spool struct {
	cfg  Config
	sink export.Sink
	name string
	log  *slog.Logger
	m    *collectors
	dir  *dirState

	writeTok chan struct{} // held by the one Write in progress (and by Close)
	buf      []byte        // record encoding buffer, guarded by writeTok

	mu      sync.Mutex
	space   chan struct{} // closed and replaced whenever records are acknowledged
	closed  bool
	stopped chan struct{} // closed by Close: wakes waiters, stops the replayer
	wake    chan struct{} // a record was spooled (capacity 1)
	// tried is the record spooled when a direct write of it failed (valid
	// while triedSet): the sink may hold part of it, so it is replayed on
	// its own, as the same write (see replay). Set at start for the head
	// a previous process left, whose history is unknown.
	tried    position
	triedSet bool
	// regroup is the merged replay write a previous process recorded
	// (dirState.writeGroup) and may have had committed in part: its first
	// record and how many it merged (replayer only; 0: none).
	regroup  position
	regroupN int
	retry    chan struct{} // RetryNow: end the replayer's backoff (capacity 1)

	replayCtx    context.Context
	replayCancel context.CancelFunc
	done         chan struct{} // replayer and syncer finished
	closeOnce    sync.Once

	// replayOK: the replayer's last write succeeded and no direct write
	// or catchUp wait failed since (see catchUp).
	replayOK atomic.Bool

	spilled, replayed, dropped, corrupt, replayErrs atomic.Uint64
}

var (
	_ export.Sink       = (*Spool)(nil)
	_ export.OnceWriter = (*Spool)(nil)
)

// New opens (or creates) the spool in cfg.Dir in front of sink, recovers the
// records a previous process left there and starts replaying them. name
// labels the metrics (const label sink=name) and logs; the metrics are
// registered on reg unless it is nil.
func New(cfg Config, sink export.Sink, name string, reg prometheus.Registerer, log *slog.Logger) (*Spool, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	log = log.With("sink", name, "spool_dir", cfg.Dir)
	m, err := newCollectors(reg, name)
	if err != nil {
		return nil, err
	}
	m.maxBytes.Set(float64(cfg.MaxBytes))
	s := &Spool{
		cfg:      cfg,
		sink:     sink,
		name:     name,
		log:      log,
		m:        m,
		writeTok: make(chan struct{}, 1),
		space:    make(chan struct{}),
		stopped:  make(chan struct{}),
		wake:     make(chan struct{}, 1),
		retry:    make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	s.dir, err = openDir(cfg.Dir, cfg.SegmentBytes, s.countCorrupt, log)
	if err != nil {
		return nil, err
	}
	s.updateGauges()
	if st := s.dir; st.records > 0 {
		log.Warn("spool: replaying batches left by a previous run", "records", st.records, "bytes", st.bytes, "segments", len(st.segs))
		head := st.head()
		if g, n, ok := st.readGroup(); ok && n > 1 && g.seg == head.seg && g.off == head.off {
			s.regroup, s.regroupN = g, n
		} else {
			s.tried, s.triedSet = head, true
		}
	}
	s.replayCtx, s.replayCancel = context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.replay() }()
	if cfg.SyncInterval > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); s.syncLoop() }()
	}
	go func() { wg.Wait(); close(s.done) }()
	return s, nil
}

// countCorrupt counts a damaged record or region and the rows it held
// (when they can be told) as dropped.
func (s *Spool) countCorrupt(rows int) {
	s.corrupt.Add(1)
	s.m.corruptRecords.Inc()
	if rows > 0 {
		s.dropped.Add(uint64(rows))
		s.m.droppedRows.Add(float64(rows))
	}
}

// Write stores b in the sink, or in the spool when the sink fails, takes
// longer than DirectTimeout, or earlier batches are still spooled (order is
// kept). When the replayer keeps up and what is spooled fits in one replay
// write, Write first waits, up to DirectTimeout, for the spool to drain and
// then writes b directly (see catchUp), so the spool empties under steady
// load. It returns nil once b is in the sink or in a segment file (fsynced
// when SyncInterval is 0). A full spool waits (Block) or refuses (Drop) with
// an error wrapping ErrFull. b is not retained.
func (s *Spool) Write(ctx context.Context, b *export.Batch) error { return s.write(ctx, b, false) }

// WriteOnce implements export.OnceWriter: Write for a batch whose rows may
// be stored already (a retry, capture's WAL replay after a kill): the direct
// write goes through export.WriteAgain, as spooled batches' replays do.
func (s *Spool) WriteOnce(ctx context.Context, b *export.Batch) error { return s.write(ctx, b, true) }

func (s *Spool) write(ctx context.Context, b *export.Batch, once bool) error {
	if b == nil || b.Len() == 0 {
		return nil
	}
	select {
	case s.writeTok <- struct{}{}:
	case <-s.stopped:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("spool %s: waiting for an earlier write: %w", s.name, ctx.Err())
	}
	defer func() { <-s.writeTok }()

	s.mu.Lock()
	closed, empty := s.closed, s.dir.records == 0
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if !empty {
		empty = s.catchUp(ctx)
	}
	if empty {
		dctx, cancel := context.WithTimeout(ctx, s.cfg.DirectTimeout)
		var err error
		if once {
			err = export.WriteAgain(dctx, s.sink, b)
		} else {
			err = s.sink.Write(dctx, b)
		}
		cancel()
		if err == nil {
			return nil
		}
		s.replayOK.Store(false)
		s.log.Warn("spool: sink write failed; spooling to disk until it recovers", "rows", b.Len(), "err", err)
	}
	return s.spill(ctx, b, empty)
}

// catchUp waits, while the replayer keeps up (its last write succeeded)
// and what is spooled fits in one replay write (Config.ReplayMaxRecords,
// ReplayMaxBytes), for the spool to drain, at most DirectTimeout, and
// tells whether it did: the caller, holding writeTok, then writes its
// batch directly, behind the replayed ones. Without this, a spool whose
// batches arrive more often than one sink write takes never empties under
// steady load: every replay write leaves behind the batches spooled while
// it ran, and every batch goes through the disk and a replay for as long
// as the load lasts. A wait that ends without the drain (a sink slow or
// down again) spools the batch and disables the wait until a replay
// write succeeds again, so an outage costs one such wait, as it costs one
// failed direct write.
func (s *Spool) catchUp(ctx context.Context) bool {
	var timeout <-chan time.Time
	for {
		if !s.replayOK.Load() {
			return false
		}
		s.mu.Lock()
		n, bytes, ch := s.dir.records, s.dir.bytes, s.space
		s.mu.Unlock()
		if n == 0 {
			return true
		}
		if n > s.cfg.ReplayMaxRecords || bytes > s.cfg.ReplayMaxBytes {
			return false
		}
		if timeout == nil {
			t := time.NewTimer(s.cfg.DirectTimeout)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch: // records acknowledged, or a replay write failed
		case <-timeout:
			s.replayOK.Store(false)
			s.log.Warn("spool: the replayer did not catch up within the direct write timeout; spooling", "records", n, "timeout", s.cfg.DirectTimeout)
			return false
		case <-ctx.Done():
			return false
		case <-s.stopped:
			return false
		}
	}
}

// spill appends b to the spool. The caller holds writeTok. tried: b is
// spooled after its direct write failed (the spool was empty: it becomes
// the head).
func (s *Spool) spill(ctx context.Context, b *export.Batch, tried bool) error {
	s.buf = AppendRecord(s.buf[:0], b)
	n := int64(len(s.buf))
	if n > s.cfg.MaxBytes {
		s.m.full.Inc()
		s.drop(b, "batch larger than the whole spool")
		return fmt.Errorf("%w: batch of %d bytes exceeds the spool capacity of %d bytes (raise --spool-max-bytes)", ErrFull, n, s.cfg.MaxBytes)
	}
	s.mu.Lock()
	counted := false
	for s.dir.bytes+n > s.cfg.MaxBytes {
		if !counted {
			s.m.full.Inc()
			counted = true
		}
		if s.cfg.FullPolicy == Drop {
			s.mu.Unlock()
			s.drop(b, "spool full")
			return fmt.Errorf("%w: %d bytes spooled, capacity %d (policy drop)", ErrFull, s.dir.bytes, s.cfg.MaxBytes)
		}
		ch := s.space
		s.mu.Unlock()
		select {
		case <-ch:
		case <-s.stopped:
			return ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("%w: waited for space (policy block): %w", ErrFull, ctx.Err())
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if err := s.dir.append(s.buf, s.cfg.SyncInterval == 0); err != nil {
		return fmt.Errorf("spool %s: %w", s.name, err)
	}
	if tried && s.dir.records == 1 {
		s.tried, s.triedSet = s.dir.head(), true
	}
	rows := uint64(b.Len())
	s.spilled.Add(rows)
	s.m.spilledRows.Add(float64(rows))
	s.updateGaugesLocked()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

func (s *Spool) drop(b *export.Batch, why string) {
	rows := uint64(b.Len())
	s.dropped.Add(rows)
	s.m.droppedRows.Add(float64(rows))
	s.log.Error("spool: rows dropped", "reason", why, "rows", rows, "max_bytes", s.cfg.MaxBytes, "policy", string(s.cfg.FullPolicy))
}

// replay sends spooled records to the sink in order until the spool closes.
// One write carries the head record and the records after it in the head
// segment, up to Config.ReplayMaxRecords and Config.ReplayMaxBytes, merged
// into one batch: a sink's cost is mostly per write (ClickHouse: a read of
// the stored keys per table, then one insert), and a replayer that sent
// one record per write could not catch up while new batches keep being
// spooled behind it (drill e, cmd/rollgate/netns_drill_e_e2e_test.go). The
// records are acknowledged, in order, only after the sink took them all.
func (s *Spool) replay() {
	backoff := s.cfg.RetryMin
	var (
		cur      *export.Batch
		curPos   []position // the records in cur, head first
		failures int
	)
	for {
		s.mu.Lock()
		empty := s.dir.records == 0
		var (
			pos  position
			head segment
		)
		if !empty {
			pos, head = s.dir.head(), s.dir.segs[0]
		}
		tried := s.triedSet && s.tried.seg == pos.seg && s.tried.off == pos.off
		s.mu.Unlock()
		if empty {
			select {
			case <-s.wake:
				continue
			case <-s.stopped:
				return
			}
		}
		select {
		case <-s.stopped:
			return
		default:
		}
		if cur == nil || pos.seg != curPos[0].seg || pos.off != curPos[0].off {
			b, n, err := s.dir.read(pos)
			if err != nil && n > 0 && errors.Is(err, ErrCorruptRecord) {
				// Its checksum held at open but it does not decode (a newer
				// release wrote it?): set it aside, replay the rest.
				pos.n = n
				q, qerr := s.dir.quarantineRecord(pos)
				s.countCorrupt(0)
				s.log.Error("spool: undecodable record set aside; replaying the records after it", "segment", pos.seg, "offset", pos.off,
					"quarantine", q, "quarantine_err", qerr, "err", err)
				s.mu.Lock()
				if err := s.dir.ack(pos); err != nil {
					s.log.Error("spool: recording replay progress failed", "err", err)
				}
				s.signalSpaceLocked()
				s.updateGaugesLocked()
				s.mu.Unlock()
				cur = nil
				continue
			}
			if err != nil {
				s.countCorrupt(0)
				s.log.Error("spool: unreadable record; skipping the rest of its segment", "segment", pos.seg, "offset", pos.off, "err", err)
				s.mu.Lock()
				s.dir.skipSegment(pos.seg)
				s.signalSpaceLocked()
				s.updateGaugesLocked()
				s.mu.Unlock()
				cur = nil
				continue
			}
			pos.n = n
			cur, curPos = b, append(curPos[:0], pos)
			s.group(cur, &curPos, &head, tried)
		}
		ctx, cancel := context.WithTimeout(s.replayCtx, s.cfg.ReplayTimeout)
		// Every spooled batch may already be stored, wholly or in part: its
		// direct write or an earlier replay can have failed after the sink
		// committed, and a restart replays from the last recorded ack.
		err := export.WriteAgain(ctx, s.sink, cur)
		cancel()
		if err != nil {
			s.replayOK.Store(false)
			s.mu.Lock()
			s.signalSpaceLocked() // a Write waiting in catchUp spools at once
			s.mu.Unlock()
			failures++
			s.replayErrs.Add(1)
			s.m.replayErrors.Inc()
			s.log.Warn("spool: replay to sink failed; retrying", "attempt", failures, "retry_in", backoff, "records", len(curPos), "rows", cur.Len(), "err", err)
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, s.cfg.RetryMax)
			case <-s.retry:
				backoff = s.cfg.RetryMin
			case <-s.stopped:
				return
			}
			continue
		}
		if failures > 0 {
			s.log.Info("spool: sink accepted spooled batches again", "failed_attempts", failures)
		}
		failures, backoff = 0, s.cfg.RetryMin
		s.replayOK.Store(true)
		rows := uint64(cur.Len())
		s.mu.Lock()
		err = s.dir.ack(curPos...)
		s.signalSpaceLocked()
		s.updateGaugesLocked()
		drained := s.dir.records == 0
		s.mu.Unlock()
		if err != nil {
			s.log.Error("spool: recording replay progress failed (the batch may be replayed again after a restart)", "err", err)
		}
		s.replayed.Add(rows)
		s.m.replayedRows.Add(float64(rows))
		s.m.replayWrites.Inc()
		cur = nil
		if drained {
			s.log.Info("spool: drained; writing to the sink directly again", "replayed_rows_total", s.replayed.Load())
		}
	}
}

// group decides which records the replay write starting at the head
// record (*ps, its rows in b) carries, and appends them to b and *ps.
//
// Merging is safe only for records no write has carried yet. A write the
// sink failed may have been committed in part (ClickHouse with
// insert_distributed_sync: one shard took its rows, another did not), and
// what makes its retry store each row once is that it is sent again as the
// same write: ClickHouse drops a block identical to one a replicated table
// already holds, and WriteOnce skips the rows it reads back, but a replica
// that has not caught up yet reads back nothing. So the record spooled
// after its direct write failed (tried), and the head a previous process
// left, go alone, as their direct write did; a merged write is recorded
// (writeGroup) before it is first sent and retried as it is, also by the
// next process (regroup).
func (s *Spool) group(b *export.Batch, ps *[]position, head *segment, tried bool) {
	first := (*ps)[0]
	switch {
	case s.regroupN > 1 && first.seg == s.regroup.seg && first.off == s.regroup.off:
		s.coalesce(b, ps, head, s.regroupN, -1)
	case tried:
	default:
		s.coalesce(b, ps, head, s.cfg.ReplayMaxRecords, s.cfg.ReplayMaxBytes)
	}
	s.regroupN = 0
	if len(*ps) == 1 {
		return
	}
	s.mu.Lock()
	err := s.dir.writeGroup(first, len(*ps))
	s.mu.Unlock()
	if err != nil {
		// Unrecorded, a merged write could not be sent again as it was
		// after a restart: send the head alone.
		s.log.Error("spool: cannot record a merged replay write; replaying one batch", "err", err)
		b1, _, rerr := s.dir.read(first)
		if rerr == nil {
			*b = *b1
			*ps = (*ps)[:1]
		}
	}
}

// coalesce appends to b the records that follow the last of *ps in the
// head segment (head: a copy taken under mu; only the replayer removes
// records, so its count is a lower bound), up to maxRecords in all and
// maxBytes (< 0: no bound), and their positions to *ps. A record that does
// not read or decode ends the run: it is dealt with when it is the head.
func (s *Spool) coalesce(b *export.Batch, ps *[]position, head *segment, maxRecords int, maxBytes int64) {
	last := (*ps)[0]
	size := last.n
	for left := head.records - 1; left > 0 && len(*ps) < maxRecords; left-- {
		next := position{seg: head.id, off: head.skipHoles(last.off + last.n)}
		nb, n, err := s.dir.read(next)
		if err != nil || (maxBytes >= 0 && size+n > maxBytes) {
			return
		}
		next.n = n
		size, last = size+n, next
		b.Calls = append(b.Calls, nb.Calls...)
		b.Rewards = append(b.Rewards, nb.Rewards...)
		b.Rollouts = append(b.Rollouts, nb.Rollouts...)
		b.Spans = append(b.Spans, nb.Spans...)
		*ps = append(*ps, next)
	}
}

// RetryNow makes the replayer try the sink again at once instead of at the
// end of its backoff: call it when the sink is known to be back (a store
// that just connected).
func (s *Spool) RetryNow() {
	select {
	case s.retry <- struct{}{}:
	default:
	}
}

func (s *Spool) syncLoop() {
	t := time.NewTicker(s.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.mu.Lock()
			err := s.dir.sync()
			s.mu.Unlock()
			if err != nil {
				s.log.Error("spool: fsync failed", "err", err)
			}
		case <-s.stopped:
			return
		}
	}
}

func (s *Spool) signalSpaceLocked() {
	close(s.space)
	s.space = make(chan struct{})
}

func (s *Spool) updateGauges() {
	s.mu.Lock()
	s.updateGaugesLocked()
	s.mu.Unlock()
}

func (s *Spool) updateGaugesLocked() {
	s.m.bytes.Set(float64(s.dir.bytes))
	s.m.records.Set(float64(s.dir.records))
}

// Drain waits until every spooled batch has been acknowledged by the sink,
// ctx ends, or the spool is closed.
func (s *Spool) Drain(ctx context.Context) error {
	for {
		s.mu.Lock()
		n, ch := s.dir.records, s.space
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-s.stopped:
			return ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("spool %s: drain: %d batches still spooled: %w", s.name, n, ctx.Err())
		}
	}
}

// Stats returns a snapshot of the spool's state and counters.
func (s *Spool) Stats() Stats {
	s.mu.Lock()
	st := Stats{Records: s.dir.records, Bytes: s.dir.bytes, Segments: len(s.dir.segs)}
	s.mu.Unlock()
	st.SpilledRows = s.spilled.Load()
	st.ReplayedRows = s.replayed.Load()
	st.DroppedRows = s.dropped.Load()
	st.CorruptRecords = s.corrupt.Load()
	st.ReplayErrors = s.replayErrs.Load()
	return st
}

// Close stops accepting writes, waits for the Write in progress, lets the
// replayer finish its current attempt (cancelled when ctx ends), fsyncs and
// closes the segment files. Spooled batches stay on disk for the next New.
// Calls after the first return nil.
func (s *Spool) Close(ctx context.Context) error {
	err := ErrClosed
	s.closeOnce.Do(func() { err = s.close(ctx) })
	if errors.Is(err, ErrClosed) {
		return nil
	}
	return err
}

func (s *Spool) close(ctx context.Context) error {
	close(s.stopped)
	var errs []error
	select {
	case s.writeTok <- struct{}{}: // held for good: no Write runs after this
	case <-ctx.Done():
		errs = append(errs, fmt.Errorf("spool %s: close: waiting for a write in progress: %w", s.name, ctx.Err()))
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.replayCancel()
		<-s.done
	}
	s.replayCancel()
	s.mu.Lock()
	err := s.dir.close()
	records, bytes := s.dir.records, s.dir.bytes
	s.mu.Unlock()
	if err != nil {
		errs = append(errs, fmt.Errorf("spool %s: close: %w", s.name, err))
	}
	if records > 0 {
		s.log.Warn("spool: closed with batches still spooled; they are replayed at the next start", "records", records, "bytes", bytes)
	}
	return errors.Join(errs...)
}
