package seqstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// schema is rg_sequences, the same in SQLite and PostgreSQL. An attempt
// costs its row and its primary key entry: measured with a UUID rollout id
// and a short attempt id, 176 bytes in SQLite and 265 in PostgreSQL (table
// and indexes), so 10^6 attempts take 180 to 270 MB (see Options.Retention).
const schema = `
CREATE TABLE IF NOT EXISTS rg_sequences (
	rollout_id  TEXT NOT NULL,
	attempt_id  TEXT NOT NULL,
	next_id     BIGINT NOT NULL,
	block       BIGINT NOT NULL,
	holder      TEXT NOT NULL,
	prev_holder TEXT NOT NULL,
	updated_ns  BIGINT NOT NULL,
	PRIMARY KEY (rollout_id, attempt_id)
);
CREATE INDEX IF NOT EXISTS rg_sequences_updated ON rg_sequences (updated_ns)
`

// sqlStore is what the SQLite and PostgreSQL stores share: the reservation
// statement over database/sql, pruning, and the instance id.
type sqlStore struct {
	db       *sql.DB
	owned    bool // Close closes db
	instance string
	opt      Options
	m        *metrics
	reserve  string // the reservation statement of the dialect
	prune    string
	has      string // the statement of HasRollout
	log      *slog.Logger

	stopPrune chan struct{}
	closeOnce sync.Once
	pruneDone chan struct{}
}

// sqliteReserve moves the row forward by a block. In DO UPDATE, every
// expression sees the row as it was, so block and next_id grow by the same
// amount. ?1 rollout, ?2 attempt, ?3 MinBlock, ?4 instance, ?5 MaxBlock,
// ?6 now.
const sqliteReserve = `INSERT INTO rg_sequences (rollout_id, attempt_id, next_id, block, holder, prev_holder, updated_ns)
VALUES (?1, ?2, ?3 + 1, ?3, ?4, '', ?6)
ON CONFLICT (rollout_id, attempt_id) DO UPDATE SET
	block = CASE WHEN holder = ?4 THEN MIN(block * 2, ?5) ELSE ?3 END,
	next_id = next_id + CASE WHEN holder = ?4 THEN MIN(block * 2, ?5) ELSE ?3 END,
	prev_holder = holder, holder = ?4, updated_ns = ?6
RETURNING next_id, block, prev_holder`

// SQLite is a Store on a SQLite file: for one gateway (the embedded store's
// file, or the SQLite queue file when capturing to ClickHouse). Ids survive
// restarts; several processes on one file get unique ids (SQLite serialises
// the writes) but no takeover notification, so only PostgreSQL keeps them
// increasing in call order across gateways.
//
// Reservations are committed in groups: one writer takes every reservation
// waiting when it starts a transaction (up to maxGroup) and commits them
// together, so concurrent first calls of many attempts share one fsync
// instead of queueing for one each behind SQLite's single writer.
type SQLite struct {
	sqlStore
	// stmt is the reservation statement, prepared once by the group writer
	// (SQLite would otherwise compile it for every reservation).
	stmt      *sql.Stmt
	reqs      chan *sqliteReq
	stopGroup chan struct{}
	stopOnce  sync.Once
	groupDone chan struct{}
}

const (
	// maxGroup is the most reservations one SQLite transaction commits.
	maxGroup = 256
	// groupTimeout bounds one group's transaction (the callers' own
	// deadlines, --sequence-timeout, are usually shorter).
	groupTimeout = 30 * time.Second
)

// sqliteReq is a reservation waiting for the group writer.
type sqliteReq struct {
	ctx              context.Context
	rollout, attempt string
	b                Block
	err              error
	ready            chan struct{}
}

// OpenSQLite opens (creating if needed) the SQLite file at path.
func OpenSQLite(ctx context.Context, path string, opt Options) (*SQLite, error) {
	if path == "" {
		return nil, errors.New("seqstore: empty SQLite path: give --db or --queue")
	}
	// synchronous=FULL: a reservation is on disk when Reserve returns, so
	// not even a power loss can make an id handed out be reserved again.
	db, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=10000&_journal_mode=WAL&_synchronous=FULL&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("seqstore: opening SQLite %s: %w", path, err)
	}
	s, err := NewSQLite(ctx, db, opt)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("seqstore: SQLite %s: %w", path, err)
	}
	s.owned = true
	return s, nil
}

