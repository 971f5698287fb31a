package export

import (
	"reflect"
	"testing"
)

// checkTable: every field of R has exactly one column (or spool-only
// field), names are unique, and Since is at least 1.
func checkTable[R any](t *testing.T, tbl *Table[R]) {
	t.Helper()
	var r R
	base := reflect.ValueOf(&r).Elem()
	fields := map[uintptr]string{}
	for i := 0; i < base.NumField(); i++ {
		fields[base.Field(i).Addr().Pointer()] = base.Type().Field(i).Name
	}
	seenField := map[string]string{}
	seenName := map[string]bool{}
	for _, c := range tbl.Spool {
		p := reflect.ValueOf(c.Field(&r)).Pointer()
		f, ok := fields[p]
		if !ok {
			t.Errorf("%s.%s: accessor points outside %T", tbl.Name, c.Name, r)
			continue
		}
		if prev, dup := seenField[f]; dup {
			t.Errorf("%s: columns %s and %s both read field %s", tbl.Name, prev, c.Name, f)
		}
		seenField[f] = c.Name
		if seenName[c.Name] {
			t.Errorf("%s: column %s declared twice", tbl.Name, c.Name)
		}
		seenName[c.Name] = true
		if c.Since < 1 || c.Since > SpoolVersion() {
			t.Errorf("%s.%s: Since %d outside 1..%d", tbl.Name, c.Name, c.Since, SpoolVersion())
		}
	}
	for _, name := range fields {
		if _, ok := seenField[name]; !ok {
			t.Errorf("%s: field %s.%s has no column: add it to the table in row.go", tbl.Name, reflect.TypeOf(r).Name(), name)
		}
	}
}

func TestColumnTables(t *testing.T) {
	checkTable(t, CallTable)
	checkTable(t, RewardTable)
	checkTable(t, RolloutTable)
	checkTable(t, SpanTable)
	if len(CallTable.Columns) != len(CallTable.Spool)-1 {
		t.Errorf("llm_calls: %d stored columns of %d spool fields, want only parent_span_id spool-only", len(CallTable.Columns), len(CallTable.Spool))
	}
}

func TestColumnDecls(t *testing.T) {
	f := func(c ColumnInfo, ch, chAll, sqlite string) {
		t.Helper()
		if got := c.ClickHouseDecl(false, false); got != ch {
			t.Errorf("%s: ClickHouseDecl(plain) = %q, want %q", c.Name, got, ch)
		}
		if got := c.ClickHouseDecl(true, true); got != chAll {
			t.Errorf("%s: ClickHouseDecl(all) = %q, want %q", c.Name, got, chAll)
		}
		if got := c.SQLiteDecl(); got != sqlite {
			t.Errorf("%s: SQLiteDecl = %q, want %q", c.Name, got, sqlite)
		}
	}
	col := func(tbl TableInfo, name string) ColumnInfo {
		for _, c := range tbl.Columns {
			if c.Name == name {
				return c
			}
		}
		t.Fatalf("%s has no column %s", tbl.Name, name)
		return ColumnInfo{}
	}
	calls, _ := TableByName("llm_calls")
	spans, _ := TableByName("agent_spans")
	rewards, _ := TableByName("rewards")
	f(col(calls, "model"), "String", "LowCardinality(String)", "TEXT NOT NULL DEFAULT ''")
	f(col(calls, "stream"), "UInt8", "UInt8", "INTEGER NOT NULL DEFAULT 0")
	f(col(calls, "prompt_token_ids"), "Array(UInt32)", "Array(UInt32) CODEC(ZSTD(1))", "TEXT NOT NULL DEFAULT '[]'")
	f(col(calls, "start_time_unix_nano"), "UInt64", "UInt64 CODEC(DoubleDelta, ZSTD(1))", "INTEGER NOT NULL DEFAULT 0")
	f(col(spans, "attributes"), "String", "String CODEC(ZSTD(3))", "TEXT NOT NULL DEFAULT '{}'")
	f(col(rewards, "value"), "Float64", "Float64", "REAL NOT NULL DEFAULT 0")
}

func TestCallFilterConditions(t *testing.T) {
	f := func(fl CallFilter, where string, args ...any) {
		t.Helper()
		w, a := fl.Conditions()
		if w != where || !reflect.DeepEqual(a, args) && len(a)+len(args) > 0 {
			t.Errorf("%+v: %q %v, want %q %v", fl, w, a, where, args)
		}
	}
	f(CallFilter{}, "")
	f(CallFilter{RolloutID: "r"}, "rollout_id = ?", "r")
	f(CallFilter{RolloutID: "r", AttemptID: "a", SpanID: "s", Limit: 3}, "rollout_id = ? AND attempt_id = ? AND span_id = ?", "r", "a", "s")
}
