// Package sqlite is the embedded default store: the tables of docs/contract.md §3
// in one SQLite file (pure Go, modernc.org/sqlite), with the same table and
// column names as ClickHouse, so `rollgate serve` needs no server.
//
// The file is in WAL mode with a busy timeout, so the gateway can write while
// `rollgate sql` reads from another process. Token-id and logprob arrays are
// stored as JSON text ([1,2,3]).
package sqlite

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"github.com/rollgate/rollgate/export/arrays"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/rollgate/rollgate/export"
)

//go:embed schema.sql
var schemaSQL string

// BusyTimeout is how long a statement waits for another connection or
// process holding the write lock before failing with SQLITE_BUSY.
const BusyTimeout = 10 * time.Second

// pageSize is a new file's page size; a file keeps the one it was made with
// (4 KiB before 2026-11-29). A stored call (≈ 8 KB with its bodies and
// arrays) then takes one page and its overflow, and a commit writes fewer,
// larger WAL frames; with one random-key index left (llm_calls_by_rollout)
// the bigger index pages cost less than the frames saved. µs per stored
// row (BenchmarkWriteBatch, new file / after ROLLGATE_BENCH_PREFILL=1000000
// rows): 4 KiB 36-39 / 46-47, 16 KiB 31-35 / 41-42, 8 KiB worse than both
// (45-48 / 49-52 at 300,000); `bench/ab` through the gateway, 32 agents: CPU
// per call -9 %. (With the three indexes of before, 16 KiB pages were worse
// at scale: 185 against 146 µs at 10^6 rows.) The page cache stays SQLite's
// default 2 MiB: a 16 MiB one cost 33 MiB more peak RSS for little.
const pageSize = 16384

// walAutocheckpoint is the WAL's length in pages (2,500 × 16 KiB = 40 MiB;
// 10 MiB on a file with 4 KiB pages) at which a commit copies it into the
// database (SQLite's default: 1,000 pages). Index pages that several
// commits touch are copied once per checkpoint, so fewer, longer
// checkpoints copy less: µs per stored row (BenchmarkWriteBatch, 4 KiB
// pages, new file / after 300,000 rows) 4 MiB 47 / 51; 16 MiB 40 / 51;
// 40 MiB 40 / 46. The WAL file stays at about that size once it has grown.
const walAutocheckpoint = 2500

// Store is an export.Store in a SQLite file. It is safe for concurrent use,
// and several processes may open the same file.
type Store struct {
	// SQLReads are the typed reads (export.Reader), over queryEach.
	*export.SQLReads
	db   *sql.DB
	path string
	// writeMu serialises this process's write transactions so they queue
	// here instead of spinning on SQLite's busy handler.
	writeMu sync.Mutex
}

var _ export.Store = (*Store)(nil)

// Open opens (creating it and its folder if needed) the SQLite file at path
// and creates the tables if they are missing.
func Open(path string) (*Store, error) {
	if path == "" {
		return nil, fmt.Errorf("sqlite: empty path")
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("sqlite: create folder for %s: %w", path, err)
		}
	}
	dsn := "file:" + escapePath(path) +
		"?_busy_timeout=" + strconv.FormatInt(BusyTimeout.Milliseconds(), 10) +
		"&_journal_mode=WAL&_synchronous=NORMAL&_txlock=immediate" +
		"&_pragma=page_size(" + strconv.Itoa(pageSize) + ")" +
		"&_pragma=wal_autocheckpoint(" + strconv.Itoa(walAutocheckpoint) + ")"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: create tables in %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: upgrading %s: %w", path, err)
	}
	s := &Store{db: db, path: path}
	s.SQLReads = export.NewSQLReads(func(ctx context.Context, query string, args []any, f func(row []string) error) error {
		return s.queryEach(ctx, query, args, func([]string) {}, f)
	}, "", "IN", versionSQL)
	return s, nil
}

// versionSQL is StoreVersion's query: the largest rowids and the rollouts'
// latest update (an index each), without reading the tables.
const versionSQL = "SELECT (SELECT max(rowid) FROM llm_calls), (SELECT max(rowid) FROM rewards), (SELECT max(rowid) FROM rollouts)," +
	" (SELECT max(updated_unix_nano) FROM rollouts)"