// NewSQLite makes a store on an open SQLite handle, creating rg_sequences
// if missing. Close does not close db. Ids survive a machine crash only if
// the handle commits with synchronous=FULL (OpenSQLite's does; the
// embedded capture store's, NORMAL, does not).
func NewSQLite(ctx context.Context, db *sql.DB, opt Options) (*SQLite, error) {
	if err := createSchema(ctx, db); err != nil {
		return nil, err
	}
	s := &SQLite{reqs: make(chan *sqliteReq, maxGroup), stopGroup: make(chan struct{}), groupDone: make(chan struct{})}
	s.has = `SELECT 1 FROM rg_sequences WHERE rollout_id = ? LIMIT 1`
	if err := s.init(db, opt, sqliteReserve, `DELETE FROM rg_sequences WHERE updated_ns < ?`); err != nil {
		return nil, err
	}
	go s.groupLoop()
	return s, nil
}

// errClosed answers reservations made after Close.
var errClosed = errors.New("seqstore: the sequence store is closed (the gateway is stopping)")

// groupLoop commits the waiting reservations in groups until Close.
func (s *SQLite) groupLoop() {
	defer close(s.groupDone)
	for {
		var group []*sqliteReq
		select {
		case r := <-s.reqs:
			group = append(group, r)
		case <-s.stopGroup:
			for {
				select {
				case r := <-s.reqs:
					r.err = errClosed
					close(r.ready)
				default:
					return
				}
			}
		}
	more:
		for len(group) < maxGroup {
			select {
			case r := <-s.reqs:
				group = append(group, r)
			default:
				break more
			}
		}
		s.commitGroup(group)
	}
}

// commitGroup reserves the blocks of group in one transaction. A request
// whose caller gave up is left out; its caller already has its error. When
// the transaction fails, every request of the group gets the error: no
// block of it was reserved.
func (s *SQLite) commitGroup(group []*sqliteReq) {
	done := func(err error) {
		for _, r := range group {
			if err != nil {
				r.b, r.err = Block{}, err
			}
			close(r.ready)
		}
	}
	// The statements run uncancelled: with a context that can end,
	// modernc.org/sqlite starts a goroutine per statement to interrupt it
	// and database/sql one per transaction and per query. The group's
	// deadline is checked between reservations instead; a statement's own
	// wait for the file's lock is bounded by the busy timeout (10 s).
	ctx := context.Background()
	deadline := time.Now().Add(groupTimeout)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		s.m.errors.Inc()
		done(fmt.Errorf("seqstore: reserving sequence ids (check the database is up and writable): %w", err))
		return
	}
	if s.stmt == nil {
		if s.stmt, err = s.db.PrepareContext(ctx, s.reserve); err != nil {
			tx.Rollback()
			s.m.errors.Inc()
			done(fmt.Errorf("seqstore: preparing the reservation of sequence ids (check the database is up and writable): %w", err))
			return
		}
	}
	stmt := tx.StmtContext(ctx, s.stmt)
	defer stmt.Close()
	now := s.opt.Now().UnixNano()
	for _, r := range group {
		if time.Now().After(deadline) {
			tx.Rollback()
			s.m.errors.Inc()
			done(fmt.Errorf("seqstore: reserving sequence ids took over %s (check the database is up and not locked by another process): %w", groupTimeout, context.DeadlineExceeded))
			return
		}
		if r.ctx.Err() != nil {
			r.err = r.ctx.Err()
			continue
		}
		var next, size int64
		var prev string
		err := stmt.QueryRowContext(ctx, r.rollout, r.attempt, int64(s.opt.firstBlock(r.rollout, r.attempt)), s.instance,
			int64(s.opt.MaxBlock), now).Scan(&next, &size, &prev)
		if err == nil {
			r.b, err = blockOf(next, size)
		}
		if err != nil {
			tx.Rollback()
			s.m.errors.Inc()
			done(fmt.Errorf("seqstore: reserving sequence ids of rollout %q attempt %q (check the database is up and writable): %w", r.rollout, r.attempt, err))
			return
		}
	}
	if err := tx.Commit(); err != nil {
		s.m.errors.Inc()
		done(fmt.Errorf("seqstore: committing reserved sequence ids (check the database is up and writable): %w", err))
		return
	}
	for _, r := range group {
		if r.err == nil {
			s.m.reservations.Inc()
		}
	}
	done(nil)
}

// createSchema creates rg_sequences if missing.
func createSchema(ctx context.Context, db interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}) error {
	for _, stmt := range strings.Split(schema, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("seqstore: creating rg_sequences (check the database is writable): %w", err)
		}
	}
	return nil
}

