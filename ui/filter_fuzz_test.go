package ui

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/sqlite"
)

// FuzzLiteral checks that every filter value checkValue accepts reaches
// the store as exactly that string: each value is stored as a new
// rollout's task and group, then the list filtered by that task and the
// group's members must be exactly the rollouts stored with it, no more
// (a value that spliced SQL or matched loosely) and no fewer (ClickHouse's
// binding is checked by storetest's hostile filter values, which run
// quotes, backslashes and placeholders through both stores).
func FuzzLiteral(f *testing.F) {
	for _, s := range []string{"", "plain", "it's", `back\slash`, `'; DROP TABLE llm_calls; --`, "\\'", "ünï€😀", "a\nb\tc\r", "''''", "a?b", "%", "_"} {
		f.Add(s)
	}
	st, err := sqlite.Open(filepath.Join(f.TempDir(), "lit.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	stored := map[string]int{}
	n := 0
	f.Fuzz(func(t *testing.T, s string) {
		if checkValue("v", s) != nil || s == "" { // "" is no filter
			return
		}
		ctx := context.Background()
		n++
		id := fmt.Sprintf("r%d", n)
		if err := st.Write(ctx, &export.Batch{Rollouts: []export.Rollout{{RolloutID: id, AttemptID: "a", TaskID: s, GroupID: s,
			Status: "running", UpdatedUnixNano: uint64(n)}}}); err != nil {
			t.Fatal(err)
		}
		stored[s]++
		rows, _, err := st.RolloutPage(ctx, export.RolloutPageQuery{TaskID: s, Limit: export.MaxRolloutPage})
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if len(rows) != stored[s] || rows[0].RolloutID != id || rows[0].TaskID != s {
			t.Fatalf("%q: the list filtered by task is %+v, want %d rows, the first %s", s, rows, stored[s], id)
		}
		members, err := st.GroupMembers(ctx, s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if len(members) != stored[s] {
			t.Fatalf("%q: the group has %d members, want %d", s, len(members), stored[s])
		}
	})
}
