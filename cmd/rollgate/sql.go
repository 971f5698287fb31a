package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/stores"
)

const sqlSummary = `rollgate sql — run a SQL query on the configured store and print a table.

  rollgate sql "SELECT rollout_id, sequence_id, finish_reason, token_source FROM llm_calls"
  rollgate sql --clickhouse clickhouse://127.0.0.1:9000/rollgate "SELECT count() FROM llm_calls"

Tables: llm_calls, rewards, rollouts (columns in docs/contract.md §3). The embedded store is
SQLite (arrays are JSON text); ClickHouse uses its own SQL dialect.`

func runSQL(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("sql", sqlSummary, stdout)
	clickhouseDSN := fs.String("clickhouse", "", "ClickHouse DSN (empty = embedded store)")
	dbPath := fs.String("db", defaultDB, "embedded SQLite store path, used when --clickhouse is empty")
	timeout := fs.Duration("timeout", time.Minute, "query timeout")
	_, err := parseWithEnv(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "rollgate sql:", err)
		return 2
	}
	query := strings.TrimSpace(strings.Join(fs.Args(), " "))
	if query == "" {
		fmt.Fprintln(stderr, `rollgate sql: no query given, e.g. rollgate sql "SELECT count(*) FROM llm_calls"`)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	store, err := stores.Open(ctx, *clickhouseDSN, *dbPath)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate sql: opening store:", err)
		return 1
	}
	defer store.Close()
	res, err := store.Query(ctx, query)
	if err != nil {
		fmt.Fprintln(stderr, "rollgate sql:", err)
		return 1
	}
	if err := export.WriteTable(stdout, res); err != nil {
		fmt.Fprintln(stderr, "rollgate sql:", err)
		return 1
	}
	return 0
}
