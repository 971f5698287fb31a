package export

import (
	"fmt"
	"strings"
)

// The column table: every stored column of llm_calls, rewards, rollouts and
// agent_spans is declared once, in row.go next to its row type's field
// (CallTable, RewardTable, RolloutTable, SpanTable). The ClickHouse and
// SQLite stores derive from it their DDL column lists, the upgrade of
// tables created by an older release, the insert values and the scan
// destinations; the spool codec (capture/spool) its field order and
// payload version.
//
// Adding a column: add the field to the row type and its Col to the table
// (in row.go), where it should sit in the tables (usually last); give it
// Since(n) with n one more than the table's current highest spool version
// (SpoolVersion) so that spool files of the previous release still decode;
// add it to deploy/clickhouse/cluster.sql (a test compares that file with
// the table) and describe it in docs/contract.md §3.

// ColumnType is how a column's value is held in its row's Go field, which
// fixes how each store keeps it.
type ColumnType uint8

// Column types: the Go field, then the ClickHouse and SQLite types.
const (
	TypeString   ColumnType = iota // string: String (or LowCardinality(String)), TEXT
	TypeUint64                     // uint64: UInt64, INTEGER (the bits as int64)
	TypeUint32                     // uint32: UInt32, INTEGER
	TypeUint16                     // uint16: UInt16, INTEGER
	TypeBool                       // bool: UInt8 0/1, INTEGER 0/1
	TypeFloat64                    // float64: Float64, REAL
	TypeUint32s                    // []uint32: Array(UInt32), TEXT as a JSON array (package arrays)
	TypeFloat32s                   // []float32: Array(Float32), TEXT as a JSON array (package arrays)
)

// ColumnInfo is a column without its accessor: what DDL, upgrades and the
// tests that check the DDL files need.
type ColumnInfo struct {
	// Name is the column's name in both stores.
	Name string
	// Type is the Go type of the row's field (from Col's accessor).
	Type ColumnType
	// LowCardinality declares a TypeString column LowCardinality(String) on
	// ClickHouse servers that support it (Features.LowCardinality).
	LowCardinality bool
	// Codec is the ClickHouse compression codec ("ZSTD(3)"), used on
	// servers with Features.Codecs; "" for none.
	Codec string
	// SQLiteDefault is the SQLite DEFAULT clause's value; "" is the type's
	// zero ('' for text, 0 for numbers, '[]' for arrays).
	SQLiteDefault string
	// Since is the first spool payload version (capture/spool) that carries
	// the column; 1 for the columns of the first release.
	Since byte
	// SpoolOnly marks a field that travels through the spool, to sinks that
	// read it (OTLP), but is not a stored column.
	SpoolOnly bool
}

// ClickHouseType is the column's plain ClickHouse type, as inserts send it
// and upgrades add it: LowCardinality and codecs left out.
func (c ColumnInfo) ClickHouseType() string {
	switch c.Type {
	case TypeString:
		return "String"
	case TypeUint64:
		return "UInt64"
	case TypeUint32:
		return "UInt32"
	case TypeUint16:
		return "UInt16"
	case TypeBool:
		return "UInt8"
	case TypeFloat64:
		return "Float64"
	case TypeUint32s:
		return "Array(UInt32)"
	case TypeFloat32s:
		return "Array(Float32)"
	}
	panic(fmt.Sprintf("export: column %s: unknown type %d", c.Name, c.Type))
}

// ClickHouseDecl is the column's type in CREATE TABLE on a server with the
// given features: LowCardinality(String) when lowCardinality and the column
// is low-cardinality, then " CODEC(...)" when codecs and it has one.
func (c ColumnInfo) ClickHouseDecl(lowCardinality, codecs bool) string {
	t := c.ClickHouseType()
	if lowCardinality && c.LowCardinality {
		t = "LowCardinality(String)"
	}
	if codecs && c.Codec != "" {
		t += " CODEC(" + c.Codec + ")"
	}
	return t
}

// SQLiteDecl is the column's declaration in SQLite's CREATE TABLE and ALTER
// TABLE ... ADD COLUMN: type, NOT NULL and default.
func (c ColumnInfo) SQLiteDecl() string {
	t, def := "TEXT", "''"
	switch c.Type {
	case TypeUint64, TypeUint32, TypeUint16, TypeBool:
		t, def = "INTEGER", "0"
	case TypeFloat64:
		t, def = "REAL", "0"
	case TypeUint32s, TypeFloat32s:
		def = "'[]'"
	}
	if c.SQLiteDefault != "" {
		def = c.SQLiteDefault
	}
	return t + " NOT NULL DEFAULT " + def
}

// Column is one column of a table of rows R: its description and the
// accessor of its field.
type Column[R any] struct {
	ColumnInfo
	// Field returns a pointer to the column's field in *R (a *string,
	// *uint64, *uint32, *uint16, *bool, *float64, *[]uint32 or *[]float32,
	// as Type says), for reading and for writing it.
	Field func(*R) any
}

// ColOption sets an optional property of a column in Col.
type ColOption func(*ColumnInfo)

// LowCard declares the column LowCardinality(String) where ClickHouse supports it.
func LowCard(c *ColumnInfo) { c.LowCardinality = true }

// Codec gives the column a ClickHouse compression codec, for example "ZSTD(3)".
func Codec(codec string) ColOption { return func(c *ColumnInfo) { c.Codec = codec } }

