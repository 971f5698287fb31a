// Package seqstore reserves blocks of sequence ids in a database, so that the
// ids of one (rollout, attempt) stay unique and increasing across gateway
// restarts and across gateways sharing one database.
//
// One row per (rollout, attempt) in the table rg_sequences holds the next id
// not yet reserved, the size of the last block, and the gateway instance that
// reserved it (its holder, an id minted when the Store opens). Reserve moves
// the row forward by a block in one statement (INSERT ... ON CONFLICT DO
// UPDATE ... RETURNING) and returns the block; the gateway hands the block's
// ids out from memory, so only the first call of an attempt (and each
// exhausted block) touches the database. Blocks start at MinBlock ids and
// double while the same gateway keeps reserving the attempt, up to MaxBlock;
// a block reserved after another gateway's (a takeover) starts small again.
// Ids may leave gaps (a block abandoned by a restart or a takeover), never
// repeat, and never depend on a clock.
//
// Across gateways (PostgreSQL only): a reservation that takes an attempt
// over from another live gateway notifies it (NOTIFY on a channel of its
// own); that gateway drops the attempt from memory (the callback given to
// OnTakeover) and acknowledges, and Reserve returns only after the
// acknowledgement (or after TakeoverWait). Each gateway holds a session
// advisory lock on its instance id on the connection it listens on, so a
// takeover from a gateway that is gone (restarted, killed, disconnected)
// sees the lock free and does not wait. See Postgres for the exact
// guarantee.
package seqstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Block is a range of sequence ids reserved for one (rollout, attempt):
// First through Last, both included.
type Block struct {
	First, Last uint64
}

// Store reserves blocks of sequence ids. Implementations are safe for
// concurrent use.
type Store interface {
	// Reserve reserves the next block of ids of (rollout, attempt): every
	// id in it is higher than every id of every block reserved before for
	// the same attempt, by any gateway on the same database.
	Reserve(ctx context.Context, rollout, attempt string) (Block, error)
	// OnTakeover sets the function called when another gateway took an
	// attempt over: the caller must not hand out any more ids of a block of
	// that attempt reserved before the call returns. rollout and attempt
	// both "" means every attempt (the store can no longer tell, e.g. its
	// notification connection was lost). Set it before the first Reserve.
	OnTakeover(drop func(rollout, attempt string))
	// Close releases the store's connections.
	Close() error
}

// RolloutFinder is a Store that can say whether ids were ever reserved for
// a rollout (by any gateway on the same database, within the retention):
// whether calls of it were admitted, before their capture is stored.
type RolloutFinder interface {
	HasRollout(ctx context.Context, rollout string) (bool, error)
}

// Options tune a Store. Zero values take the defaults.
type Options struct {
	// MinBlock is the size of an attempt's first block, and of the first
	// block after a takeover (default 16).
	MinBlock uint64
	// MaxBlock bounds the block size, which doubles with each reservation
	// of the same attempt by the same gateway (default 1024). It bounds the
	// gap a restart leaves in an attempt's ids.
	MaxBlock uint64
	// TakeoverWait bounds how long a reservation that took an attempt over
	// from a live gateway waits for that gateway's acknowledgement
	// (PostgreSQL; default SessionLease/2 + 1s, at least 2s: longer than
	// the old holder may hand out ids once cut off). Past it the block is
	// returned anyway (uniqueness holds; see Postgres) and the timeout is
	// counted.
	TakeoverWait time.Duration
	// SessionLease bounds how long a gateway cut off from PostgreSQL
	// (PostgreSQL only; default 4s): it hands out no id more than
	// SessionLease/2 after its listening session last answered and refuses
	// reservations meanwhile (503), and PostgreSQL ends the cut-off session
	// about SessionLease after its last packet (see the lease in session.go).
	// The session is proven alive every SessionLease/4, so a round trip to
	// PostgreSQL must stay well below SessionLease/4.
	SessionLease time.Duration
	// Retention deletes the rows of attempts no block was reserved for in
	// this long (checked hourly; default 0: rows are kept). It must exceed
	// the longest an attempt may still receive calls: an attempt whose row
	// was deleted starts again at 1.
	Retention time.Duration
	// Registerer receives the store's metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Logger receives the store's warnings (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock of the rows' updated_ns (pruning only; ids never
	// depend on it). Default time.Now.
	Now func() time.Time
}

