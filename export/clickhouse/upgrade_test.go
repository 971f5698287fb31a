package clickhouse

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// TestUpgradeAddsNewColumns: a database whose llm_calls lacks the columns
// added later gets them on Open, and old rows read back with defaults.
func TestUpgradeAddsNewColumns(t *testing.T) {
	ctx := context.Background()
	dsn := freshDSN(t)
	s, err := Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, &export.Batch{Calls: []export.Call{{SpanID: "old", RolloutID: "r", SequenceID: 1}}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"turn_kind", "turn_prefix_len", "turn_prev_sequence_id", "api_key_name"} {
		if err := s.conn.Exec(ctx, "ALTER TABLE llm_calls DROP COLUMN "+c); err != nil {
			t.Fatalf("dropping %s: %v", c, err)
		}
	}
	s.Close()
	s, err = Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Write(ctx, &export.Batch{Calls: []export.Call{{SpanID: "new", RolloutID: "r", SequenceID: 2, TurnKind: "prefix", TurnPrefixLen: 9, TurnPrevSequenceID: 1}}}); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Calls(ctx, export.CallFilter{RolloutID: "r"})
	if err != nil || len(rows) != 2 || rows[0].TurnKind != "" || rows[1].TurnKind != "prefix" || rows[1].TurnPrefixLen != 9 || rows[1].TurnPrevSequenceID != 1 {
		t.Fatalf("after upgrade: %+v %v", rows, err)
	}
}

// TestUpgradeAddsGroupID: a rollouts table from before group_id (the group
// only in metadata) gains the column on Open, where a new table has it
// (after task_id), and its rows read back with an empty group_id.
func TestUpgradeAddsGroupID(t *testing.T) {
	ctx := context.Background()
	dsn := freshDSN(t)
	s, err := Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.conn.Exec(ctx, "ALTER TABLE rollouts DROP COLUMN group_id"); err != nil {
		t.Fatalf("dropping group_id: %v", err)
	}
	if got := rolloutColumnNames(t, s); slices.Contains(got, "group_id") {
		t.Fatalf("the old table still has group_id: %v", got)
	}
	old := storetest.OldRollout()
	if err := s.Write(ctx, &export.Batch{Rollouts: []export.Rollout{old}}); err == nil {
		t.Fatal("writing group_id to a table without it: no error")
	}
	// Write the old row as the previous release did: without the column.
	var oldCols []export.ColumnInfo
	for _, c := range export.RolloutTable.Info() {
		if c.Name != "group_id" {
			oldCols = append(oldCols, c)
		}
	}
	err = s.insert(ctx, "rollouts", oldCols, func(yield func([]any) error) error {
		return yield([]any{old.RolloutID, old.AttemptID, old.TaskID, old.Status, old.Metadata, old.CreatedUnixNano, old.UpdatedUnixNano})
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(ctx, dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := rolloutColumnNames(t, s), strings.Split(names(export.RolloutTable.Info()), ", "); !slices.Equal(got, want) {
		t.Fatalf("upgraded rollouts columns %v, a new table has %v", got, want)
	}
	storetest.CheckUpgradedRollouts(t, s)
}

// rolloutColumnNames lists the rollouts table's columns in table order.
func rolloutColumnNames(t *testing.T, s *Store) []string {
	t.Helper()
	res, err := s.Query(context.Background(), "SELECT name FROM system.columns WHERE database = '"+s.Database()+"' AND table = 'rollouts'") // in table order (18.16 has no position column)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range res.Rows {
		out = append(out, r[0])
	}
	return out
}
