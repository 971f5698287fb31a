package sqlite

import (
	"fmt"
	"path/filepath"
	"slices"
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
