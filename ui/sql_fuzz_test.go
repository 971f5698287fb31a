package ui

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/rollgate/rollgate/export/sqlite"
)

// FuzzLiteral checks that every filter value checkValue accepts reaches
// SQLite as exactly that string: a quoted literal can never end early and
// splice SQL (ClickHouse's quoting is checked by the filter tests, which run
// quotes and backslashes through both stores).
func FuzzLiteral(f *testing.F) {
	for _, s := range []string{"", "plain", "it's", `back\slash`, `'; DROP TABLE llm_calls; --`, "\\'", "ünï€😀", "a\nb\tc\r", "''''"} {
		f.Add(s)
	}
	st, err := sqlite.Open(filepath.Join(f.TempDir(), "lit.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	f.Fuzz(func(t *testing.T, s string) {
		if checkValue("v", s) != nil {
			return
		}
		res, err := st.Query(context.Background(), "SELECT "+dialectSQLite.lit(s)+", 1")
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if len(res.Rows) != 1 || len(res.Rows[0]) != 2 || res.Rows[0][0] != s || res.Rows[0][1] != "1" {
			t.Fatalf("%q came back as %q", s, res.Rows)
		}
	})
}
