package seqstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/stdlib"
)

// postgresReserve moves the row forward by a block (as sqliteReserve), then
// tells whether the previous holder is another gateway that still runs (its
// session holds the advisory lock on its instance id: the shared try-lock
// fails) and, when it does and $8, notifies it on its channel at commit.
// $1 rollout, $2 attempt, $3 MinBlock, $4 instance, $5 MaxBlock, $6 now,
// $7 the notification's payload, $8 notify.
const postgresReserve = `WITH r AS (
	INSERT INTO rg_sequences AS s (rollout_id, attempt_id, next_id, block, holder, prev_holder, updated_ns)
	VALUES ($1, $2, $3::bigint + 1, $3, $4, '', $6)
	ON CONFLICT (rollout_id, attempt_id) DO UPDATE SET
		block = CASE WHEN s.holder = $4 THEN LEAST(s.block * 2, $5::bigint) ELSE $3 END,
		next_id = s.next_id + CASE WHEN s.holder = $4 THEN LEAST(s.block * 2, $5::bigint) ELSE $3 END,
		prev_holder = s.holder, holder = $4, updated_ns = $6
	RETURNING next_id, block, prev_holder
), x AS (
	SELECT next_id, block, prev_holder,
		(prev_holder <> '' AND prev_holder <> $4::text
			AND NOT pg_try_advisory_xact_lock_shared(hashtextextended(prev_holder, 0))) AS alive
	FROM r
), n AS (
	SELECT pg_notify('rg_seq_' || prev_holder, $7::text) FROM x WHERE alive AND $8::boolean
)
SELECT next_id, block, prev_holder, alive, (SELECT count(*) FROM n) FROM x`

// takeover is the payload of the notification a reservation sends to the
// attempt's previous holder.
type takeover struct {
	Rollout string `json:"r"`
	Attempt string `json:"a"`
	Holder  string `json:"h"` // the new holder: where the acknowledgement goes
	Token   string `json:"t"`
}

// Postgres is a Store on PostgreSQL, shared by the gateways of one
// deployment (the database of serve --queue).
//
// Guarantee. Within one (rollout, attempt), every id is reserved once in
// the database, so ids never repeat, whatever the gateways, restarts,
// timeouts or failures; the ids one gateway hands out increase. Across
// gateways, ids increase in call order: a reservation that takes the attempt
// over from a gateway that still runs (its notification session is up)
// returns only once that gateway has dropped the attempt from memory and
// acknowledged, so any call of the attempt that reaches it after the taking
// call's answer reserves again, above. An agent that waits for an answer
// before its next call (every sequential agent) thus sees increasing ids
// whichever gateway serves each call. A gateway cut off from PostgreSQL
// (even silently: packets dropped, no reset) stops handing out ids within
// SessionLease/2 of its session's last answer and refuses reservations
// (503, rollgate_sequence_refused_total) until it listens again; a takeover
// whose acknowledgement does not come waits TakeoverWait, longer than that,
// so ids stay in call order across a partition too (see session.go).
// Exceptions, all counted or logged: a gateway process stalled (stopped,
// swapped out) longer than SessionLease/2 while holding a block, which may
// answer a call it had already admitted with an id below those another
// gateway gave meanwhile (rollgate_sequence_takeovers_total{outcome="timeout"}
// counts the takeovers that did not wait for an acknowledgement).
// Concurrent calls of one attempt are ordered by the database, not by their
// arrival.
//
// Cost: no database access for a call whose attempt this gateway holds a
// block of; one statement for the first call of an attempt and each
// exhausted block (16, 32, ... 1024 ids); a takeover adds the other
// gateway's acknowledgement (a notification there and back).
type Postgres struct {
	sqlStore
	dsn     string
	drop    atomic.Pointer[func(rollout, attempt string)]
	tokens  atomic.Uint64
	mu      sync.Mutex
	waiters map[string]chan struct{} // token → closed on acknowledgement
	keys    map[string]*keyLock      // attempts being reserved (guarded by mu)

	listening atomic.Bool
	gen       atomic.Uint64 // incremented on every connect and disconnect of the listener
	epoch     time.Time     // the origin of proof (monotonic)
	proof     atomic.Int64  // since epoch: when the listening session last answered (session.go)
	cfg       *pgx.ConnConfig
	cancel    context.CancelFunc
	done      chan struct{}
}

