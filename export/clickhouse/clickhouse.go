// Package clickhouse is the production store: the tables of docs/contract.md §3 in
// ClickHouse, written with native-protocol batch inserts
// (github.com/ClickHouse/clickhouse-go/v2) and read back for the gateway API
// and `rollgate sql`.
//
// The schema is created at Open (CREATE ... IF NOT EXISTS, from the embedded
// sql/*.sql templates) with the storage features the server supports
// (LowCardinality, codecs, TTL; see FeaturesFor). Servers as old as 18.16 work:
// they answer clickhouse-go's `INSERT ... FORMAT Native` batches with an empty
// header (so Append fails), so Open probes for that and falls back to sending the rows as a Native external
// table with `INSERT ... SELECT` (see InsertMode).
package clickhouse

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/rollgate/rollgate/export"
)

// Options tune the store. The zero value is ready to use.
type Options struct {
	// TTLDays makes the server drop rows older than this many days (llm_calls
	// by start time, rewards by time, rollouts by last update). 0 (default)
	// keeps rows forever. Applies only to tables Open creates, and only on
	// servers with TTL support (19.6+); older servers log a warning and keep rows.
	TTLDays int
	// ExternalInsert forces the external-table insert path even on servers
	// that accept native batch inserts. Default false: Open decides by probing.
	ExternalInsert bool
	// TextReads reads llm_calls through clickhouse-go with arrays formatted
	// as text by the server (toString), instead of the native reader
	// (native.go). Slower (the server formats every id), but it is the
	// driver's own protocol code: the store also falls back to it by itself
	// when the native reader fails for a reason other than a server error.
	TextReads bool
	// DialTimeout bounds connecting to the server. 0 keeps the DSN's
	// dial_timeout, or clickhouse-go's default (30 s).
	DialTimeout time.Duration
	// Logger receives warnings and the chosen features. nil means slog.Default().
	Logger *slog.Logger
}

// InsertMode is how Write sends rows to the server.
type InsertMode int

const (
	// InsertBatch uses PrepareBatch → Append → Send (INSERT ... FORMAT Native).
	InsertBatch InsertMode = iota
	// InsertExternal sends the rows as a Native external table and runs
	// INSERT INTO t (...) SELECT ... FROM it: still binary and columnar, and
	// accepted by servers (such as 18.16) that do not take INSERT ... FORMAT Native.
	InsertExternal
)

// String names the mode.
func (m InsertMode) String() string {
	if m == InsertExternal {
		return "external"
	}
	return "batch"
}

// Store is an export.Store backed by ClickHouse. It is safe for concurrent use.
type Store struct {
	// SQLReads are the typed reads (export.Reader): their values are bound
	// by bindArgs, the store's one escaper.
	*export.SQLReads
	conn     driver.Conn
	db       string
	version  Version
	features Features
	mode     InsertMode
	log      *slog.Logger
	native   *nativeReader // llm_calls reads (native.go)
	// textReads is set by Options.TextReads or after the native reader
	// failed at the protocol level: llm_calls are then read as text.
	textReads atomic.Bool
	// tables holds, per column list, a sync.Pool of the external tables
	// of finished inserts (InsertExternal), reused with their buffers.
	tables sync.Map
}

var _ export.Store = (*Store)(nil)

