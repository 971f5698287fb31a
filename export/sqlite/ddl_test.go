package sqlite

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
)

// TestSchemaMatchesColumnTable: the tables a new file gets have exactly the
// column table's columns, in its order, with its SQLite types, NOT NULL and
// defaults.
func TestSchemaMatchesColumnTable(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "ddl.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tbl := range export.Tables() {
		rows, err := s.DB().Query("SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info(?) ORDER BY cid", tbl.Name)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var (
				name, typ, def string
				notNull        int
			)
			if err := rows.Scan(&name, &typ, &notNull, &def); err != nil {
				t.Fatal(err)
			}
			nn := ""
			if notNull == 1 {
				nn = " NOT NULL"
			}
			got = append(got, fmt.Sprintf("%s %s%s DEFAULT %s", name, typ, nn, def))
		}
		rows.Close()
		var want []string
		for _, c := range tbl.Columns {
			want = append(want, c.Name+" "+c.SQLiteDecl())
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the file has columns\n%q\nexport's column table says\n%q", tbl.Name, got, want)
		}
	}
}

// TestCallIndexes: llm_calls keeps one index, on the rollout, which a
// rollout's reads use; a file from before 2026-11-29 loses its span and
// attempt indexes on Open, and an index of the user's own stays.
func TestCallIndexes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE INDEX llm_calls_by_span ON llm_calls (span_id)",
		"CREATE INDEX llm_calls_by_attempt ON llm_calls (attempt_id)",
		"CREATE INDEX my_calls_by_span ON llm_calls (span_id)",
	} {
		if _, err := s.DB().Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got []string
	rows, err := s.DB().Query("SELECT name FROM pragma_index_list('llm_calls') ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			t.Fatal(err)
		}
		got = append(got, name)
	}
	rows.Close()
	if want := []string{"llm_calls_by_rollout", "my_calls_by_span"}; !slices.Equal(got, want) {
		t.Errorf("indexes of llm_calls after Open: %q, want %q", got, want)
	}
	where, args := export.CallKey{RolloutID: "r", AttemptID: "a", SequenceID: 1}.Conditions()
	var plan []string
	rows, err = s.DB().Query("EXPLAIN QUERY PLAN SELECT * FROM llm_calls WHERE "+where, args...)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id, parent, notused int
		var detail string
		if err := rows.Scan(&id, &parent, &notused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	rows.Close()
	if len(plan) != 1 || !strings.Contains(plan[0], "USING INDEX llm_calls_by_rollout") {
		t.Errorf("a call's read plans %q, want a search of llm_calls_by_rollout", plan)
	}
	var size int
	if err := s.DB().QueryRow("PRAGMA page_size").Scan(&size); err != nil || size != pageSize {
		t.Errorf("page_size = %d, %v; want %d", size, err, pageSize)
	}
	var pages int
	if err := s.DB().QueryRow("PRAGMA wal_autocheckpoint").Scan(&pages); err != nil || pages != walAutocheckpoint {
		t.Errorf("wal_autocheckpoint = %d, %v; want %d", pages, err, walAutocheckpoint)
	}
}