func (o *Options) setDefaults() {
	if o.MinBlock == 0 {
		o.MinBlock = 16
	}
	if o.MaxBlock < o.MinBlock {
		o.MaxBlock = max(1024, o.MinBlock)
	}
	if o.SessionLease <= 0 {
		o.SessionLease = DefaultSessionLease
	}
	if o.TakeoverWait <= 0 {
		o.TakeoverWait = max(2*time.Second, o.SessionLease/2+time.Second)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// firstBlock is the size of a block that does not follow one of the same
// gateway: MinBlock, or MaxBlock for unattributed calls (rollout and
// attempt ""), whose ids promise no order across gateways: gateways serving
// them in turn would otherwise reserve MinBlock ids at a time.
func (o *Options) firstBlock(rollout, attempt string) uint64 {
	if rollout == "" && attempt == "" {
		return o.MaxBlock
	}
	return o.MinBlock
}

// Open opens a store on a DSN: "postgres://..." or "postgresql://..." for
// PostgreSQL, otherwise a SQLite file path (optionally "sqlite:" prefixed).
func Open(ctx context.Context, dsn string, opt Options) (Store, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		return OpenPostgres(ctx, dsn, opt)
	}
	return OpenSQLite(ctx, strings.TrimPrefix(dsn, "sqlite:"), opt)
}

// ErrClosed is returned by Reserve after Close.
var ErrClosed = errors.New("seqstore: store closed")

// newInstanceID mints the id of this gateway instance: 16 random hex digits.
func newInstanceID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("seqstore: minting the instance id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// blockOf turns the row's new next_id and block size into the block.
func blockOf(next, size int64) (Block, error) {
	if size < 1 || next <= size {
		return Block{}, fmt.Errorf("seqstore: corrupt rg_sequences row (next_id %d, block %d): fix or delete the row", next, size)
	}
	return Block{First: uint64(next - size), Last: uint64(next - 1)}, nil
}

// metrics are the store's counters.
type metrics struct {
	reservations prometheus.Counter
	errors       prometheus.Counter
	takeovers    *prometheus.CounterVec
	pruned       prometheus.Counter
	sessionLost  *prometheus.CounterVec
	refused      prometheus.Counter
}

func newMetrics(r prometheus.Registerer) *metrics {
	m := &metrics{
		reservations: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollgate_sequence_reservations_total",
			Help: "Blocks of sequence ids reserved in the database (first call of an attempt, exhausted block, takeover)."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollgate_sequence_reservation_errors_total",
			Help: "Reservations of sequence ids that failed (database down or slow); the calls were answered 503."}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollgate_sequence_takeovers_total",
			Help: "Reservations that took an attempt over from another gateway, by outcome: acked (it dropped the attempt), gone (it no longer runs), timeout (no acknowledgement within the wait)."}, []string{"outcome"}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollgate_sequence_rows_pruned_total",
			Help: "Rows of rg_sequences deleted after the retention."}),
		sessionLost: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rollgate_sequence_session_lost_total",
			Help: "Times the gateway's PostgreSQL listening session ended, by cause: lease (PostgreSQL did not answer a heartbeat by half of --sequence-lease after its last answer: a partition, an overloaded server, or round trips, resends after packet loss included, near 3/8 of it), error (the connection failed). Every attempt's ids were dropped; reservations are refused until it is back. Always 0 with the SQLite store."}, []string{"cause"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "rollgate_sequence_refused_total",
			Help: "Reservations of sequence ids refused because the gateway's PostgreSQL session was down or its lease had lapsed (the calls were answered 503). Always 0 with the SQLite store."}),
	}
	for _, cause := range []string{"lease", "error"} {
		m.sessionLost.WithLabelValues(cause) // exported at 0, so that increase() sees the first loss
	}
	if r != nil {
		// A second store on one registry (tests) keeps the first's counters.
		for _, c := range []prometheus.Collector{m.reservations, m.errors, m.takeovers, m.pruned, m.sessionLost, m.refused} {
			_ = r.Register(c)
		}
	}
	return m
}

var (
	_ RolloutFinder = (*SQLite)(nil)
	_ RolloutFinder = (*Postgres)(nil)
)
