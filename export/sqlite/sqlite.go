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
	"strconv"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/rollgate/rollgate/export"
)

//go:embed schema.sql
var schemaSQL string

// BusyTimeout is how long a statement waits for another connection or
// process holding the write lock before failing with SQLITE_BUSY.
const BusyTimeout = 10 * time.Second

// Store is an export.Store in a SQLite file. It is safe for concurrent use,
// and several processes may open the same file.
type Store struct {
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
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("sqlite: create folder for %s: %w", path, err)
		}
	}
	dsn := "file:" + escapePath(path) +
		"?_busy_timeout=" + strconv.FormatInt(BusyTimeout.Milliseconds(), 10) +
		"&_journal_mode=WAL&_synchronous=NORMAL&_txlock=immediate"
	// Page size and page cache stay SQLite's defaults (4 KiB, 2 MiB), as
	// measured with BenchmarkWriteBatch (µs per stored row, on a new file /
	// after ROLLGATE_BENCH_PREFILL=1000000 rows): 4 KiB pages 84 / 146;
	// 16 KiB 63 / 185; 64 KiB 46 / 223 (a commit rewrites every index page
	// it touched, and span, rollout and attempt ids are random, so large
	// pages multiply those bytes once the indexes are large); a 16 MiB cache
	// 84 / 136, but 33 MiB more peak RSS in the gateway.
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	if _, err := db.Exec(schemaSQL); err != nil {
		db.Close()
		return nil, fmt.Errorf("sqlite: create tables in %s: %w", path, err)
	}
	for _, t := range []struct {
		name string
		cols [][2]string
	}{{"llm_calls", addedCallColumns}, {"rollouts", addedRolloutColumns}} {
		if err := addMissingColumns(db, t.name, t.cols); err != nil {
			db.Close()
			return nil, fmt.Errorf("sqlite: upgrading %s: %w", path, err)
		}
	}
	return &Store{db: db, path: path}, nil
}

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

var (
	callColumns = []string{
		"span_id", "trace_id", "rollout_id", "attempt_id", "task_id", "agent_name",
		"sequence_id", "choice_index", "start_time_unix_nano", "end_time_unix_nano", "ttft_nano",
		"endpoint", "model", "backend", "policy_version", "stream", "http_status",
		"error", "request_body", "response_body", "response_message",
		"prompt_token_ids", "response_token_ids", "response_logprobs",
		"token_source", "token_check", "finish_reason", "prompt_tokens", "completion_tokens",
		"turn_kind", "turn_prefix_len", "turn_prev_sequence_id", "api_key_name",
	}
	rewardColumns  = []string{"rollout_id", "attempt_id", "sequence_id", "name", "value", "source", "time_unix_nano"}
	rolloutColumns = []string{"rollout_id", "attempt_id", "task_id", "group_id", "status", "metadata", "created_unix_nano", "updated_unix_nano"}

	insertCall   = insertSQL("llm_calls", callColumns)
	insertReward = insertSQL("rewards", rewardColumns)
	spanColumns  = []string{"rollout_id", "attempt_id", "trace_id", "span_id", "parent_span_id", "name", "kind",
		"service_name", "tool_name", "tool_call_id", "status_code", "status_message", "start_time_unix_nano",
		"end_time_unix_nano", "attributes", "received_unix_nano"}
	insertSpan = insertSQL("agent_spans", spanColumns)
	// The latest row per (rollout, attempt) wins; equal times: the later write.
	insertRollout = insertSQL("rollouts", rolloutColumns) +
		" ON CONFLICT (rollout_id, attempt_id) DO UPDATE SET" +
		" task_id = excluded.task_id, group_id = excluded.group_id, status = excluded.status, metadata = excluded.metadata," +
		" created_unix_nano = excluded.created_unix_nano, updated_unix_nano = excluded.updated_unix_nano" +
		" WHERE excluded.updated_unix_nano >= rollouts.updated_unix_nano"
)

