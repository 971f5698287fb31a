package tasks

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	_ "modernc.org/sqlite"             // registers the "sqlite" driver
)

// Dialect names the SQL flavour of a queue's database.
type Dialect int

// The supported databases.
const (
	SQLite Dialect = iota
	Postgres
)

// DefaultLease is a task's lease length when neither Options.Lease nor the
// task's lease_s sets one.
const DefaultLease = time.Minute

// Options tune a Queue.
type Options struct {
	// Lease is the default lease length (DefaultLease when zero).
	Lease time.Duration
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
	// Log receives what the queue does on its own, such as moving an
	// unservable row aside (slog.Default() when nil).
	Log *slog.Logger
}

// Queue is the task queue and resource registry over one SQL database. It is
// safe for concurrent use, also by several processes sharing a PostgreSQL
// database.
type Queue struct {
	db      *sql.DB
	dialect Dialect
	lease   time.Duration
	now     func() time.Time
	log     *slog.Logger
	owned   bool
}

const schema = `
CREATE TABLE IF NOT EXISTS rg_tasks (
	rollout_id        TEXT PRIMARY KEY,
	task_id           TEXT NOT NULL,
	input             TEXT NOT NULL,
	mode              TEXT NOT NULL,
	metadata          TEXT NOT NULL,
	max_attempts      INTEGER NOT NULL,
	timeout_ns        BIGINT NOT NULL,
	lease_ns          BIGINT NOT NULL,
	status            TEXT NOT NULL,
	attempt_no        INTEGER NOT NULL,
	attempt_id        TEXT NOT NULL,
	worker_id         TEXT NOT NULL,
	resources_version BIGINT NOT NULL,
	lease_expires_ns  BIGINT NOT NULL,
	deadline_ns       BIGINT NOT NULL,
	queue_seq         BIGINT NOT NULL,
	created_ns        BIGINT NOT NULL,
	updated_ns        BIGINT NOT NULL,
	completed_ns      BIGINT NOT NULL,
	completion_seq    BIGINT NOT NULL,
	last_error        TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rg_tasks_queued ON rg_tasks (status, queue_seq);
CREATE TABLE IF NOT EXISTS rg_tasks_aside (
	rollout_id        TEXT NOT NULL,
	task_id           TEXT,
	input             TEXT,
	mode              TEXT,
	metadata          TEXT,
	max_attempts      INTEGER,
	timeout_ns        BIGINT,
	lease_ns          BIGINT,
	status            TEXT,
	attempt_no        INTEGER,
	attempt_id        TEXT,
	worker_id         TEXT,
	resources_version BIGINT,
	lease_expires_ns  BIGINT,
	deadline_ns       BIGINT,
	queue_seq         BIGINT,
	created_ns        BIGINT,
	updated_ns        BIGINT,
	completed_ns      BIGINT,
	completion_seq    BIGINT,
	last_error        TEXT,
	aside_reason      TEXT NOT NULL,
	aside_ns          BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS rg_tasks_completion ON rg_tasks (completion_seq);
CREATE TABLE IF NOT EXISTS rg_attempts (
	rollout_id TEXT NOT NULL,
	attempt_id TEXT NOT NULL,
	attempt_no INTEGER NOT NULL,
	worker_id  TEXT NOT NULL,
	status     TEXT NOT NULL,
	reason     TEXT NOT NULL,
	started_ns BIGINT NOT NULL,
	ended_ns   BIGINT NOT NULL,
	PRIMARY KEY (rollout_id, attempt_id)
);
CREATE TABLE IF NOT EXISTS rg_resources (
	version    BIGINT PRIMARY KEY,
	resources  TEXT NOT NULL,
	created_ns BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS rg_counters (
	name  TEXT PRIMARY KEY,
	value BIGINT NOT NULL
);
`

// Open opens a queue on a DSN: "postgres://..." or "postgresql://..." for
// PostgreSQL, otherwise a SQLite file path (optionally "sqlite:" prefixed).
func Open(ctx context.Context, dsn string, opt Options) (*Queue, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, fmt.Errorf("tasks: open postgres: %w", err)
		}
		q, err := New(ctx, db, Postgres, opt)
		if err != nil {
			db.Close()
			return nil, err
		}
		q.owned = true
		return q, nil
	}
	path := strings.TrimPrefix(dsn, "sqlite:")
	if path == "" {
		return nil, errors.New("tasks: empty queue DSN")
	}
	db, err := sql.Open("sqlite", "file:"+path+"?_busy_timeout=10000&_journal_mode=WAL&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("tasks: open sqlite %s: %w", path, err)
	}
	q, err := New(ctx, db, SQLite, opt)
	if err != nil {
		db.Close()
		return nil, err
	}
	q.owned = true
	return q, nil
}