// escapePath escapes the characters that would end the path part of a file: URI.
func escapePath(p string) string {
	return strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(p)
}

// Name returns "sqlite".
func (s *Store) Name() string { return "sqlite" }

// Path is the database file.
func (s *Store) Path() string { return s.path }

// DB is the underlying handle, for callers that keep their own tables in the
// same file (the task queue, for example).
func (s *Store) DB() *sql.DB { return s.db }

// Close closes the database.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("sqlite: close %s: %w", s.path, err)
	}
	return nil
}

// schema is schema.sql with the tables' columns filled in.
var schema = renderSchema()

func renderSchema() string {
	tmpl := template.Must(template.New("schema.sql").Funcs(template.FuncMap{
		"columns": func(table string) (string, error) {
			return export.ColumnDefs(table, func(c export.ColumnInfo) string { return fmt.Sprintf("%-20s %s", c.Name, c.SQLiteDecl()) })
		},
	}).Parse(schemaSQL))
	var b strings.Builder
	if err := tmpl.Execute(&b, nil); err != nil {
		panic("sqlite: schema.sql: " + err.Error())
	}
	return b.String()
}

var (
	insertCall   = insertSQL(export.CallTable.Name, export.CallTable.Info())
	insertReward = insertSQL(export.RewardTable.Name, export.RewardTable.Info())
	insertSpan   = insertSQL(export.SpanTable.Name, export.SpanTable.Info())
	// The latest row per (rollout, attempt) wins; equal times: the later write.
	insertRollout = insertSQL(export.RolloutTable.Name, export.RolloutTable.Info()) +
		" ON CONFLICT (rollout_id, attempt_id) DO UPDATE SET " + updateSet(export.RolloutTable.Info(), "rollout_id", "attempt_id") +
		" WHERE excluded.updated_unix_nano >= rollouts.updated_unix_nano"
)

func insertSQL(table string, cols []export.ColumnInfo) string {
	return "INSERT INTO " + table + " (" + names(cols) + ") VALUES (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
}

// names joins the column names with ", ".
func names(cols []export.ColumnInfo) string {
	s := make([]string, len(cols))
	for i, c := range cols {
		s[i] = c.Name
	}
	return strings.Join(s, ", ")
}

// updateSet is "col = excluded.col, ..." for every column but the keys.
func updateSet(cols []export.ColumnInfo, keys ...string) string {
	var s []string
	for _, c := range cols {
		if !slices.Contains(keys, c.Name) {
			s = append(s, c.Name+" = excluded."+c.Name)
		}
	}
	return strings.Join(s, ", ")
}

// Write stores the batch in one transaction: all of it or none. ctx's end
// is checked before each row; the statements themselves run without it
// (uncancelled): with a context that can end, modernc.org/sqlite starts a
// goroutine per statement to interrupt it and database/sql one per
// transaction, a goroutine per stored row on the hot path. A statement's
// own wait for the file's lock is bounded by the busy timeout.
func (s *Store) Write(ctx context.Context, b *export.Batch) error {
	if b == nil || b.Len() == 0 {
		return nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	tx, err := s.db.BeginTx(context.WithoutCancel(ctx), nil)
	if err != nil {
		return fmt.Errorf("sqlite: begin: %w", err)
	}
	if err := writeTx(ctx, tx, b); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite: commit: %w", err)
	}
	return nil
}

func writeTx(ctx context.Context, tx *sql.Tx, b *export.Batch) error {
	if err := insertRows(ctx, tx, insertCall, export.CallTable, b.Calls, func(c *export.Call) string { return fmt.Sprintf(" (span %q)", c.SpanID) }); err != nil {
		return err
	}
	if err := insertRows(ctx, tx, insertReward, export.RewardTable, b.Rewards, nil); err != nil {
		return err
	}
	if err := insertRows(ctx, tx, insertSpan, export.SpanTable, b.Spans, func(s *export.Span) string { return fmt.Sprintf(" (span %q)", s.SpanID) }); err != nil {
		return err
	}
	return insertRows(ctx, tx, insertRollout, export.RolloutTable, b.Rollouts, nil)
}

