package clickhouse

import (
	"context"
	"fmt"
	"sync"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/column"

	"github.com/rollgate/rollgate/export"
)

// externalTable is the name of the external table the InsertExternal path sends.
const externalTable = "rollgate_rows"

// Write inserts the batch: one insert per non-empty table (llm_calls, then
// rewards, rollouts, agent_spans). Each insert is atomic on the server; the three are
// not atomic together, so an error may leave earlier tables written (a retry
// of the whole batch then duplicates those rows).
func (s *Store) Write(ctx context.Context, b *export.Batch) error {
	if b == nil {
		return nil
	}
	if err := writeRows(ctx, s, export.CallTable, b.Calls); err != nil {
		return err
	}
	if err := writeRows(ctx, s, export.RewardTable, b.Rewards); err != nil {
		return err
	}
	if err := writeRows(ctx, s, export.RolloutTable, b.Rollouts); err != nil {
		return err
	}
	return writeRows(ctx, s, export.SpanTable, b.Spans)
}

// writeRows inserts rows into tbl; no rows, no insert.
func writeRows[R any](ctx context.Context, s *Store, tbl *export.Table[R], rows []R) error {
	if len(rows) == 0 {
		return nil
	}
	var vals []any
	src := func(yield func([]any) error) error {
		for i := range rows {
			vals = appendValues(vals[:0], tbl.Columns, &rows[i])
			if err := yield(vals); err != nil {
				return err
			}
		}
		return nil
	}
	return s.insert(ctx, tbl.Name, tbl.Info(), src)
}

// rowSource feeds rows, one value slice per row in column order, to yield.
type rowSource func(yield func([]any) error) error

func (s *Store) insert(ctx context.Context, table string, cols []export.ColumnInfo, rows rowSource) error {
	var err error
	if s.mode == InsertExternal {
		err = s.insertExternal(ctx, table, cols, rows)
	} else {
		err = s.insertBatch(ctx, table, cols, rows)
	}
	if err != nil {
		return fmt.Errorf("clickhouse: insert into %s.%s: %w", s.db, table, err)
	}
	return nil
}

// insertBatch is PrepareBatch → Append → Send.
func (s *Store) insertBatch(ctx context.Context, table string, cols []export.ColumnInfo, rows rowSource) error {
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+quoteIdent(table)+" ("+names(cols)+")")
	if err != nil {
		return fmt.Errorf("prepare batch: %w", err)
	}
	if err := rows(func(v []any) error { return batch.Append(v...) }); err != nil {
		_ = batch.Abort()
		return fmt.Errorf("append: %w", err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// insertExternal sends the rows as the Native external table rollgate_rows
// and copies them with INSERT ... SELECT.
func (s *Store) insertExternal(ctx context.Context, table string, cols []export.ColumnInfo, rows rowSource) error {
	list := names(cols)
	tbl, err := s.takeTable(list, cols)
	if err != nil {
		return err
	}
	if err := rows(func(v []any) error { return tbl.Append(v...) }); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	query := "INSERT INTO " + quoteIdent(table) + " (" + list + ") SELECT " + list + " FROM " + externalTable
	if err := s.conn.Exec(clickhouse.Context(ctx, clickhouse.WithExternalTable(tbl)), query); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	s.giveTable(list, tbl)
	return nil
}

// takeTable returns an empty external table with the columns cols (named
// list): one a finished insert gave back, whose column buffers keep their
// size, or a new one. Building a 1,000-call block in new buffers copied
// each column's bytes again at every doubling of its buffer.
func (s *Store) takeTable(list string, cols []export.ColumnInfo) (*ext.Table, error) {
	if p, ok := s.tables.Load(list); ok {
		if t, _ := p.(*sync.Pool).Get().(*ext.Table); t != nil {
			t.Block().Reset()
			return t, nil
		}
	}
	return newExternalTable(cols)
}

// giveTable keeps tbl, whose insert was sent, for the next insert of the
// same columns. The pool lets go of it at the GC after next if no insert
// takes it, so an idle gateway does not keep a batch's buffers.
func (s *Store) giveTable(list string, tbl *ext.Table) {
	p, _ := s.tables.LoadOrStore(list, &sync.Pool{})
	p.(*sync.Pool).Put(tbl)
}

// newExternalTable is an empty external table (externalTable) with the
// columns cols.
func newExternalTable(cols []export.ColumnInfo) (*ext.Table, error) {
	defs := make([]func(*ext.Table) error, len(cols))
	for i, c := range cols {
		defs[i] = ext.Column(c.Name, column.Type(c.ClickHouseType()))
	}
	tbl, err := ext.NewTable(externalTable, defs...)
	if err != nil {
		return nil, fmt.Errorf("external table: %w", err)
	}
	return tbl, nil
}