// Open connects to the server named by dsn (for example
// clickhouse://127.0.0.1:9000/rollgate; see clickhouse-go's DSN options),
// creates the database and the tables if they are missing, and picks the
// insert mode. The database defaults to "default" when the DSN names none.
func Open(ctx context.Context, dsn string, opt Options) (*Store, error) {
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	chOpts, db, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if opt.DialTimeout > 0 {
		chOpts.DialTimeout = opt.DialTimeout
	}

	// Bootstrap on the server's default database: the target may not exist yet.
	boot := *chOpts
	boot.Auth.Database = ""
	bootConn, err := clickhouse.Open(&boot)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: connect %v: %w", chOpts.Addr, err)
	}
	defer bootConn.Close()
	sv, err := bootConn.ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("clickhouse: connect %v: %w", chOpts.Addr, err)
	}
	version := Version{Major: sv.Version.Major, Minor: sv.Version.Minor, Patch: sv.Version.Patch}
	features := FeaturesFor(version)
	if opt.TTLDays > 0 && !features.TTL {
		log.Warn("clickhouse server has no TTL support; rows are kept forever", "version", version.String(), "ttl_days", opt.TTLDays)
	}
	stmts, err := RenderDDL(features, db, opt.TTLDays)
	if err != nil {
		return nil, err
	}
	if err := bootConn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+quoteIdent(db)); err != nil {
		return nil, fmt.Errorf("clickhouse: create database %s: %w", db, err)
	}
	for i, stmt := range stmts {
		if err := bootConn.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("clickhouse: create table %s.%s: %w", db, tableOrder[i], err)
		}
	}
	if err := migrate(ctx, bootConn, db); err != nil {
		return nil, err
	}

	chOpts.Auth.Database = db
	conn, err := clickhouse.Open(chOpts)
	if err != nil {
		return nil, fmt.Errorf("clickhouse: connect %v: %w", chOpts.Addr, err)
	}
	s := &Store{conn: conn, db: db, version: version, features: features, log: log, mode: InsertExternal, native: newNativeReader(chOpts, db)}
	s.textReads.Store(opt.TextReads)
	s.SQLReads = export.NewSQLReads(func(ctx context.Context, query string, args []any, f func(row []string) error) error {
		body, err := bindArgs(query, args)
		if err != nil {
			return fmt.Errorf("clickhouse: query: %w", err)
		}
		return s.queryEach(ctx, body, func([]string) {}, f)
	}, " FINAL", "GLOBAL IN", versionSQL)
	if !opt.ExternalInsert {
		ok, err := s.probeBatch(ctx)
		if err != nil {
			conn.Close()
			return nil, err
		}
		if ok {
			s.mode = InsertBatch
		}
	}
	log.Debug("clickhouse store ready", "database", db, "version", version.String(),
		"low_cardinality", features.LowCardinality, "codecs", features.Codecs, "ttl", features.TTL,
		"insert_mode", s.mode.String())
	return s, nil
}

// versionSQL is StoreVersion's query: the row counts, kept in the parts'
// metadata (an update of a rollout is an insert, and a merge that changes a
// count only costs the viewer one refresh).
const versionSQL = "SELECT (SELECT count() FROM llm_calls), (SELECT count() FROM rewards), (SELECT count() FROM rollouts)"

// probeBatch reports whether the server accepts PrepareBatch inserts: servers
// that do answer `INSERT INTO t FORMAT Native` with the table's columns; older
// ones (18.16) run it as an insert of no rows and answer with an empty header.
// The probe inserts nothing either way.
func (s *Store) probeBatch(ctx context.Context) (bool, error) {
	b, err := s.conn.PrepareBatch(ctx, "INSERT INTO rollouts")
	if err != nil {
		return false, fmt.Errorf("clickhouse: probe batch insert: %w", err)
	}
	n := len(b.Columns())
	_ = b.Abort()
	return n == len(export.RolloutTable.Columns), nil
}

// Name returns "clickhouse".
func (s *Store) Name() string { return "clickhouse" }

// Database is the database holding the tables.
func (s *Store) Database() string { return s.db }

// ServerVersion is the server's version as reported at Open.
func (s *Store) ServerVersion() Version { return s.version }

// Features are the storage features the schema was rendered with.
func (s *Store) Features() Features { return s.features }

// InsertMode is the insert path Write uses.
func (s *Store) InsertMode() InsertMode { return s.mode }

// Close releases the connections.
func (s *Store) Close() error {
	s.native.close()
	if err := s.conn.Close(); err != nil {
		return fmt.Errorf("clickhouse: close: %w", err)
	}
	return nil
}