// New makes a queue on an open database (for example the embedded store's
// SQLite handle), creating its tables if missing. Close does not close db.
// A SQLite handle must begin transactions with BEGIN IMMEDIATE
// (_txlock=immediate), as the embedded store's does.
func New(ctx context.Context, db *sql.DB, d Dialect, opt Options) (*Queue, error) {
	q := &Queue{db: db, dialect: d, lease: opt.Lease, now: opt.Now, log: opt.Log}
	if q.lease <= 0 {
		q.lease = DefaultLease
	}
	if q.now == nil {
		q.now = time.Now
	}
	if q.log == nil {
		q.log = slog.Default()
	}
	if d == Postgres {
		// Two gateways starting at once must not race on CREATE TABLE.
		if _, err := db.ExecContext(ctx, `SELECT pg_advisory_lock(7210417)`); err != nil {
			return nil, fmt.Errorf("tasks: locking schema: %w", err)
		}
		defer db.ExecContext(context.Background(), `SELECT pg_advisory_unlock(7210417)`)
	}
	for _, stmt := range strings.Split(schema+eventSchema, ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return nil, fmt.Errorf("tasks: creating tables: %w", err)
		}
	}
	return q, nil
}

// Close releases the database when the queue opened it.
func (q *Queue) Close() error {
	if q.owned {
		return q.db.Close()
	}
	return nil
}

// Dialect reports the database flavour.
func (q *Queue) Dialect() Dialect { return q.dialect }