func insertSQL(table string, cols []string) string {
	return "INSERT INTO " + table + " (" + strings.Join(cols, ", ") + ") VALUES (" +
		strings.TrimSuffix(strings.Repeat("?, ", len(cols)), ", ") + ")"
}

// i64 stores a uint64 in an INTEGER column; the bits round-trip through u64.
func i64(v uint64) int64 { return int64(v) }
func u64(v int64) uint64 { return uint64(v) }

// Write stores the batch in one transaction: all of it or none.
func (s *Store) Write(ctx context.Context, b *export.Batch) error {
	if b == nil || b.Len() == 0 {
		return nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
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
	if len(b.Calls) > 0 {
		stmt, err := tx.PrepareContext(ctx, insertCall)
		if err != nil {
			return fmt.Errorf("sqlite: insert into llm_calls: %w", err)
		}
		defer stmt.Close()
		var buf []byte
		for i := range b.Calls {
			c := &b.Calls[i]
			buf = arrays.AppendUint32s(buf[:0], c.PromptTokenIDs)
			prompt := string(buf)
			buf = arrays.AppendUint32s(buf[:0], c.ResponseTokenIDs)
			resp := string(buf)
			buf = arrays.AppendFloat32s(buf[:0], c.ResponseLogprobs)
			logprobs := string(buf)
			stream := 0
			if c.Stream {
				stream = 1
			}
			if _, err := stmt.ExecContext(ctx,
				c.SpanID, c.TraceID, c.RolloutID, c.AttemptID, c.TaskID, c.AgentName,
				i64(c.SequenceID), int64(c.ChoiceIndex), i64(c.StartTimeUnixNano), i64(c.EndTimeUnixNano), i64(c.TTFTNano),
				c.Endpoint, c.Model, c.Backend, c.PolicyVersion, stream, int64(c.HTTPStatus),
				c.Error, c.RequestBody, c.ResponseBody, c.ResponseMessage,
				prompt, resp, logprobs,
				c.TokenSource, c.TokenCheck, c.FinishReason, int64(c.PromptTokens), int64(c.CompletionTokens),
				c.TurnKind, int64(c.TurnPrefixLen), i64(c.TurnPrevSequenceID), c.APIKeyName,
			); err != nil {
				return fmt.Errorf("sqlite: insert into llm_calls (span %q): %w", c.SpanID, err)
			}
		}
	}
	if len(b.Rewards) > 0 {
		stmt, err := tx.PrepareContext(ctx, insertReward)
		if err != nil {
			return fmt.Errorf("sqlite: insert into rewards: %w", err)
		}
		defer stmt.Close()
		for _, r := range b.Rewards {
			if _, err := stmt.ExecContext(ctx, r.RolloutID, r.AttemptID, i64(r.SequenceID), r.Name, r.Value, r.Source, i64(r.TimeUnixNano)); err != nil {
				return fmt.Errorf("sqlite: insert into rewards: %w", err)
			}
		}
	}
	if len(b.Spans) > 0 {
		stmt, err := tx.PrepareContext(ctx, insertSpan)
		if err != nil {
			return fmt.Errorf("sqlite: insert into agent_spans: %w", err)
		}
		defer stmt.Close()
		for _, sp := range b.Spans {
			if _, err := stmt.ExecContext(ctx, sp.RolloutID, sp.AttemptID, sp.TraceID, sp.SpanID, sp.ParentSpanID,
				sp.Name, sp.Kind, sp.ServiceName, sp.ToolName, sp.ToolCallID, sp.StatusCode, sp.StatusMessage,
				i64(sp.StartTimeUnixNano), i64(sp.EndTimeUnixNano), sp.Attributes, i64(sp.ReceivedUnixNano)); err != nil {
				return fmt.Errorf("sqlite: insert into agent_spans (span %q): %w", sp.SpanID, err)
			}
		}
	}
	if len(b.Rollouts) > 0 {
		stmt, err := tx.PrepareContext(ctx, insertRollout)
		if err != nil {
			return fmt.Errorf("sqlite: insert into rollouts: %w", err)
		}
		defer stmt.Close()
		for _, r := range b.Rollouts {
			if _, err := stmt.ExecContext(ctx, r.RolloutID, r.AttemptID, r.TaskID, r.GroupID, r.Status, r.Metadata, i64(r.CreatedUnixNano), i64(r.UpdatedUnixNano)); err != nil {
				return fmt.Errorf("sqlite: insert into rollouts: %w", err)
			}
		}
	}
	return nil
}

// Query runs ad-hoc SQL and renders every value as text: integers and
// floats in their shortest exact form, NULL as "NULL", arrays as the JSON
// text they are stored as ([1,2,3]).
func (s *Store) Query(ctx context.Context, query string) (*export.Result, error) {
	rows, err := s.db.QueryContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("sqlite: query: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("sqlite: query: %w", err)
	}
	res := &export.Result{Columns: cols}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("sqlite: query: scan: %w", err)
		}
		row := make([]string, len(cols))
		for i, v := range vals {
			row[i] = renderValue(v)
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: query: %w", err)
	}
	return res, nil
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
	var (
		where []string
		args  []any
	)
	if f.RolloutID != "" {
		where, args = append(where, "rollout_id = ?"), append(args, f.RolloutID)
	}
	if f.AttemptID != "" {
		where, args = append(where, "attempt_id = ?"), append(args, f.AttemptID)
	}
	if f.SpanID != "" {
		where, args = append(where, "span_id = ?"), append(args, f.SpanID)
	}
	q := "SELECT " + strings.Join(callColumns, ", ") + " FROM llm_calls"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY rollout_id, attempt_id, sequence_id, choice_index, span_id"
	if f.Limit > 0 {
		q += " LIMIT " + strconv.Itoa(f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read llm_calls: %w", err)
	}
	defer rows.Close()
	var out []export.Call
	for rows.Next() {
		var (
			c                                   export.Call
			seq, start, end, ttft               int64
			choice, status, promptTok, complTok int64
			turnPrefix, turnPrev                int64
			stream                              int64
			promptIDs, respIDs, logprobs        string
		)
		if err := rows.Scan(&c.SpanID, &c.TraceID, &c.RolloutID, &c.AttemptID, &c.TaskID, &c.AgentName,
			&seq, &choice, &start, &end, &ttft,
			&c.Endpoint, &c.Model, &c.Backend, &c.PolicyVersion, &stream, &status,
			&c.Error, &c.RequestBody, &c.ResponseBody, &c.ResponseMessage,
			&promptIDs, &respIDs, &logprobs,
			&c.TokenSource, &c.TokenCheck, &c.FinishReason, &promptTok, &complTok,
			&c.TurnKind, &turnPrefix, &turnPrev, &c.APIKeyName); err != nil {
			return nil, fmt.Errorf("sqlite: read llm_calls: %w", err)
		}
		c.SequenceID, c.ChoiceIndex = u64(seq), uint32(choice)
		c.StartTimeUnixNano, c.EndTimeUnixNano, c.TTFTNano = u64(start), u64(end), u64(ttft)
		c.Stream, c.HTTPStatus = stream != 0, uint16(status)
		c.PromptTokens, c.CompletionTokens = uint32(promptTok), uint32(complTok)
		c.TurnPrefixLen, c.TurnPrevSequenceID = uint32(turnPrefix), u64(turnPrev)
		if c.PromptTokenIDs, err = arrays.ParseUint32s(promptIDs); err != nil {
			return nil, fmt.Errorf("sqlite: read llm_calls: span %q prompt_token_ids: %w", c.SpanID, err)
		}
		if c.ResponseTokenIDs, err = arrays.ParseUint32s(respIDs); err != nil {
			return nil, fmt.Errorf("sqlite: read llm_calls: span %q response_token_ids: %w", c.SpanID, err)
		}
		if c.ResponseLogprobs, err = arrays.ParseFloat32s(logprobs); err != nil {
			return nil, fmt.Errorf("sqlite: read llm_calls: span %q response_logprobs: %w", c.SpanID, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read llm_calls: %w", err)
	}
	return out, nil
}

// Rollout reads the rollout's attempts (one row each, the latest), its
// calls and its rewards. An unknown rollout gives an empty detail, not an error.
func (s *Store) Rollout(ctx context.Context, rolloutID string) (*export.RolloutDetail, error) {
	d := &export.RolloutDetail{}
	rows, err := s.db.QueryContext(ctx, "SELECT "+strings.Join(rolloutColumns, ", ")+
		" FROM rollouts WHERE rollout_id = ? ORDER BY attempt_id", rolloutID)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read rollouts: %w", err)
	}
	for rows.Next() {
		var (
			r                export.Rollout
			created, updated int64
		)
		if err := rows.Scan(&r.RolloutID, &r.AttemptID, &r.TaskID, &r.GroupID, &r.Status, &r.Metadata, &created, &updated); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sqlite: read rollouts: %w", err)
		}
		r.CreatedUnixNano, r.UpdatedUnixNano = u64(created), u64(updated)
		d.Attempts = append(d.Attempts, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read rollouts: %w", err)
	}

	if d.Calls, err = s.Calls(ctx, export.CallFilter{RolloutID: rolloutID}); err != nil {
		return nil, err
	}

	rows, err = s.db.QueryContext(ctx, "SELECT "+strings.Join(rewardColumns, ", ")+
		" FROM rewards WHERE rollout_id = ? ORDER BY attempt_id, sequence_id, time_unix_nano, name", rolloutID)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read rewards: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r         export.Reward
			seq, tnow int64
		)
		if err := rows.Scan(&r.RolloutID, &r.AttemptID, &seq, &r.Name, &r.Value, &r.Source, &tnow); err != nil {
			return nil, fmt.Errorf("sqlite: read rewards: %w", err)
		}
		r.SequenceID, r.TimeUnixNano = u64(seq), u64(tnow)
		d.Rewards = append(d.Rewards, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read rewards: %w", err)
	}
	return d, nil
}

// addedCallColumns are the llm_calls columns added after the first schema,
// with their declarations, in the order they were added.
var addedCallColumns = [][2]string{
	{"turn_kind", "TEXT NOT NULL DEFAULT ''"},
	{"turn_prefix_len", "INTEGER NOT NULL DEFAULT 0"},
	{"turn_prev_sequence_id", "INTEGER NOT NULL DEFAULT 0"},
	{"api_key_name", "TEXT NOT NULL DEFAULT ''"},
}

// addedRolloutColumns are the rollouts columns added after the first schema,
// as addedCallColumns. An upgraded table has them last (SQLite appends).
var addedRolloutColumns = [][2]string{
	{"group_id", "TEXT NOT NULL DEFAULT ''"},
}

// addMissingColumns brings a table created by an older rollgate up to date.
func addMissingColumns(db *sql.DB, table string, cols [][2]string) error {
	rows, err := db.Query("SELECT name FROM pragma_table_info(?)", table)
	if err != nil {
		return fmt.Errorf("reading the columns of %s: %w", table, err)
	}
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return fmt.Errorf("reading the columns of %s: %w", table, err)
		}
		have[name] = true
	}
	rows.Close()
	for _, c := range cols {
		if have[c[0]] {
			continue
		}
		if _, err := db.Exec("ALTER TABLE " + table + " ADD COLUMN " + c[0] + " " + c[1]); err != nil {
			return fmt.Errorf("adding column %s to %s: %w", c[0], table, err)
		}
	}
	return nil
}