// insertRows runs the insert statement query once per row, checking ctx
// before each (the statements run uncancelled: see Write); which, when not
// nil, names the failed row in the error.
func insertRows[R any](ctx context.Context, tx *sql.Tx, query string, tbl *export.Table[R], rows []R, which func(*R) string) error {
	if len(rows) == 0 {
		return nil
	}
	run := context.WithoutCancel(ctx)
	stmt, err := tx.PrepareContext(run, query)
	if err != nil {
		return fmt.Errorf("sqlite: insert into %s: %w", tbl.Name, err)
	}
	defer stmt.Close()
	var (
		args []any
		buf  []byte
	)
	for i := range rows {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sqlite: insert into %s: %w", tbl.Name, err)
		}
		args, buf = appendArgs(args[:0], buf, tbl.Columns, &rows[i])
		if _, err := stmt.ExecContext(run, args...); err != nil {
			row := ""
			if which != nil {
				row = which(&rows[i])
			}
			return fmt.Errorf("sqlite: insert into %s%s: %w", tbl.Name, row, err)
		}
	}
	return nil
}

// appendArgs appends r's values as SQLite keeps them, in column order, to
// dst: integers as int64 (uint64 bits unchanged), bools as 0/1, arrays as
// JSON text (built in buf, which it returns for reuse).
func appendArgs[R any](dst []any, buf []byte, cols []export.Column[R], r *R) ([]any, []byte) {
	for i := range cols {
		c := &cols[i]
		p := c.Field(r)
		switch c.Type {
		case export.TypeString:
			dst = append(dst, *p.(*string))
		case export.TypeUint64:
			dst = append(dst, int64(*p.(*uint64)))
		case export.TypeUint32:
			dst = append(dst, int64(*p.(*uint32)))
		case export.TypeUint16:
			dst = append(dst, int64(*p.(*uint16)))
		case export.TypeBool:
			var v int64
			if *p.(*bool) {
				v = 1
			}
			dst = append(dst, v)
		case export.TypeFloat64:
			dst = append(dst, *p.(*float64))
		case export.TypeUint32s:
			buf = arrays.AppendUint32s(buf[:0], *p.(*[]uint32))
			dst = append(dst, string(buf))
		case export.TypeFloat32s:
			buf = arrays.AppendFloat32s(buf[:0], *p.(*[]float32))
			dst = append(dst, string(buf))
		default:
			panic(fmt.Sprintf("sqlite: column %s: unknown type %d", c.Name, c.Type))
		}
	}
	return dst, buf
}

// Query runs ad-hoc SQL and renders every value as text: integers and
// floats in their shortest exact form, NULL as "NULL", arrays as the JSON
// text they are stored as ([1,2,3]).
func (s *Store) Query(ctx context.Context, query string) (*export.Result, error) {
	return export.CollectRows(func(columns func([]string), row func([]string) error) error {
		return s.queryEach(ctx, query, nil, columns, row)
	})
}

// QueryEach is Query handing out one row at a time (export.RowStreamer).
func (s *Store) QueryEach(ctx context.Context, query string, f func(row []string) error) error {
	return s.queryEach(ctx, query, nil, func([]string) {}, f)
}

// queryEach runs query with args bound to its ? placeholders, tells
// columns its column names, then calls f with each row, freshly allocated.
func (s *Store) queryEach(ctx context.Context, query string, args []any, columns func([]string), f func(row []string) error) error {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("sqlite: query: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return fmt.Errorf("sqlite: query: %w", err)
	}
	columns(cols)
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return fmt.Errorf("sqlite: query: scan: %w", err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = renderValue(v)
		}
		if err := f(row); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("sqlite: query: %w", err)
	}
	return nil
}

func renderValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "NULL"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return x
	case []byte:
		return string(x)
	case bool:
		return strconv.FormatBool(x)
	case time.Time:
		return x.Format("2006-01-02 15:04:05.999999999")
	default:
		return fmt.Sprint(x)
	}
}

