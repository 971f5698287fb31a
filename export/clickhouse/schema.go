package clickhouse

import (
	"embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/rollgate/rollgate/export"
)

//go:embed sql/*.sql
var ddlFS embed.FS

// LLMCallsGranularity is the index_granularity of llm_calls (sql/llm_calls.sql
// and deploy/clickhouse/cluster.sql): rows per granule, the unit the server
// reads. See RenderDDL.
const LLMCallsGranularity = 1024

// tableOrder is the order in which the tables are created.
var tableOrder = []string{"llm_calls", "rewards", "rollouts", "agent_spans"}

// Version is a ClickHouse server version (major.minor.patch).
type Version struct {
	Major, Minor, Patch uint64
}

// String renders the version as "major.minor.patch".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v >= major.minor.
func (v Version) AtLeast(major, minor uint64) bool {
	return v.Major > major || v.Major == major && v.Minor >= minor
}

// Features are the storage features the schema uses, chosen from the server
// version by FeaturesFor.
type Features struct {
	// LowCardinality declares low-cardinality text columns (endpoint, model,
	// backend, token_source, finish_reason, ...) as LowCardinality(String).
	// Experimental and off by default before 19.3; plain String there.
	LowCardinality bool
	// Codecs adds per-column compression codecs (ZSTD for bodies and arrays,
	// DoubleDelta for times). Taken from 20.1, where all of them are stable.
	Codecs bool
	// TTL allows table TTL clauses (Options.TTLDays). Available from 19.6.
	TTL bool
}

// FeaturesFor returns the features a server of version v supports. The
// thresholds are conservative: the first release where the feature is enabled
// by default and not experimental.
func FeaturesFor(v Version) Features {
	return Features{
		LowCardinality: v.AtLeast(19, 3),
		Codecs:         v.AtLeast(20, 1),
		TTL:            v.AtLeast(19, 6),
	}
}

// ddlParams is what the .sql templates see.
type ddlParams struct {
	Database string
	TTLDays  int
	// TTL is true when a TTL clause is wanted and supported.
	TTL bool
}

// Table returns the quoted, database-qualified name of a table.
func (p ddlParams) Table(name string) string {
	return quoteIdent(p.Database) + "." + quoteIdent(name)
}

// RenderDDL renders the CREATE TABLE IF NOT EXISTS statements for every table
// (llm_calls, rewards, rollouts, agent_spans) in database db, using only the features in f.
// The templates in sql/ give each table's engine, partitioning, order and
// TTL; {{columns "table"}} lists its columns from export's column table.
// ttlDays > 0 adds a TTL clause when f.TTL; 0 means keep rows forever.
//
// llm_calls has granules of 1,024 rows (LLMCallsGranularity), not the
// usual 8,192: a row holds several KB of bodies and arrays, and a reader
// of some rollouts (the trainer bridge's chunks of 500, the viewer's one)
// decompresses every granule its ids touch. With 8,192-row granules a
// chunk of 2,500 calls read 3-6 times its own rows (150 ms of the server's
// time for the chunk on 18.16 against 12 ms with 1,024, bench/RESULTS.md
// §5f). ClickHouse cannot change a table's granularity after it is made,
// so tables created before keep 8,192 until they are recreated.
func RenderDDL(f Features, db string, ttlDays int) ([]string, error) {
	if err := checkIdent(db); err != nil {
		return nil, err
	}
	if ttlDays < 0 {
		return nil, fmt.Errorf("clickhouse schema: TTL days must be >= 0, got %d", ttlDays)
	}
	funcs := template.FuncMap{
		"lowCardinality": func() string {
			if f.LowCardinality {
				return "LowCardinality(String)"
			}
			return "String"
		},
		"codec": func(c string) string {
			if f.Codecs {
				return " CODEC(" + c + ")"
			}
			return ""
		},
		"columns": func(table string) (string, error) {
			return export.ColumnDefs(table, func(c export.ColumnInfo) string {
				return c.Name + " " + c.ClickHouseDecl(f.LowCardinality, f.Codecs)
			})
		},
	}
	p := ddlParams{Database: db, TTLDays: ttlDays, TTL: f.TTL && ttlDays > 0}
	stmts := make([]string, 0, len(tableOrder))
	for _, name := range tableOrder {
		src, err := ddlFS.ReadFile("sql/" + name + ".sql")
		if err != nil {
			return nil, fmt.Errorf("clickhouse schema: %w", err)
		}
		tmpl, err := template.New(name).Funcs(funcs).Option("missingkey=error").Parse(string(src))
		if err != nil {
			return nil, fmt.Errorf("clickhouse schema: parse %s.sql: %w", name, err)
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, p); err != nil {
			return nil, fmt.Errorf("clickhouse schema: render %s.sql: %w", name, err)
		}
		stmts = append(stmts, strings.TrimSpace(b.String()))
	}
	return stmts, nil
}

// checkIdent accepts the database names Open supports: ASCII letters, digits
// and '_', not starting with a digit.
func checkIdent(s string) error {
	if s == "" {
		return fmt.Errorf("clickhouse: empty database name")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return fmt.Errorf("clickhouse: database name %q: use only letters, digits and '_' (not first)", s)
	}
	return nil
}

func quoteIdent(s string) string { return "`" + strings.ReplaceAll(s, "`", "\\`") + "`" }
