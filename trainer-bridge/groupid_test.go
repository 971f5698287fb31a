package bridge

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/internal/testenv"
)

// TestSelectGroupID: the selected attempts carry the rollouts table's
// group_id, or for rows written before that column existed the "group_id" of
// their metadata; the column wins over metadata. On both stores.
func TestSelectGroupID(t *testing.T) {
	for _, name := range []string{"sqlite", "clickhouse"} {
		t.Run(name, func(t *testing.T) {
			var s export.Store
			var err error
			if name == "sqlite" {
				s, err = sqlite.Open(filepath.Join(t.TempDir(), "bridge.db"))
			} else {
				dsn := os.Getenv(testenv.EnvClickHouseDSN)
				if dsn == "" {
					t.Fatalf("set %s to a ClickHouse server (scripts/test starts one)", testenv.EnvClickHouseDSN)
				}
				s, err = clickhouse.Open(context.Background(), testenv.FreshDatabase(dsn, fmt.Sprint("bridge_group_", time.Now().UnixNano())), clickhouse.Options{})
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			want := map[string]string{"r-col": "g-col", "r-old": "g-old", "r-both": "g-new", "r-none": ""}
			rows := map[string][2]string{ // rollout -> group_id column, metadata
				"r-col":  {"g-col", `{}`},
				"r-old":  {"", `{"group_id":"g-old"}`},
				"r-both": {"g-new", `{"group_id":"g-stale"}`},
				"r-none": {"", `{}`},
			}
			b := &export.Batch{}
			for ro, r := range rows {
				b.Calls = append(b.Calls, cs{ro: ro, at: "a1", task: "t", seq: 1, prompt: []uint32{1}, resp: []uint32{2}}.call())
				b.Rollouts = append(b.Rollouts, export.Rollout{RolloutID: ro, AttemptID: "a1", TaskID: "t", GroupID: r[0], Status: "succeeded",
					Metadata: r[1], CreatedUnixNano: 1, UpdatedUnixNano: 2})
			}
			if err := s.Write(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			refs, err := SelectAttempts(context.Background(), s, Selection{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, r := range refs {
				got[r.RolloutID] = r.GroupID
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("groups %v, want %v", got, want)
			}
		})
	}
}