// init fills the shared part and starts pruning.
func (s *sqlStore) init(db *sql.DB, opt Options, reserve, prune string) error {
	opt.setDefaults()
	id, err := newInstanceID()
	if err != nil {
		return err
	}
	s.db, s.opt, s.instance, s.reserve, s.prune = db, opt, id, reserve, prune
	s.m = newMetrics(opt.Registerer)
	s.log = opt.Logger
	s.stopPrune, s.pruneDone = make(chan struct{}), make(chan struct{})
	go s.pruneLoop()
	return nil
}

// HasRollout reports whether ids of the rollout are reserved in the
// database (seqstore.RolloutFinder).
func (s *sqlStore) HasRollout(ctx context.Context, rollout string) (bool, error) {
	var one int
	err := s.db.QueryRowContext(ctx, s.has, rollout).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("seqstore: looking up rollout %q: %w", rollout, err)
	}
	return true, nil
}

// Instance is this store's gateway instance id, the holder it writes.
func (s *sqlStore) Instance() string { return s.instance }

// OnTakeover does nothing: a SQLite store has one gateway.
func (s *SQLite) OnTakeover(func(rollout, attempt string)) {}

// Reserve reserves the next block of (rollout, attempt).
func (s *SQLite) Reserve(ctx context.Context, rollout, attempt string) (Block, error) {
	r := &sqliteReq{ctx: ctx, rollout: rollout, attempt: attempt, ready: make(chan struct{})}
	wait := func() (Block, error) {
		select {
		case <-r.ready:
			return r.b, r.err
		case <-ctx.Done():
			// The group may still commit this block: its ids become a gap.
			return Block{}, fmt.Errorf("seqstore: reserving sequence ids of rollout %q attempt %q: the database did not answer in time (%w); check it is up and not overloaded", rollout, attempt, ctx.Err())
		}
	}
	select {
	case s.reqs <- r:
		return wait()
	case <-s.stopGroup:
		return Block{}, errClosed
	case <-ctx.Done():
		return wait()
	}
}

// reserveRow runs the reservation statement and returns the block and the
// row's previous holder.
func (s *sqlStore) reserveRow(ctx context.Context, rollout, attempt string) (Block, string, error) {
	var next, size int64
	var prev string
	err := s.db.QueryRowContext(ctx, s.reserve, rollout, attempt, int64(s.opt.firstBlock(rollout, attempt)), s.instance,
		int64(s.opt.MaxBlock), s.opt.Now().UnixNano()).Scan(&next, &size, &prev)
	if err != nil {
		s.m.errors.Inc()
		if ctx.Err() != nil {
			return Block{}, "", fmt.Errorf("seqstore: reserving sequence ids of rollout %q attempt %q: the database did not answer in time (%w); check it is up and not overloaded", rollout, attempt, err)
		}
		return Block{}, "", fmt.Errorf("seqstore: reserving sequence ids of rollout %q attempt %q (check the database is up and writable): %w", rollout, attempt, err)
	}
	b, err := blockOf(next, size)
	if err != nil {
		s.m.errors.Inc()
		return Block{}, "", err
	}
	s.m.reservations.Inc()
	return b, prev, nil
}

// pruneLoop deletes old rows hourly when a retention is set.
func (s *sqlStore) pruneLoop() {
	defer close(s.pruneDone)
	if s.opt.Retention <= 0 {
		return
	}
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-s.stopPrune:
			return
		case <-t.C:
		}
		if _, err := s.Prune(context.Background()); err != nil {
			s.log.Warn("pruning old rows of rg_sequences (retried in an hour)", "err", err)
		}
	}
}

// Prune deletes the rows of attempts no block was reserved for within the
// retention (none when Options.Retention is 0) and returns how many.
func (s *sqlStore) Prune(ctx context.Context) (int64, error) {
	if s.opt.Retention <= 0 {
		return 0, nil
	}
	r, err := s.db.ExecContext(ctx, s.prune, s.opt.Now().Add(-s.opt.Retention).UnixNano())
	if err != nil {
		return 0, fmt.Errorf("seqstore: pruning rg_sequences: %w", err)
	}
	n, _ := r.RowsAffected()
	s.m.pruned.Add(float64(n))
	return n, nil
}

// closeSQL stops pruning and closes the handle when the store opened it.
func (s *sqlStore) closeSQL() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stopPrune)
		<-s.pruneDone
		if s.owned {
			err = s.db.Close()
		}
	})
	return err
}

// Close stops pruning and closes the file when the store opened it.
func (s *SQLite) Close() error {
	s.stopOnce.Do(func() { close(s.stopGroup) })
	<-s.groupDone
	if s.stmt != nil {
		s.stmt.Close()
	}
	return s.closeSQL()
}

// Interface guards.
var (
	_ Store = (*SQLite)(nil)
	_ Store = (*Postgres)(nil)
)
