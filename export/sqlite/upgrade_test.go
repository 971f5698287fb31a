package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// TestUpgradeAddsNewColumns opens a file created with the first llm_calls
// schema (no turn_* columns): the columns are added and old rows read back.
func TestUpgradeAddsNewColumns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	old := withoutColumns(t, schema, "turn_kind", "turn_prefix_len", "turn_prev_sequence_id", "api_key_name") // added after the first schema
	if _, err := db.Exec(old); err != nil {
		t.Fatalf("old schema: %v\n%s", err, old)
	}
	if _, err := db.Exec(`INSERT INTO llm_calls (span_id, rollout_id, sequence_id) VALUES ('old', 'r', 1)`); err != nil {
		t.Fatal(err)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM pragma_table_info('llm_calls') WHERE name LIKE 'turn_%'`).Scan(&n)
	db.Close()
	if n != 0 {
		t.Fatalf("the old schema already has %d turn_ columns", n)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Write(ctx, &export.Batch{Calls: []export.Call{{SpanID: "new", RolloutID: "r", SequenceID: 2, TurnKind: "prefix", TurnPrefixLen: 9, TurnPrevSequenceID: 1}}}); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Calls(ctx, export.CallFilter{RolloutID: "r"})
	if err != nil || len(rows) != 2 || rows[0].TurnKind != "" || rows[1].TurnKind != "prefix" || rows[1].TurnPrefixLen != 9 || rows[1].TurnPrevSequenceID != 1 {
		t.Fatalf("after upgrade: %+v %v", rows, err)
	}
}

// TestUpgradeAddsGroupID opens a file whose rollouts table predates group_id
// (the group only in metadata): the column is added and the old row reads
// back with an empty group.
func TestUpgradeAddsGroupID(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	old := withoutColumns(t, schema, "group_id") // added after the first schema
	if _, err := db.Exec(old); err != nil {
		t.Fatalf("old schema: %v\n%s", err, old)
	}
	r := storetest.OldRollout()
	if _, err := db.Exec(`INSERT INTO rollouts (rollout_id, attempt_id, task_id, status, metadata, created_unix_nano, updated_unix_nano) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.RolloutID, r.AttemptID, r.TaskID, r.Status, r.Metadata, int64(r.CreatedUnixNano), int64(r.UpdatedUnixNano)); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM pragma_table_info('rollouts') WHERE name = 'group_id'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the old schema has %d group_id columns (%v)", n, err)
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.CheckUpgradedRollouts(t, s)
}

// withoutColumns is the schema without the lines of cols (a file of an
// older release), wherever they are in their tables.
func withoutColumns(t *testing.T, schema string, cols ...string) string {
	t.Helper()
	for _, c := range cols {
		line := "\n    " + c + " "
		i := strings.Index(schema, line)
		if i < 0 {
			t.Fatalf("schema.sql has no column %s", c)
		}
		end := strings.Index(schema[i+1:], "\n")
		schema = schema[:i] + schema[i+1+end:]
	}
	return strings.ReplaceAll(schema, ",\n)", "\n)") // a table's last column has no comma
}
