package seqstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DefaultSessionLease is the default of Options.SessionLease (serve's
// --sequence-lease).
const DefaultSessionLease = 4 * time.Second

// The lease of a gateway's PostgreSQL session (Options.SessionLease, L).
//
// A silent network partition (packets dropped, no reset) leaves both ends of
// a TCP connection open until the kernel gives up: minutes to hours with the
// defaults. Meanwhile the gateway would keep handing out ids of the blocks
// it holds, and PostgreSQL would keep its advisory lock, so a gateway taking
// an attempt over would wait for an acknowledgement that never comes and
// then hand out ids above ones the cut gateway still hands out. The lease
// bounds both ends:
//
//   - The gateway proves its listening session alive L/8 after its last
//     answer when nothing else came (a notification, else an empty query),
//     and each round trip (that query, a takeover's acknowledgement) must
//     answer by L/2 after the last answer: at least 3L/8 each, room for a
//     slow link's resends (at 200 ms per round trip and some packet loss,
//     a query TCP resends twice takes 1.4 s; the default L is 4 s). A round
//     trip that fails or does not answer by then ends the session: every
//     attempt is dropped (no more ids from memory) and reservations are
//     refused (503) until it listens again. So no id is handed out more
//     than L/2 after the session last answered, and Reserve also refuses
//     once the last answer is older than L/2 (a stuck listener).
//   - PostgreSQL is told (the session's tcp_user_timeout and keepalive
//     settings, PostgreSQL 12 and later) to end the session about L after
//     the gateway's last packet, releasing the instance's advisory lock: a
//     later takeover sees the gateway gone instead of waiting for it, and
//     the gateway can take its lock again once the link heals. L after the
//     last packet is later than the gateway's own L/2, so a gateway seen
//     gone has already stopped handing out ids.
//   - TakeoverWait defaults to more than L/2 (L/2 + 1 s, at least 2 s): a
//     takeover whose acknowledgement does not come (the old holder is cut
//     off but PostgreSQL does not know yet) returns only once the old holder
//     has stopped handing out ids by its own lease.
//
// Only a gateway process that is stalled (stopped, swapped out) for longer
// than L/2 while holding a block can still hand out an id after its lease:
// its listener has not run to drop it.

// heartbeat is how long the listening session waits for a notification
// before it proves itself alive with a query: an eighth of the lease, so
// the query has until leaseDeadline, at least 3/8 of the lease.
func (o *Options) heartbeat() time.Duration { return o.SessionLease / 8 }

// pgConfig parses dsn and adds the lease's connection settings: TCP
// keepalives on the gateway's side (every L/4, so a dead idle pool
// connection is found), and on the server's side tcp_user_timeout and
// keepalives so that PostgreSQL ends a cut-off session about L after its
// last packet (see above).
func pgConfig(dsn string, lease time.Duration) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("seqstore: parsing the PostgreSQL DSN: %w", err)
	}
	d := &net.Dialer{Timeout: lease, KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: lease / 4, Interval: lease / 4, Count: 2}}
	cfg.DialFunc = d.DialContext
	if cfg.ConnectTimeout == 0 || cfg.ConnectTimeout > lease {
		cfg.ConnectTimeout = lease
	}
	idle := max(1, int(lease/2/time.Second))     // seconds: the server's unit
	interval := max(1, int(lease/8/time.Second)) // seconds
	count := max(1, int((lease-time.Duration(idle)*time.Second)/(time.Duration(interval)*time.Second)))
	for k, v := range map[string]string{
		"tcp_user_timeout":        strconv.FormatInt(lease.Milliseconds(), 10),
		"tcp_keepalives_idle":     strconv.Itoa(idle),
		"tcp_keepalives_interval": strconv.Itoa(interval),
		"tcp_keepalives_count":    strconv.Itoa(count),
	} {
		if _, set := cfg.RuntimeParams[k]; !set { // the DSN's own setting wins
			cfg.RuntimeParams[k] = v
		}
	}
	return cfg, nil
}

// proven records that the listening session answered now.
func (p *Postgres) proven() { p.proof.Store(int64(time.Since(p.epoch))) }

// leaseDeadline is when the lease ends unless the listening session
// answers again: L/2 after its last answer.
func (p *Postgres) leaseDeadline() time.Time {
	return p.epoch.Add(time.Duration(p.proof.Load()) + p.opt.SessionLease/2)
}

// leaseHeld tells whether the listening session answered within the last
// L/2: the window in which ids may be handed out.
func (p *Postgres) leaseHeld() bool {
	return time.Since(p.epoch)-time.Duration(p.proof.Load()) <= p.opt.SessionLease/2
}

// prove waits for a notification for up to a heartbeat and, when none came,
// proves the session alive with an empty query that must answer by the
// lease's deadline. It returns the notification (nil when none) or the
// error that ends the session: errLeaseLost when the server did not
// answer in time.
func (p *Postgres) prove(ctx context.Context, conn *pgx.Conn) (*pgconn.Notification, error) {
	wctx, cancel := context.WithTimeout(ctx, p.opt.heartbeat())
	n, err := conn.WaitForNotification(wctx)
	cancel()
	if err == nil {
		p.proven()
		return n, nil
	}
	if ctx.Err() != nil || wctx.Err() == nil {
		return nil, unanswered(err) // closing, or the session broke
	}
	deadline := p.leaseDeadline()
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := conn.Ping(pctx); err != nil {
		if ctx.Err() != nil || pctx.Err() == nil {
			return nil, unanswered(err) // closing, or the session broke
		}
		return nil, fmt.Errorf("%w (by %s after its last answer): %w", errLeaseLost, p.opt.SessionLease/2, err)
	}
	p.proven()
	return nil, nil
}

// unanswered returns err as a lapse of the lease (errLeaseLost) when the
// kernel ended the connection because the server stopped answering: its
// keepalive probes (every L/4, see pgConfig) or retransmissions went
// unanswered (ETIMEDOUT). That is the same silent partition the heartbeat
// detects, found by another timer first (which one wins depends on when the
// link went quiet), so it is counted and alerted on the same way
// (rollgate_sequence_session_lost_total{cause="lease"}). Other errors (a
// reset, the server ending the session) are returned as they are.
func unanswered(err error) error {
	if errors.Is(err, syscall.ETIMEDOUT) {
		return fmt.Errorf("%w (the kernel timed the connection out): %w", errLeaseLost, err)
	}
	return err
}

// errLeaseLost ends a listening session whose server did not answer by
// the lease's deadline.
var errLeaseLost = errors.New("seqstore: PostgreSQL did not answer the listening session's heartbeat in time")