// redact drops the password from a DSN for error messages.
func redact(dsn string) string {
	if i := strings.Index(dsn, "://"); i >= 0 {
		if at := strings.LastIndex(dsn, "@"); at > i {
			return dsn[:i+3] + "***@" + dsn[at+1:]
		}
	}
	return dsn
}

// migrate brings tables created by an older rollgate up to date: it walks
// export.Migrations and adds the columns a table lacks with ALTER TABLE ...
// ADD COLUMN ... AFTER the column before them in a new table, so an
// upgraded table has the layout of a new one (their defaults fill old
// rows). 18.16 has no ADD COLUMN IF NOT EXISTS: when another process added
// the column first, the ALTER fails and a second look at the columns finds
// it. A Distributed table (deploy/clickhouse/cluster.sql) is not altered:
// its _local tables need the column first, on every server.
func migrate(ctx context.Context, conn driver.Conn, db string) error {
	type table struct {
		have   map[string]bool
		engine string
	}
	tables := map[string]*table{}
	for _, m := range export.Migrations() {
		for _, a := range m.Adds {
			t := tables[a.Table]
			if t == nil {
				have, engine, err := tableColumns(ctx, conn, db, a.Table)
				if err != nil {
					return err
				}
				t = &table{have, engine}
				tables[a.Table] = t
			}
			if t.have[a.Column.Name] {
				continue
			}
			if err := addColumn(ctx, conn, db, a, t.engine); err != nil {
				return err
			}
			t.have[a.Column.Name] = true
		}
	}
	return nil
}

// addColumn adds the column a to db's table, whose engine is engine.
func addColumn(ctx context.Context, conn driver.Conn, db string, a export.ColumnAdd, engine string) error {
	c, table, prev := a.Column, a.Table, a.After
	if engine == "Distributed" {
		return fmt.Errorf("clickhouse: the Distributed table %s.%s has no column %s (created by an older rollgate): "+
			"add it to %s_local on the cluster first, then to %s on every server: ALTER TABLE %s.%s_local ON CLUSTER '{cluster}' ADD COLUMN %s %s%s; "+
			"then on each server ALTER TABLE %s.%s ADD COLUMN %s %s%s (see deploy/clickhouse/cluster.sql)",
			db, table, c.Name, table, table, db, table, c.Name, c.ClickHouseType(), afterClause(prev), db, table, c.Name, c.ClickHouseType(), afterClause(prev))
	}
	stmt := "ALTER TABLE " + quoteIdent(db) + "." + quoteIdent(table) + " ADD COLUMN " + quoteIdent(c.Name) + " " + c.ClickHouseType()
	if prev != "" {
		stmt += " AFTER " + quoteIdent(prev)
	}
	if err := conn.Exec(ctx, stmt); err != nil {
		if again, _, rerr := tableColumns(ctx, conn, db, table); rerr != nil || !again[c.Name] {
			return fmt.Errorf("clickhouse: adding column %s to %s.%s: %w", c.Name, db, table, err)
		}
	}
	return nil
}

// afterClause is " AFTER col", or "" when col is "".
func afterClause(col string) string {
	if col == "" {
		return ""
	}
	return " AFTER " + col
}

// tableColumns returns the column names of db.table and its engine.
func tableColumns(ctx context.Context, conn driver.Conn, db, table string) (map[string]bool, string, error) {
	var engine string
	if err := conn.QueryRow(ctx, "SELECT engine FROM system.tables WHERE database = ? AND name = ?", db, table).Scan(&engine); err != nil {
		return nil, "", fmt.Errorf("clickhouse: reading the engine of %s.%s: %w", db, table, err)
	}
	rows, err := conn.Query(ctx, "SELECT name FROM system.columns WHERE database = ? AND table = ?", db, table)
	if err != nil {
		return nil, "", fmt.Errorf("clickhouse: reading the columns of %s.%s: %w", db, table, err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, "", fmt.Errorf("clickhouse: reading the columns of %s.%s: %w", db, table, err)
		}
		have[name] = true
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("clickhouse: reading the columns of %s.%s: %w", db, table, err)
	}
	return have, engine, nil
}