// keyLock serialises the reservations of one attempt within a gateway: a
// reservation that follows this gateway's own takeover (so waits for no
// one) must not return before that takeover was acknowledged.
type keyLock struct {
	mu   sync.Mutex
	refs int // reservations holding or waiting for mu (guarded by Postgres.mu)
}

// lockKey takes the reservation lock of (rollout, attempt) and returns its
// release.
func (p *Postgres) lockKey(rollout, attempt string) func() {
	k := rollout + "\x00" + attempt
	p.mu.Lock()
	l := p.keys[k]
	if l == nil {
		l = &keyLock{}
		p.keys[k] = l
	}
	l.refs++
	p.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		p.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(p.keys, k)
		}
		p.mu.Unlock()
	}
}

// schemaLock serialises the creation of rg_sequences by gateways starting
// at once (pg_advisory_lock).
const schemaLock = 7210418

// OpenPostgres connects to PostgreSQL, creates rg_sequences if missing and
// starts listening for takeovers. It fails when the database is unreachable.
func OpenPostgres(ctx context.Context, dsn string, opt Options) (*Postgres, error) {
	opt.setDefaults()
	cfg, err := pgConfig(dsn, opt.SessionLease)
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	p := &Postgres{dsn: dsn, cfg: cfg, waiters: map[string]chan struct{}{}, keys: map[string]*keyLock{}, done: make(chan struct{}), epoch: time.Now()}
	p.owned = true
	if err := createSchemaLocked(ctx, db); err != nil {
		db.Close()
		return nil, err
	}
	p.has = `SELECT 1 FROM rg_sequences WHERE rollout_id = $1 LIMIT 1`
	if err := p.init(db, opt, postgresReserve, `DELETE FROM rg_sequences WHERE updated_ns < $1`); err != nil {
		db.Close()
		return nil, err
	}
	conn, err := p.connectListener(ctx)
	if err != nil {
		p.closeSQL()
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go p.listen(lctx, conn)
	return p, nil
}

// createSchemaLocked creates rg_sequences under the schema lock, on one
// connection (the session that takes the lock must release it).
func createSchemaLocked(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("seqstore: PostgreSQL unreachable (check --queue and that the server is up): %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, schemaLock); err != nil {
		return fmt.Errorf("seqstore: locking the schema: %w", err)
	}
	defer conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, schemaLock)
	return createSchema(ctx, conn)
}

// listenerApp is the application_name of an instance's listening session.
func listenerApp(instance string) string { return "rollgate-seq-listener-" + instance }

// channel is the notification channel of a gateway instance.
func channel(instance string) string { return "rg_seq_" + instance }