// SQLiteDefault sets the SQLite DEFAULT value (SQL text, for example "'{}'").
func SQLiteDefault(v string) ColOption { return func(c *ColumnInfo) { c.SQLiteDefault = v } }

// Since says which spool payload version first carried the column.
func Since(version byte) ColOption { return func(c *ColumnInfo) { c.Since = version } }

// SpoolOnly marks a field that the spool carries but no store keeps.
func SpoolOnly(c *ColumnInfo) { c.SpoolOnly = true }

// Col declares a column named name whose field field returns; its type is
// that of the field.
func Col[R any](name string, field func(*R) any, opts ...ColOption) Column[R] {
	c := Column[R]{ColumnInfo: ColumnInfo{Name: name, Since: 1}, Field: field}
	switch p := field(new(R)); p.(type) {
	case *string:
		c.Type = TypeString
	case *uint64:
		c.Type = TypeUint64
	case *uint32:
		c.Type = TypeUint32
	case *uint16:
		c.Type = TypeUint16
	case *bool:
		c.Type = TypeBool
	case *float64:
		c.Type = TypeFloat64
	case *[]uint32:
		c.Type = TypeUint32s
	case *[]float32:
		c.Type = TypeFloat32s
	default:
		panic(fmt.Sprintf("export: column %s: field of unsupported type %T", name, p))
	}
	for _, o := range opts {
		o(&c.ColumnInfo)
	}
	return c
}

// Table is the column table of one stored table.
type Table[R any] struct {
	// Name is the table's name in both stores.
	Name string
	// Spool is every field the spool carries, in its encoding order: the
	// stored columns and the SpoolOnly fields.
	Spool []Column[R]
	// Columns are the stored columns in table order (Spool without the
	// SpoolOnly fields).
	Columns []Column[R]
}

// NewTable builds the table name from its fields in spool order.
func NewTable[R any](name string, cols ...Column[R]) *Table[R] {
	t := &Table[R]{Name: name, Spool: cols}
	for _, c := range cols {
		if !c.SpoolOnly {
			t.Columns = append(t.Columns, c)
		}
	}
	return t
}

// Info describes the stored columns, in table order.
func (t *Table[R]) Info() []ColumnInfo {
	out := make([]ColumnInfo, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.ColumnInfo
	}
	return out
}

// Names joins the stored columns' names with ", ".
func (t *Table[R]) Names() string {
	s := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		s[i] = c.Name
	}
	return strings.Join(s, ", ")
}

// TableInfo is a stored table's name and columns.
type TableInfo struct {
	Name    string
	Columns []ColumnInfo
}

// Tables lists the stored tables in the order the stores create them:
// llm_calls, rewards, rollouts, agent_spans.
func Tables() []TableInfo {
	return []TableInfo{
		{CallTable.Name, CallTable.Info()},
		{RewardTable.Name, RewardTable.Info()},
		{RolloutTable.Name, RolloutTable.Info()},
		{SpanTable.Name, SpanTable.Info()},
	}
}

// TableByName returns the stored table called name, or false.
func TableByName(name string) (TableInfo, bool) {
	for _, t := range Tables() {
		if t.Name == name {
			return t, true
		}
	}
	return TableInfo{}, false
}

// ColumnDefs returns the column definitions of table for a CREATE TABLE
// statement: one line per column, line(c) indented by four spaces, joined
// with ",\n". The stores' DDL templates call it as {{columns "table"}}.
func ColumnDefs(table string, line func(ColumnInfo) string) (string, error) {
	t, ok := TableByName(table)
	if !ok {
		return "", fmt.Errorf("no table %q in export's column table", table)
	}
	lines := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		lines[i] = "    " + line(c)
	}
	return strings.Join(lines, ",\n"), nil
}

// SpoolVersion is the spool payload version that carries every field: the
// highest Since of all tables.
func SpoolVersion() byte {
	v := byte(1)
	for _, since := range [][]byte{sinces(CallTable), sinces(RewardTable), sinces(RolloutTable), sinces(SpanTable)} {
		for _, s := range since {
			v = max(v, s)
		}
	}
	return v
}

func sinces[R any](t *Table[R]) []byte {
	out := make([]byte, len(t.Spool))
	for i, c := range t.Spool {
		out[i] = c.Since
	}
	return out
}

// Conditions returns the WHERE conditions (joined with AND) and their
// arguments that select the llm_calls rows f matches, with ? placeholders;
// "" when f matches every row.
func (f CallFilter) Conditions() (string, []any) {
	var (
		where []string
		args  []any
	)
	for _, c := range []struct{ col, v string }{{"rollout_id", f.RolloutID}, {"attempt_id", f.AttemptID}, {"span_id", f.SpanID}} {
		if c.v != "" {
			where, args = append(where, c.col+" = ?"), append(args, c.v)
		}
	}
	if f.FromSequence > 0 {
		where, args = append(where, "sequence_id >= ?"), append(args, f.FromSequence)
	}
	return strings.Join(where, " AND "), args
}

// SelectList is the select list of cols with the columns omit names read
// as empty strings (text columns only: the request and response bodies).
func SelectList[R any](cols []Column[R], omit func(string) bool) string {
	var b strings.Builder
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		if omit != nil && omit(c.Name) {
			b.WriteString("'' AS " + c.Name)
		} else {
			b.WriteString(c.Name)
		}
	}
	return b.String()
}

// Omits reports whether o leaves the llm_calls column out of a read.
func (o ReadOptions) Omits(column string) bool {
	return column == "request_body" && o.NoRequestBody || column == "response_body" && o.NoResponseBody
}
