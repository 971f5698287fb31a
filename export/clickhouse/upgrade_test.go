package clickhouse

import (
	"context"
	"testing"

	"github.com/rollgate/rollgate/export"
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