// Calls reads llm_calls rows matching f, ordered by rollout, attempt,
// sequence id and choice.
func (s *Store) Calls(ctx context.Context, f export.CallFilter) ([]export.Call, error) {
	where, args := f.Conditions()
	q := "SELECT " + export.SelectList(export.CallTable.Columns, f.Omit.Omits) + " FROM llm_calls"
	if where != "" {
		q += " WHERE " + where
	}
	q += " ORDER BY rollout_id, attempt_id, sequence_id, choice_index, span_id"
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	return s.readCalls(ctx, q, args)
}

// Call reads the row k names: the latest started when several match (an
// attempt not named), nil when none does.
func (s *Store) Call(ctx context.Context, k export.CallKey) (*export.Call, error) {
	where, args := k.Conditions()
	calls, err := s.readCalls(ctx, "SELECT "+export.CallTable.Names()+" FROM llm_calls WHERE "+where+
		" ORDER BY start_time_unix_nano DESC, span_id DESC LIMIT 1", args)
	if err != nil || len(calls) == 0 {
		return nil, err
	}
	return &calls[0], nil
}

// readCalls runs query, which selects the columns of export.CallTable.
func (s *Store) readCalls(ctx context.Context, query string, args []any) ([]export.Call, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read llm_calls: %w", err)
	}
	defer rows.Close()
	var out []export.Call
	sc := export.NewScanner(export.CallTable.Columns, export.IntsAsInt64)
	for rows.Next() {
		if err := sc.Scan(rows, func(c *export.Call) string { return fmt.Sprintf("span %q", c.SpanID) }); err != nil {
			return nil, fmt.Errorf("sqlite: read llm_calls: %w", err)
		}
		out = append(out, sc.Row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read llm_calls: %w", err)
	}
	return out, nil
}

// Rollout reads the rollout's attempts (one row each, the latest), its
// calls and its rewards. An unknown rollout gives an empty detail, not an error.
func (s *Store) Rollout(ctx context.Context, rolloutID string) (*export.RolloutDetail, error) {
	return s.ReadRollout(ctx, rolloutID, export.ReadOptions{})
}

// ReadRollout is Rollout without what opt leaves out (attempts are always
// read: one row each).
func (s *Store) ReadRollout(ctx context.Context, rolloutID string, opt export.ReadOptions) (*export.RolloutDetail, error) {
	d := &export.RolloutDetail{}
	rows, err := s.db.QueryContext(ctx, "SELECT "+export.RolloutTable.Names()+
		" FROM rollouts WHERE rollout_id = ? ORDER BY attempt_id", rolloutID)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read rollouts: %w", err)
	}
	rsc := export.NewScanner(export.RolloutTable.Columns, export.IntsAsInt64)
	for rows.Next() {
		if err := rsc.Scan(rows, func(r *export.Rollout) string { return fmt.Sprintf("attempt %q", r.AttemptID) }); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlite: read rollouts: %w", err)
		}
		d.Attempts = append(d.Attempts, rsc.Row)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read rollouts: %w", err)
	}

	if !opt.NoCalls {
		if d.Calls, err = s.Calls(ctx, export.CallFilter{RolloutID: rolloutID, Omit: opt}); err != nil {
			return nil, err
		}
	}

	rows, err = s.db.QueryContext(ctx, "SELECT "+export.RewardTable.Names()+
		" FROM rewards WHERE rollout_id = ? ORDER BY attempt_id, sequence_id, time_unix_nano, name", rolloutID)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read rewards: %w", err)
	}
	defer rows.Close()
	wsc := export.NewScanner(export.RewardTable.Columns, export.IntsAsInt64)
	for rows.Next() {
		if err := wsc.Scan(rows, func(r *export.Reward) string { return fmt.Sprintf("reward %q", r.Name) }); err != nil {
			return nil, fmt.Errorf("sqlite: read rewards: %w", err)
		}
		d.Rewards = append(d.Rewards, wsc.Row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read rewards: %w", err)
	}
	return d, nil
}