// sql rewrites a query written with ? placeholders and FOR UPDATE clauses
// for the dialect.
func (q *Queue) sql(s string) string {
	if q.dialect == SQLite {
		s = strings.ReplaceAll(s, " FOR UPDATE SKIP LOCKED", "")
		return strings.ReplaceAll(s, " FOR UPDATE", "")
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// tx runs f in a transaction, committing when it returns nil.
func (q *Queue) tx(ctx context.Context, f func(*sql.Tx) error) error {
	t, err := q.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("tasks: begin: %w", err)
	}
	if err := f(t); err != nil {
		t.Rollback()
		return err
	}
	if err := t.Commit(); err != nil {
		return fmt.Errorf("tasks: commit: %w", err)
	}
	return nil
}

// counter adds n to a named counter and returns its new value. The row lock
// it takes serialises the transactions that use the same counter, so values
// become visible in the order they were handed out.
func (q *Queue) counter(ctx context.Context, t *sql.Tx, name string, n int64) (int64, error) {
	var v int64
	err := t.QueryRowContext(ctx, q.sql(`INSERT INTO rg_counters (name, value) VALUES (?, ?)
		ON CONFLICT (name) DO UPDATE SET value = rg_counters.value + excluded.value RETURNING value`), name, n).Scan(&v)
	if err != nil {
		return 0, fmt.Errorf("tasks: counter %s: %w", name, err)
	}
	return v, nil
}

func newRolloutID() string { return "ro-" + uuid.NewString()[:13] }
func newAttemptID() string { return "at-" + uuid.NewString()[:8] }

// Enqueue adds tasks and returns their rollout ids, in order. A malformed
// or out-of-range task is an ErrInvalidTask, a rollout id already in the
// queue an ErrExists; either way nothing is enqueued.
func (q *Queue) Enqueue(ctx context.Context, tasks []Task) ([]string, error) {
	ids := make([]string, len(tasks))
	leases, timeouts := make([]int64, len(tasks)), make([]int64, len(tasks))
	for i := range tasks {
		t := &tasks[i]
		if t.Mode == "" {
			t.Mode = "train"
		}
		if t.Mode != "train" && t.Mode != "val" {
			return nil, invalidf("task %d: mode %q is not train or val", i, t.Mode)
		}
		if t.MaxAttempts < 0 || t.MaxAttempts > MaxMaxAttempts {
			return nil, invalidf("task %d: max_attempts %d is out of range: 0 (the default, 1) to %d", i, t.MaxAttempts, MaxMaxAttempts)
		}
		if t.MaxAttempts == 0 {
			t.MaxAttempts = 1
		}
		var err error
		if timeouts[i], err = seconds(i, "timeout_s", t.TimeoutS, MaxTimeout); err != nil {
			return nil, err
		}
		if leases[i], err = seconds(i, "lease_s", t.LeaseS, MaxLease); err != nil {
			return nil, err
		}
		if leases[i] == 0 {
			leases[i] = nanos(q.lease)
		}
		if len(t.Input) == 0 {
			t.Input = json.RawMessage("null")
		}
		if !json.Valid(t.Input) {
			return nil, invalidf("task %d: input is not JSON", i)
		}
		if len(t.Metadata) == 0 || string(t.Metadata) == "null" {
			t.Metadata = json.RawMessage("{}")
		}
		ids[i] = t.RolloutID
		if ids[i] == "" {
			ids[i] = newRolloutID()
		}
		if strings.ContainsAny(ids[i], "/?#") {
			return nil, invalidf("task %d: rollout_id must not contain '/', '?' or '#'", i)
		}
	}
	now := q.now().UnixNano()
	err := q.tx(ctx, func(t *sql.Tx) error {
		last, err := q.counter(ctx, t, "queue_seq", int64(len(tasks)))
		if err != nil {
			return err
		}
		first := last - int64(len(tasks)) + 1
		for i, task := range tasks {
			res, err := t.ExecContext(ctx, q.sql(`INSERT INTO rg_tasks (rollout_id, task_id, input, mode, metadata,
				max_attempts, timeout_ns, lease_ns, status, attempt_no, attempt_id, worker_id, resources_version,
				lease_expires_ns, deadline_ns, queue_seq, created_ns, updated_ns, completed_ns, completion_seq, last_error)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0, '', '', 0, 0, 0, ?, ?, ?, 0, 0, '')
				ON CONFLICT (rollout_id) DO NOTHING`),
				ids[i], task.TaskID, string(task.Input), task.Mode, string(task.Metadata), task.MaxAttempts,
				timeouts[i], leases[i], StatusQueued, first+int64(i), now, now)
			if err != nil {
				return fmt.Errorf("tasks: enqueue %s: %w", ids[i], err)
			}
			if n, err := res.RowsAffected(); err == nil && n == 0 {
				return fmt.Errorf("task %d: rollout_id %s: %w (choose another id, or leave it out to have one made)", i, ids[i], ErrExists)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// Register records a rollout that a runner started without the queue (POST
// /api/v1/rollouts), so it completes and pages like queued ones. Registering
// an id the queue holds is an ErrExists, unless it repeats the registration
// of a rollout still running (same attempt, task and metadata): then the
// stored rollout is returned unchanged (created false). A finished rollout
// never runs again.
func (q *Queue) Register(ctx context.Context, rolloutID, attemptID, taskID string, metadata json.RawMessage) (ch *Change, created bool, err error) {
	if len(metadata) == 0 || string(metadata) == "null" {
		metadata = json.RawMessage("{}")
	}
	now := q.now().UnixNano()
	err = q.tx(ctx, func(t *sql.Tx) error {
		switch old, err := q.get(ctx, t, rolloutID, true); {
		case err == nil:
			if old.Status == StatusRunning && old.AttemptID == attemptID && old.TaskID == taskID && string(old.Metadata) == string(metadata) {
				ch = &Change{State: *old, Attempt: Attempt{RolloutID: rolloutID, AttemptID: attemptID, AttemptNo: old.AttemptNo,
					WorkerID: old.WorkerID, Status: StatusRunning}}
				return nil
			}
			return fmt.Errorf("rollout %s is %s (attempt %q): %w; register a new rollout id", rolloutID, old.Status, old.AttemptID, ErrExists)
		case !errors.Is(err, ErrNotFound):
			return err
		}
		seq, err := q.counter(ctx, t, "queue_seq", 1)
		if err != nil {
			return err
		}
		res, err := t.ExecContext(ctx, q.sql(`INSERT INTO rg_tasks (rollout_id, task_id, input, mode, metadata,
			max_attempts, timeout_ns, lease_ns, status, attempt_no, attempt_id, worker_id, resources_version,
			lease_expires_ns, deadline_ns, queue_seq, created_ns, updated_ns, completed_ns, completion_seq, last_error)
			VALUES (?, ?, 'null', 'train', ?, 1, 0, 0, 'running', 1, ?, '', 0, 0, 0, ?, ?, ?, 0, 0, '')
			ON CONFLICT (rollout_id) DO NOTHING`),
			rolloutID, taskID, string(metadata), attemptID, seq, now, now)
		if err != nil {
			return fmt.Errorf("tasks: register %s: %w", rolloutID, err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 { // a concurrent registration won
			return fmt.Errorf("rollout %s: %w; register a new rollout id", rolloutID, ErrExists)
		}
		st, err := q.get(ctx, t, rolloutID, false)
		if err != nil {
			return err
		}
		a := Attempt{RolloutID: rolloutID, AttemptID: attemptID, AttemptNo: st.AttemptNo, Status: StatusRunning, StartedNano: now}
		if err := q.putAttempt(ctx, t, &a); err != nil {
			return err
		}
		ch, created = &Change{State: *st, Attempt: a}, true
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return ch, created, nil
}

// taskCols are all the columns of rg_tasks.
const taskCols = `rollout_id, task_id, input, mode, metadata, max_attempts, timeout_ns, lease_ns, status,
	attempt_no, attempt_id, worker_id, resources_version, lease_expires_ns, deadline_ns, queue_seq, created_ns,
	updated_ns, completed_ns, completion_seq, last_error`

const stateCols = `rollout_id, task_id, input, mode, metadata, status, attempt_id, attempt_no, max_attempts,
	worker_id, resources_version, lease_expires_ns, deadline_ns, created_ns, updated_ns, completed_ns,
	completion_seq, last_error`

type scanner interface{ Scan(...any) error }

func scanState(r scanner) (*State, error) {
	var s State
	var input, meta string
	err := r.Scan(&s.RolloutID, &s.TaskID, &input, &s.Mode, &meta, &s.Status, &s.AttemptID, &s.AttemptNo,
		&s.MaxAttempts, &s.WorkerID, &s.ResourcesVersion, &s.LeaseExpiresNano, &s.DeadlineNano, &s.CreatedNano,
		&s.UpdatedNano, &s.CompletedNano, &s.CompletionSeq, &s.LastError)
	if err != nil {
		return nil, err
	}
	s.Input, s.Metadata = json.RawMessage(input), json.RawMessage(meta)
	return &s, nil
}

func (q *Queue) get(ctx context.Context, t *sql.Tx, rolloutID string, lock bool) (*State, error) {
	query := `SELECT ` + stateCols + ` FROM rg_tasks WHERE rollout_id = ?`
	if lock {
		query += ` FOR UPDATE`
	}
	s, err := scanState(t.QueryRowContext(ctx, q.sql(query), rolloutID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: reading %s: %w", rolloutID, err)
	}
	return s, nil
}

func (q *Queue) putAttempt(ctx context.Context, t *sql.Tx, a *Attempt) error {
	_, err := t.ExecContext(ctx, q.sql(`INSERT INTO rg_attempts (rollout_id, attempt_id, attempt_no, worker_id,
		status, reason, started_ns, ended_ns) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (rollout_id, attempt_id) DO UPDATE SET status = excluded.status, reason = excluded.reason,
			ended_ns = excluded.ended_ns`),
		a.RolloutID, a.AttemptID, a.AttemptNo, a.WorkerID, a.Status, a.Reason, a.StartedNano, a.EndedNano)
	if err != nil {
		return fmt.Errorf("tasks: recording attempt %s/%s: %w", a.RolloutID, a.AttemptID, err)
	}
	return nil
}

// Get reads one rollout.
func (q *Queue) Get(ctx context.Context, rolloutID string) (*State, error) {
	s, err := scanState(q.db.QueryRowContext(ctx, q.sql(`SELECT `+stateCols+` FROM rg_tasks WHERE rollout_id = ?`), rolloutID))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: reading %s: %w", rolloutID, err)
	}
	return s, nil
}

// Attempts reads a rollout's attempt history, oldest first.
func (q *Queue) Attempts(ctx context.Context, rolloutID string) ([]Attempt, error) {
	rows, err := q.db.QueryContext(ctx, q.sql(`SELECT rollout_id, attempt_id, attempt_no, worker_id, status,
		reason, started_ns, ended_ns FROM rg_attempts WHERE rollout_id = ? ORDER BY attempt_no, started_ns`), rolloutID)
	if err != nil {
		return nil, fmt.Errorf("tasks: reading attempts of %s: %w", rolloutID, err)
	}
	defer rows.Close()
	var out []Attempt
	for rows.Next() {
		var a Attempt
		if err := rows.Scan(&a.RolloutID, &a.AttemptID, &a.AttemptNo, &a.WorkerID, &a.Status, &a.Reason,
			&a.StartedNano, &a.EndedNano); err != nil {
			return nil, fmt.Errorf("tasks: reading attempts of %s: %w", rolloutID, err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// maxUnservable bounds how many rows one Dequeue or Expire moves aside
// before it reports the error instead.
const maxUnservable = 16

// Dequeue leases the oldest queued rollout to workerID as a new attempt, or
// returns nil when nothing is queued. Expired leases are swept first; their
// changes are returned too. A row the database cannot lease or read back
// (numbers that overflow, a corrupt value) is moved aside (moveAside) and
// the next one is leased: one bad task never blocks the others.
func (q *Queue) Dequeue(ctx context.Context, workerID string) (*State, []Change, error) {
	changes, err := q.Expire(ctx)
	if err != nil {
		return nil, nil, err
	}
	for moved := 0; ; moved++ {
		st, ch, bad, err := q.dequeueOne(ctx, workerID)
		if err == nil {
			if ch != nil {
				changes = append(changes, *ch)
			}
			return st, changes, nil
		}
		if bad == "" || moved == maxUnservable {
			return nil, changes, err
		}
		if err := q.moveAside(ctx, bad, err); err != nil {
			return nil, changes, err
		}
	}
}

// dequeueOne leases the oldest queued rollout. When the database cannot
// lease or read that row (rowDataError), bad names it.
func (q *Queue) dequeueOne(ctx context.Context, workerID string) (st *State, ch *Change, bad string, err error) {
	now := q.now().UnixNano()
	attemptID := newAttemptID()
	err = q.tx(ctx, func(t *sql.Tx) error {
		var version int64
		if err := t.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM rg_resources`).Scan(&version); err != nil {
			return fmt.Errorf("tasks: latest resources: %w", err)
		}
		var id string
		err := t.QueryRowContext(ctx, q.sql(`SELECT rollout_id FROM rg_tasks WHERE status = 'queued'
			ORDER BY queue_seq LIMIT 1 FOR UPDATE SKIP LOCKED`)).Scan(&id)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tasks: dequeue: %w", err)
		}
		// A lease_ns of 0 or less (rows of older releases) takes the default.
		s, err := scanState(t.QueryRowContext(ctx, q.sql(`UPDATE rg_tasks SET status = 'running',
			attempt_no = attempt_no + 1, attempt_id = ?, worker_id = ?, resources_version = ?,
			lease_expires_ns = ? + CASE WHEN lease_ns > 0 THEN lease_ns ELSE ? END,
			deadline_ns = CASE WHEN timeout_ns > 0 THEN ? + timeout_ns ELSE 0 END, updated_ns = ?
			WHERE rollout_id = ? AND status = 'queued'
			RETURNING `+stateCols), attemptID, workerID, version, now, nanos(q.lease), now, now, id))
		if err != nil {
			if rowDataError(err) {
				bad = id
			}
			return fmt.Errorf("tasks: dequeue %s: %w", id, err)
		}
		a := Attempt{RolloutID: s.RolloutID, AttemptID: attemptID, AttemptNo: s.AttemptNo, WorkerID: workerID,
			Status: StatusRunning, StartedNano: now}
		if err := q.putAttempt(ctx, t, &a); err != nil {
			return err
		}
		st, ch = s, &Change{State: *s, Attempt: a}
		return nil
	})
	if err != nil {
		return nil, nil, bad, err
	}
	return st, ch, "", nil
}

// rowDataError reports whether err is about the values of a row rather than
// the database: a value that does not scan into its Go type (SQLite turns
// an integer overflow into a REAL), or PostgreSQL's class 22, data
// exception (22003: a bigint out of range).
func rowDataError(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return strings.HasPrefix(pg.Code, "22")
	}
	// database/sql has no error type for a failed conversion; its message
	// is "sql: Scan error on column index N, name ...".
	return strings.Contains(err.Error(), "sql: Scan error on column")
}

// moveAside takes a row that cannot be served out of rg_tasks into
// rg_tasks_aside (same columns, plus why and when), logging it, so that the
// queue goes on with the others. The operator can inspect it there.
func (q *Queue) moveAside(ctx context.Context, rolloutID string, cause error) error {
	now := q.now().UnixNano()
	err := q.tx(ctx, func(t *sql.Tx) error {
		if _, err := t.ExecContext(ctx, q.sql(`INSERT INTO rg_tasks_aside (`+taskCols+`, aside_reason, aside_ns)
			SELECT `+taskCols+`, ?, ? FROM rg_tasks WHERE rollout_id = ?`), cause.Error(), now, rolloutID); err != nil {
			return fmt.Errorf("tasks: moving unservable rollout %s aside: %w", rolloutID, err)
		}
		if _, err := t.ExecContext(ctx, q.sql(`DELETE FROM rg_tasks WHERE rollout_id = ?`), rolloutID); err != nil {
			return fmt.Errorf("tasks: moving unservable rollout %s aside: %w", rolloutID, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	q.log.Error("task queue: a rollout cannot be served (a value in its row is out of range or corrupt); moved to table rg_tasks_aside",
		"rollout_id", rolloutID, "err", cause)
	return nil
}

// Heartbeat extends the lease of a running attempt and returns the new
// expiry. The attempt must be the rollout's current one and its lease
// unexpired (else ErrStale: the runner lost it and should stop), and
// workerID the worker it was leased to ("" when the dequeue named none;
// else ErrWrongWorker).
func (q *Queue) Heartbeat(ctx context.Context, rolloutID, attemptID, workerID string) (int64, error) {
	now := q.now().UnixNano()
	var exp int64
	err := q.db.QueryRowContext(ctx, q.sql(`UPDATE rg_tasks SET lease_expires_ns = ? + lease_ns, updated_ns = ?
		WHERE rollout_id = ? AND attempt_id = ? AND status = 'running' AND lease_ns > 0
			AND worker_id = ? AND lease_expires_ns >= ?
		RETURNING lease_expires_ns`), now, now, rolloutID, attemptID, workerID, now).Scan(&exp)
	if errors.Is(err, sql.ErrNoRows) {
		st, gerr := q.Get(ctx, rolloutID)
		if gerr != nil {
			return 0, gerr
		}
		switch {
		case st.Status != StatusRunning || st.AttemptID != attemptID:
			return 0, notCurrent(st, attemptID)
		case st.LeaseExpiresNano == 0:
			return 0, fmt.Errorf("%w: attempt %s of rollout %s holds no lease (it was registered or is run by its owner, not dequeued)", ErrStale, attemptID, rolloutID)
		case st.LeaseExpiresNano < now:
			return 0, fmt.Errorf("%w: the lease of attempt %s of rollout %s expired", ErrStale, attemptID, rolloutID)
		case st.WorkerID != workerID:
			return 0, wrongWorker(st, workerID)
		}
		return 0, fmt.Errorf("%w: the lease of attempt %s of rollout %s changed meanwhile", ErrStale, attemptID, rolloutID)
	}
	if err != nil {
		return 0, fmt.Errorf("tasks: heartbeat %s/%s: %w", rolloutID, attemptID, err)
	}
	return exp, nil
}

// notCurrent is the ErrStale of a report naming attempt, which is not st's
// current running attempt; it names the rollout's status.
func notCurrent(st *State, attempt string) error {
	return fmt.Errorf("%w: rollout %s is %s (current attempt %q); the report names attempt %q", ErrStale,
		st.RolloutID, st.Status, st.AttemptID, attempt)
}

// wrongWorker is the ErrWrongWorker of a report by worker on st's attempt.
func wrongWorker(st *State, worker string) error {
	return fmt.Errorf("%w: attempt %s of rollout %s is leased to worker_id %q, the report names %q", ErrWrongWorker,
		st.AttemptID, st.RolloutID, st.WorkerID, worker)
}

// Complete ends an attempt: "succeeded" and "cancelled" end the rollout;
// "failed" retries it as a new attempt while attempts remain, else fails it.
// A leased attempt (dequeued, not registered) must be named, with the
// worker it was leased to: else ErrAttemptRequired or ErrWrongWorker.
// attemptID "" means the current attempt of a rollout that holds no lease.
// ErrStale (naming the rollout's status) when the attempt is not the
// rollout's current running one: a finished rollout stays finished.
func (q *Queue) Complete(ctx context.Context, rolloutID, attemptID, workerID, status, reason string) (*Change, error) {
	switch status {
	case StatusSucceeded, StatusFailed, StatusCancelled:
	default:
		return nil, fmt.Errorf("tasks: status %q is not succeeded, failed or cancelled", status)
	}
	var ch *Change
	err := q.tx(ctx, func(t *sql.Tx) error {
		s, err := q.get(ctx, t, rolloutID, true)
		if err != nil {
			return err
		}
		if err := s.CheckReport(attemptID, workerID); err != nil {
			return err
		}
		ch, err = q.endAttempt(ctx, t, s, status, status, reason)
		return err
	})
	return ch, err
}

// Leased reports whether the rollout's current attempt holds a lease (it
// was dequeued, not registered or run by its owner).
func (s *State) Leased() bool { return s.Status == StatusRunning && s.LeaseExpiresNano != 0 }

// CheckReport checks that a report on the rollout (a status) comes from its
// current running attempt: attemptID is that attempt ("" only when the
// attempt holds no lease), and, when it is leased, workerID the worker it
// was leased to. The error is ErrAttemptRequired, ErrStale or
// ErrWrongWorker, naming what differs.
func (s *State) CheckReport(attemptID, workerID string) error {
	if attemptID == "" {
		if s.Leased() {
			return fmt.Errorf("%w: rollout %s is leased: send the attempt_id (and worker_id) the dequeue answered", ErrAttemptRequired, s.RolloutID)
		}
		attemptID = s.AttemptID
	}
	if s.Status != StatusRunning || s.AttemptID != attemptID {
		return notCurrent(s, attemptID)
	}
	if s.Leased() && s.WorkerID != workerID {
		return wrongWorker(s, workerID)
	}
	return nil
}

// endAttempt moves the running attempt of s to attemptStatus and the rollout
// to its next state. Called inside a transaction holding the row.
func (q *Queue) endAttempt(ctx context.Context, t *sql.Tx, s *State, outcome, attemptStatus, reason string) (*Change, error) {
	now := q.now().UnixNano()
	next := outcome
	if outcome == StatusFailed && s.AttemptNo < s.MaxAttempts {
		next = StatusQueued
	}
	var seq, completed int64
	if next != StatusQueued {
		var err error
		if seq, err = q.counter(ctx, t, "completion_seq", 1); err != nil {
			return nil, err
		}
		completed = now
	}
	_, err := t.ExecContext(ctx, q.sql(`UPDATE rg_tasks SET status = ?, lease_expires_ns = 0, deadline_ns = 0,
		updated_ns = ?, completed_ns = ?, completion_seq = ?, last_error = ?
		WHERE rollout_id = ? AND attempt_id = ?`),
		next, now, completed, seq, reason, s.RolloutID, s.AttemptID)
	if err != nil {
		return nil, fmt.Errorf("tasks: ending attempt %s/%s: %w", s.RolloutID, s.AttemptID, err)
	}
	a := Attempt{RolloutID: s.RolloutID, AttemptID: s.AttemptID, AttemptNo: s.AttemptNo, WorkerID: s.WorkerID,
		Status: attemptStatus, Reason: reason, EndedNano: now}
	if err := t.QueryRowContext(ctx, q.sql(`SELECT started_ns FROM rg_attempts WHERE rollout_id = ? AND attempt_id = ?`),
		s.RolloutID, s.AttemptID).Scan(&a.StartedNano); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("tasks: reading attempt %s/%s: %w", s.RolloutID, s.AttemptID, err)
	}
	if err := q.putAttempt(ctx, t, &a); err != nil {
		return nil, err
	}
	st := *s
	st.Status, st.LeaseExpiresNano, st.DeadlineNano, st.UpdatedNano = next, 0, 0, now
	st.CompletedNano, st.CompletionSeq, st.LastError = completed, seq, reason
	return &Change{State: st, Attempt: a}, nil
}

// Expire ends every running attempt whose lease or deadline has passed
// (attempt status "expired" or "timeout"), retrying or failing its rollout.
func (q *Queue) Expire(ctx context.Context) ([]Change, error) {
	now := q.now().UnixNano()
	rows, err := q.db.QueryContext(ctx, q.sql(`SELECT rollout_id, attempt_id FROM rg_tasks WHERE status = 'running'
		AND ((lease_expires_ns > 0 AND lease_expires_ns < ?) OR (deadline_ns > 0 AND deadline_ns < ?))`), now, now)
	if err != nil {
		return nil, fmt.Errorf("tasks: finding expired leases: %w", err)
	}
	type key struct{ rollout, attempt string }
	var due []key
	for rows.Next() {
		var k key
		if err := rows.Scan(&k.rollout, &k.attempt); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tasks: finding expired leases: %w", err)
		}
		due = append(due, k)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tasks: finding expired leases: %w", err)
	}
	var out []Change
	moved := 0
	for _, k := range due {
		err := q.tx(ctx, func(t *sql.Tx) error {
			s, err := q.get(ctx, t, k.rollout, true)
			if err != nil {
				return err
			}
			if s.Status != StatusRunning || s.AttemptID != k.attempt {
				return nil // someone else moved it on
			}
			status, reason := "", ""
			switch {
			case s.DeadlineNano > 0 && s.DeadlineNano < now:
				status, reason = "timeout", fmt.Sprintf("attempt %s ran past its timeout", s.AttemptID)
			case s.LeaseExpiresNano > 0 && s.LeaseExpiresNano < now:
				status, reason = "expired", fmt.Sprintf("lease of attempt %s (worker %q) expired without a heartbeat", s.AttemptID, s.WorkerID)
			default:
				return nil
			}
			ch, err := q.endAttempt(ctx, t, s, StatusFailed, status, reason)
			if err == nil {
				out = append(out, *ch)
			}
			return err
		})
		if err != nil && rowDataError(err) && moved < maxUnservable {
			moved++
			err = q.moveAside(ctx, k.rollout, err)
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			return out, err
		}
	}
	return out, nil
}

// List reads rollouts. With a cursor (After > 0 or Cursor) it returns
// completed rollouts in completion order, else rollouts in queue order.
// next is the cursor to pass as After for the following page.
func (q *Queue) List(ctx context.Context, f ListFilter) (out []State, next int64, err error) {
	var where []string
	var args []any
	completion := f.After > 0 || f.Cursor
	switch {
	case f.Status == "completed":
		where = append(where, "status IN ('succeeded', 'failed', 'cancelled')")
	case f.Status != "":
		where = append(where, "status = ?")
		args = append(args, f.Status)
	}
	if completion {
		where = append(where, "completion_seq > ?")
		args = append(args, f.After)
	}
	if len(f.IDs) > 0 {
		where = append(where, "rollout_id IN (?"+strings.Repeat(", ?", len(f.IDs)-1)+")")
		for _, id := range f.IDs {
			args = append(args, id)
		}
	}
	query := `SELECT ` + stateCols + ` FROM rg_tasks`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	if completion {
		query += " ORDER BY completion_seq"
	} else {
		query += " ORDER BY queue_seq"
	}
	query += " LIMIT " + strconv.Itoa(f.limit())
	rows, err := q.db.QueryContext(ctx, q.sql(query), args...)
	if err != nil {
		return nil, 0, fmt.Errorf("tasks: listing rollouts: %w", err)
	}
	defer rows.Close()
	next = f.After
	for rows.Next() {
		s, err := scanState(rows)
		if err != nil {
			return nil, 0, fmt.Errorf("tasks: listing rollouts: %w", err)
		}
		if s.CompletionSeq > next {
			next = s.CompletionSeq
		}
		out = append(out, *s)
	}
	return out, next, rows.Err()
}

// PutResources publishes a new version of named resources and returns it.
func (q *Queue) PutResources(ctx context.Context, res map[string]json.RawMessage) (*Resources, error) {
	if len(res) == 0 {
		return nil, errors.New("tasks: no resources given")
	}
	body, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("tasks: encoding resources: %w", err)
	}
	out := &Resources{CreatedNano: q.now().UnixNano(), Resources: res}
	err = q.tx(ctx, func(t *sql.Tx) error {
		v, err := q.counter(ctx, t, "resources_version", 1)
		if err != nil {
			return err
		}
		out.Version = v
		_, err = t.ExecContext(ctx, q.sql(`INSERT INTO rg_resources (version, resources, created_ns) VALUES (?, ?, ?)`),
			v, string(body), out.CreatedNano)
		if err != nil {
			return fmt.Errorf("tasks: storing resources v%d: %w", v, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetResources reads a version of the resources; version 0 means the latest.
func (q *Queue) GetResources(ctx context.Context, version int64) (*Resources, error) {
	query, args := `SELECT version, resources, created_ns FROM rg_resources WHERE version = ?`, []any{version}
	if version == 0 {
		query, args = `SELECT version, resources, created_ns FROM rg_resources ORDER BY version DESC LIMIT 1`, nil
	}
	var r Resources
	var body string
	err := q.db.QueryRowContext(ctx, q.sql(query), args...).Scan(&r.Version, &body, &r.CreatedNano)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNoResources
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: reading resources: %w", err)
	}
	if err := json.Unmarshal([]byte(body), &r.Resources); err != nil {
		return nil, fmt.Errorf("tasks: decoding resources v%d: %w", r.Version, err)
	}
	return &r, nil
}
