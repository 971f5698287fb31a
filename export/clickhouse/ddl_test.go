package clickhouse

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// ddlColumns returns, per table, the column lines ("name type") of every
// CREATE TABLE statement in sql whose table name matches re's first group.
func ddlColumns(t *testing.T, sql string, re *regexp.Regexp) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, m := range re.FindAllStringSubmatchIndex(sql, -1) {
		table := sql[m[2]:m[3]]
		body := sql[m[1]:]
		end := strings.Index(body, "\n)")
		if end < 0 {
			t.Fatalf("CREATE TABLE %s: no closing parenthesis", table)
		}
		for _, line := range strings.Split(strings.TrimSpace(body[:end]), "\n") {
			line = strings.TrimSuffix(strings.TrimSpace(line), ",")
			if line != "" {
				out[table] = append(out[table], line)
			}
		}
	}
	return out
}

// wantColumns is the "name type" list of every table per export's column
// table, with decl giving the type.
func wantColumns(decl func(export.ColumnInfo) string) map[string][]string {
	out := map[string][]string{}
	for _, tbl := range export.Tables() {
		for _, c := range tbl.Columns {
			out[tbl.Name] = append(out[tbl.Name], c.Name+" "+decl(c))
		}
	}
	return out
}

func checkColumns(t *testing.T, where string, got, want map[string][]string) {
	t.Helper()
	for table, w := range want {
		if g := got[table]; !slices.Equal(g, w) {
			t.Errorf("%s: table %s has columns\n%s\nexport's column table says\n%s", where, table, strings.Join(g, "\n"), strings.Join(w, "\n"))
		}
	}
	for table := range got {
		if _, ok := want[table]; !ok {
			t.Errorf("%s: table %s is not in export's column table", where, table)
		}
	}
}

// TestDDLMatchesColumnTable: the embedded DDL, rendered for every feature
// set, declares exactly the column table's columns, in its order, with its
// types, LowCardinality and codecs.
func TestDDLMatchesColumnTable(t *testing.T) {
	re := regexp.MustCompile("CREATE TABLE IF NOT EXISTS `db`\\.`(\\w+)` \\(\n")
	for _, f := range []Features{{}, {LowCardinality: true}, {LowCardinality: true, TTL: true}, {LowCardinality: true, Codecs: true, TTL: true}} {
		stmts, err := RenderDDL(f, "db", 30)
		if err != nil {
			t.Fatal(err)
		}
		got := ddlColumns(t, strings.Join(stmts, "\n"), re)
		want := wantColumns(func(c export.ColumnInfo) string { return c.ClickHouseDecl(f.LowCardinality, f.Codecs) })
		checkColumns(t, "RenderDDL", got, want)
	}
}

// TestClusterSQLMatchesColumnTable: deploy/clickhouse/cluster.sql's
// _local tables have the column table's columns with their plain types
// (the file runs on every server from 18.16: no LowCardinality, no codecs),
// and each Distributed table takes its _local table's columns.
func TestClusterSQLMatchesColumnTable(t *testing.T) {
	b, err := os.ReadFile("../../deploy/clickhouse/cluster.sql")
	if err != nil {
		t.Fatal(err)
	}
	sql := string(b)
	got := ddlColumns(t, sql, regexp.MustCompile(`CREATE TABLE IF NOT EXISTS rollgate\.(\w+)_local ON CLUSTER '\{cluster\}' \(`+"\n"))
	checkColumns(t, "deploy/clickhouse/cluster.sql", got, wantColumns(export.ColumnInfo.ClickHouseType))
	for _, tbl := range export.Tables() {
		as := "CREATE TABLE IF NOT EXISTS rollgate." + tbl.Name + " ON CLUSTER '{cluster}' AS rollgate." + tbl.Name + "_local\n"
		if !strings.Contains(sql, as) {
			t.Errorf("deploy/clickhouse/cluster.sql lacks %q", as)
		}
	}
}