// migrate brings tables created by an older rollgate up to date: it walks
// export.Migrations and adds the columns a table lacks (SQLite appends
// them; inserts and selects name their columns, so the order does not
// matter), their defaults filling the old rows.
func migrate(db *sql.DB) error {
	have := map[string]map[string]bool{}
	for _, m := range export.Migrations() {
		for _, a := range m.Adds {
			if have[a.Table] == nil {
				cols, err := tableColumns(db, a.Table)
				if err != nil {
					return err
				}
				have[a.Table] = cols
			}
			if have[a.Table][a.Column.Name] {
				continue
			}
			if _, err := db.Exec("ALTER TABLE " + a.Table + " ADD COLUMN " + a.Column.Name + " " + a.Column.SQLiteDecl()); err != nil {
				return fmt.Errorf("adding column %s to %s (schema version %d): %w", a.Column.Name, a.Table, m.Version, err)
			}
			have[a.Table][a.Column.Name] = true
		}
	}
	return nil
}

// tableColumns returns the names of table's columns.
func tableColumns(db *sql.DB, table string) (map[string]bool, error) {
	rows, err := db.Query("SELECT name FROM pragma_table_info(?)", table)
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", table, err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, fmt.Errorf("reading the columns of %s: %w", table, err)
		}
		have[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading the columns of %s: %w", table, err)
	}
	return have, nil
}

// trainingSources are export.TrainingSQL's per-attempt rows in SQLite: a
// bare column next to one min() or max() comes from the row that holds it
// (the first call's policy version, the latest rollouts row, the latest
// reward). The rewards part gives one row per attempt: the later of its own
// latest reward and its rollout's latest one posted without attempt_id
// (joined to each of the rollout's attempts), its own on a tie; -1 stands
// for a missing one's time.
const trainingSources = "SELECT rollout_id, attempt_id, count(*) AS calls, sum(CASE WHEN error != '' OR http_status >= 300 THEN 1 ELSE 0 END) AS failed," +
	" sum(CASE WHEN token_source IN ('engine', 'tokenize') AND token_check = '' AND error = '' AND http_status < 300 THEN 1 ELSE 0 END) AS verified," +
	" sum(prompt_tokens) AS pt, sum(completion_tokens) AS ct, max(task_id) AS task, 0 AS t0, max(start_time_unix_nano) AS t1, '' AS pv," +
	" '' AS st, '' AS grp, '' AS rtask, 0 AS upd, 1 AS seen, 0 AS tw, 0 AS hasrw, 0 AS reward FROM llm_calls GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT rollout_id, attempt_id, 0, 0, 0, 0, 0, '', min(start_time_unix_nano), 0, policy_version, '', '', '', 0, 1, 0, 0, 0 FROM llm_calls GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT rollout_id, attempt_id, 0, 0, 0, 0, 0, '', 0, 0, '', status, group_id, task_id, max(updated_unix_nano), 1, 0, 0, 0 FROM rollouts GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT rollout_id, attempt_id, 0, 0, 0, 0, 0, '', 0, 0, '', '', '', '', 0, 0, max(tw), 1," +
	" CASE WHEN max(CASE WHEN own = 1 THEN tw ELSE -1 END) >= max(CASE WHEN own = 0 THEN tw ELSE -1 END) THEN sum(own * value) ELSE sum((1 - own) * value) END" +
	" FROM (SELECT rollout_id, attempt_id, 1 AS own, max(time_unix_nano) AS tw, value FROM rewards" +
	" WHERE sequence_id = 0 AND name = 'primary' AND attempt_id != '' GROUP BY rollout_id, attempt_id" +
	" UNION ALL SELECT a.rollout_id, a.attempt_id, 0, w.tw, w.value FROM (SELECT rollout_id, attempt_id FROM llm_calls UNION SELECT rollout_id, attempt_id FROM rollouts) a" +
	" JOIN (SELECT rollout_id, max(time_unix_nano) AS tw, value FROM rewards WHERE sequence_id = 0 AND name = 'primary' AND attempt_id = '' GROUP BY rollout_id) w" +
	" ON w.rollout_id = a.rollout_id) GROUP BY rollout_id, attempt_id"

// TrainingSteps implements export.Store: one aggregate query.
func (s *Store) TrainingSteps(ctx context.Context, q export.TrainingQuery) ([]export.TrainingStep, error) {
	return export.ReadTrainingSteps(q, trainingSources, func(sql string) (*export.Result, error) { return s.Query(ctx, sql) })
}