// connectListener opens the session that holds this instance's advisory
// lock and listens on its channel.
func (p *Postgres) connectListener(ctx context.Context) (*pgx.Conn, error) {
	cfg := p.cfg.Copy()
	// Named, so an operator (or a test) finds it in pg_stat_activity.
	cfg.RuntimeParams["application_name"] = listenerApp(p.instance)
	// The whole setup (including waiting for the instance's lock, which a
	// session of this gateway cut off by a partition may still hold at the
	// server for up to the lease) is bounded; the listener retries.
	ctx, cancel := context.WithTimeout(ctx, 2*p.opt.SessionLease)
	defer cancel()
	// Interrupting WaitForNotification (Close) must leave the session
	// usable, to release the instance's lock before closing: a deadline,
	// not a cancel request that could cancel the unlock.
	cfg.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("seqstore: connecting to PostgreSQL to listen for takeovers: %w", err)
	}
	// A session of this gateway that was cut off may still hold the lock
	// at the server (until its TCP settings end it, or forever behind a
	// proxy that keeps the server's side of the connection up): it is ours
	// and dead to us, so end it rather than wait.
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, listenerApp(p.instance)); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("seqstore: ending this gateway's previous listening session: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, p.instance); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("seqstore: locking the instance id: %w", err)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+channel(p.instance)); err != nil {
		conn.Close(context.Background())
		return nil, fmt.Errorf("seqstore: LISTEN: %w", err)
	}
	p.proven()
	p.gen.Add(1)
	p.listening.Store(true)
	return conn, nil
}

