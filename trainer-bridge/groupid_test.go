package bridge

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/clickhouse"
	"github.com/rollgate/rollgate/export/sqlite"
	"github.com/rollgate/rollgate/testkit/testenv"
)

// openSelectStore opens an empty store of the kind name (sqlite or
// clickhouse) for the test.
func openSelectStore(t *testing.T, name string) export.Store {
	t.Helper()
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
	return s
}

// TestSelectMergesRows: an attempt's rows (several before ClickHouse merges
// them, written out of order) give the latest status and the latest task id
// that is not empty; an attempt with calls but no row joins its rollout's
// group; an attempt without calls is never selected. On ClickHouse, which
// keeps every row written (SQLite keeps the latest).
func TestSelectMergesRows(t *testing.T) {
	for _, name := range []string{"clickhouse"} {
		t.Run(name, func(t *testing.T) {
			s := openSelectStore(t, name)
			ctx := context.Background()
			call := func(ro, at, task string, seq uint64) export.Call {
				return cs{ro: ro, at: at, task: task, seq: seq, prompt: []uint32{1}, resp: []uint32{2}}.call()
			}
			for _, b := range []*export.Batch{
				{Calls: []export.Call{call("r1", "a1", "", 1), call("r1", "a2", "t-calls", 2)},
					Rollouts: []export.Rollout{{RolloutID: "r1", AttemptID: "a1", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 5},
						{RolloutID: "r0", AttemptID: "a1", TaskID: "t0", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 5}}},
				{Rollouts: []export.Rollout{{RolloutID: "r1", AttemptID: "a1", TaskID: "t1", GroupID: "g1", Status: "running", Metadata: "{}", UpdatedUnixNano: 3}}},
			} {
				if err := s.Write(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			show := func(refs []AttemptRef) string {
				var out []string
				for _, r := range refs {
					out = append(out, fmt.Sprintf("%s/%s:%s:%s:%s", r.RolloutID, r.AttemptID, r.Status, r.TaskID, r.GroupID))
				}
				return strings.Join(out, " ")
			}
			for _, c := range []struct {
				sel  Selection
				want string
			}{
				{Selection{}, "r1/a1:succeeded:t1:g1"},
				{Selection{Attempts: AttemptsAll}, "r1/a1:succeeded:t1:g1 r1/a2::t-calls:g1"},
				{Selection{Statuses: []string{"running"}}, ""},
			} {
				refs, err := SelectAttempts(ctx, s, c.sel)
				if err != nil {
					t.Fatal(err)
				}
				if got := show(refs); got != c.want {
					t.Errorf("%+v: got %q, want %q", c.sel, got, c.want)
				}
			}
		})
	}
}

// TestSelectGroupID: the selected attempts carry the rollouts table's
// group_id, or for rows written before that column existed the "group_id" of
// their metadata; the column wins over metadata. On both stores.
func TestSelectGroupID(t *testing.T) {
	for _, name := range []string{"sqlite", "clickhouse"} {
		t.Run(name, func(t *testing.T) {
			s := openSelectStore(t, name)
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