// listen handles notifications until ctx ends; when the session breaks it
// drops every attempt (takeovers may go unseen) and reconnects.
func (p *Postgres) listen(ctx context.Context, conn *pgx.Conn) {
	defer close(p.done)
	backoff := 100 * time.Millisecond
	for {
		for {
			n, err := p.prove(ctx, conn)
			if err != nil && ctx.Err() != nil {
				// Closing: release the lock now, so that a gateway taking
				// an attempt over sees this one gone without waiting for
				// PostgreSQL to end the session.
				uctx, cancel := context.WithTimeout(context.Background(), time.Second)
				conn.Exec(uctx, `SELECT pg_advisory_unlock_all()`)
				cancel()
			}
			if err == nil && n != nil {
				err = p.handle(ctx, conn, n.Payload)
			}
			if err != nil {
				if ctx.Err() == nil {
					cause := "error"
					if errors.Is(err, errLeaseLost) {
						cause = "lease"
					}
					p.m.sessionLost.WithLabelValues(cause).Inc()
					p.log.Warn("seqstore: lost the PostgreSQL session that listens for takeovers: dropping every attempt's ids; calls get 503 until it is back", "err", err, "cause", cause)
				}
				break
			}
		}
		p.listening.Store(false)
		p.gen.Add(1)
		p.dropAll()
		conn.Close(context.Background())
		for {
			if ctx.Err() != nil {
				return
			}
			var err error
			if conn, err = p.connectListener(ctx); err == nil {
				backoff = 100 * time.Millisecond
				p.log.Info("seqstore: listening for takeovers again")
				break
			}
			p.log.Warn("seqstore: reconnecting to PostgreSQL", "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// handle processes one notification: a takeover (JSON) is applied and
// acknowledged; anything else is the token of an acknowledgement. An error
// (the acknowledgement failed or did not go by the lease's deadline) ends the
// session.
func (p *Postgres) handle(ctx context.Context, conn *pgx.Conn, payload string) error {
	if len(payload) == 0 || payload[0] != '{' {
		p.mu.Lock()
		ch := p.waiters[payload]
		delete(p.waiters, payload)
		p.mu.Unlock()
		if ch != nil {
			close(ch)
		}
		return nil
	}
	var t takeover
	if err := json.Unmarshal([]byte(payload), &t); err != nil {
		p.log.Warn("seqstore: ignoring a malformed takeover notification", "payload", payload, "err", err)
		return nil
	}
	if f := p.drop.Load(); f != nil {
		(*f)(t.Rollout, t.Attempt)
	}
	actx, cancel := context.WithDeadline(ctx, p.leaseDeadline())
	defer cancel()
	if _, err := conn.Exec(actx, `SELECT pg_notify($1, $2)`, channel(t.Holder), t.Token); err != nil {
		return fmt.Errorf("seqstore: acknowledging a takeover (the other gateway waits out its takeover wait): %w", err)
	}
	p.proven()
	return nil
}

// dropAll tells the gateway to forget every attempt.
func (p *Postgres) dropAll() {
	if f := p.drop.Load(); f != nil {
		(*f)("", "")
	}
}

// OnTakeover sets the function called when another gateway takes an
// attempt over, and with ("", "") when the listening session is lost.
func (p *Postgres) OnTakeover(drop func(rollout, attempt string)) { p.drop.Store(&drop) }

// errNotListening is returned while the listening session is down.
var errNotListening = errors.New("seqstore: not listening for takeovers (PostgreSQL session lost; reconnecting): check the database is up")

// Reserve reserves the next block of (rollout, attempt), waiting for the
// previous holder's acknowledgement on a takeover (see Postgres).
func (p *Postgres) Reserve(ctx context.Context, rollout, attempt string) (Block, error) {
	gen := p.gen.Load()
	if !p.listening.Load() || !p.leaseHeld() {
		p.m.errors.Inc()
		p.m.refused.Inc()
		return Block{}, errNotListening
	}
	defer p.lockKey(rollout, attempt)()
	token := strconv.FormatUint(p.tokens.Add(1), 10)
	notify := rollout != "" || attempt != "" // unattributed calls promise no order across gateways
	payload, err := json.Marshal(takeover{Rollout: rollout, Attempt: attempt, Holder: p.instance, Token: token})
	if err != nil {
		return Block{}, fmt.Errorf("seqstore: %w", err)
	}
	ack := make(chan struct{})
	p.mu.Lock()
	p.waiters[token] = ack
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiters, token)
		p.mu.Unlock()
	}()
	var (
		next, size int64
		prev       string
		alive      bool
		notified   int64
	)
	err = p.db.QueryRowContext(ctx, p.reserve, rollout, attempt, int64(p.opt.firstBlock(rollout, attempt)), p.instance,
		int64(p.opt.MaxBlock), p.opt.Now().UnixNano(), string(payload), notify).Scan(&next, &size, &prev, &alive, &notified)
	if err != nil {
		p.m.errors.Inc()
		if ctx.Err() != nil {
			return Block{}, fmt.Errorf("seqstore: reserving sequence ids of rollout %q attempt %q: PostgreSQL did not answer in time (%w); check it is up and not overloaded", rollout, attempt, err)
		}
		return Block{}, fmt.Errorf("seqstore: reserving sequence ids of rollout %q attempt %q (check PostgreSQL is up): %w", rollout, attempt, err)
	}
	b, err := blockOf(next, size)
	if err != nil {
		p.m.errors.Inc()
		return Block{}, err
	}
	if p.gen.Load() != gen || !p.listening.Load() || !p.leaseHeld() {
		// The session broke meanwhile: a takeover of this block might go unseen.
		p.m.errors.Inc()
		p.m.refused.Inc()
		return Block{}, errNotListening
	}
	p.m.reservations.Inc()
	switch {
	case prev == "" || prev == p.instance:
	case !alive:
		p.m.takeovers.WithLabelValues("gone").Inc()
	case notified == 0:
	default:
		t := time.NewTimer(p.opt.TakeoverWait)
		defer t.Stop()
		select {
		case <-ack:
			p.m.takeovers.WithLabelValues("acked").Inc()
		case <-t.C:
			p.m.takeovers.WithLabelValues("timeout").Inc()
			p.log.Warn("seqstore: the gateway that held an attempt did not acknowledge its takeover in time (cut off from PostgreSQL, or stalled): ids stay unique; past its session lease it hands out no more ids",
				"rollout", rollout, "attempt", attempt, "holder", prev, "wait", p.opt.TakeoverWait)
		case <-ctx.Done():
			p.m.errors.Inc()
			return Block{}, fmt.Errorf("seqstore: waiting for gateway %s to release rollout %q attempt %q: %w", prev, rollout, attempt, ctx.Err())
		}
	}
	return b, nil
}

// Close stops listening (releasing the instance's lock) and closes the
// database handle.
func (p *Postgres) Close() error {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
	return p.closeSQL()
}
