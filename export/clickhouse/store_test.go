package clickhouse

import (
	"context"
	"strings"
	"testing"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) export.Store {
		s, err := Open(context.Background(), freshDSN(t), Options{})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		return s
	})
}

// TestConformanceExternalInsert runs the suite on the external-table insert
// path whatever the server supports.
func TestConformanceExternalInsert(t *testing.T) {
	storetest.Run(t, func(t *testing.T) export.Store {
		s, err := Open(context.Background(), freshDSN(t), Options{ExternalInsert: true})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if s.InsertMode() != InsertExternal {
			t.Fatalf("InsertMode = %v, want external", s.InsertMode())
		}
		return s
	})
}

func TestOpenTwiceKeepsData(t *testing.T) {
	ctx := context.Background()
	dsn := freshDSN(t)
	s1, err := Open(ctx, dsn, Options{TTLDays: 30})
	if err != nil {
		t.Fatalf("first Open: %v", err)
	}
	call := storetest.FullCall("r1", "a1", 1, 0)
	if err := s1.Write(ctx, &export.Batch{Calls: []export.Call{call}}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	s2, err := Open(ctx, dsn, Options{TTLDays: 30})
	if err != nil {
		t.Fatalf("second Open of the same database: %v", err)
	}
	defer s2.Close()
	if err := s1.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got, err := s2.Calls(ctx, export.CallFilter{})
	if err != nil {
		t.Fatalf("Calls: %v", err)
	}
	if d := storetest.EqualCalls(got, []export.Call{call}); d != "" {
		t.Fatal(d)
	}
	if s2.Name() != "clickhouse" || s2.Database() != "t_TestOpenTwiceKeepsData" {
		t.Fatalf("Name %q Database %q", s2.Name(), s2.Database())
	}
}

// TestSchemaMatchesServer checks the created columns and types against what
// the server reports, for the features this server supports.
func TestSchemaMatchesServer(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	res, err := s.Query(ctx, "SELECT table, name, type FROM system.columns WHERE database = '"+s.Database()+"'")
	if err != nil {
		t.Fatalf("Query system.columns: %v", err)
	}
	got := map[string][]string{}
	for _, r := range res.Rows {
		got[r[0]] = append(got[r[0]], r[1]+" "+r[2])
	}
	lc := "String"
	if s.Features().LowCardinality {
		lc = "LowCardinality(String)"
	}
	lowCard := map[string]bool{"agent_name": true, "endpoint": true, "model": true, "backend": true, "policy_version": true,
		"token_source": true, "token_check": true, "finish_reason": true, "name": true, "source": true, "status": true,
		"kind": true, "service_name": true, "tool_name": true, "status_code": true}
	for _, tbl := range export.Tables() {
		table := tbl.Name
		var want []string
		for _, c := range tbl.Columns {
			typ := c.ClickHouseType()
			if lowCard[c.Name] {
				typ = lc
			}
			want = append(want, c.Name+" "+typ)
		}
		if strings.Join(got[table], ", ") != strings.Join(want, ", ") {
			t.Errorf("%s columns:\n got %s\nwant %s", table, strings.Join(got[table], ", "), strings.Join(want, ", "))
		}
	}
	res, err = s.Query(ctx, "SELECT name, engine FROM system.tables WHERE database = '"+s.Database()+"' ORDER BY name")
	if err != nil {
		t.Fatalf("Query system.tables: %v", err)
	}
	want := [][]string{{"agent_spans", "MergeTree"}, {"llm_calls", "MergeTree"}, {"rewards", "MergeTree"}, {"rollouts", "ReplacingMergeTree"}}
	if len(res.Rows) != len(want) {
		t.Fatalf("tables = %q, want %q", res.Rows, want)
	}
	for i := range want {
		if res.Rows[i][0] != want[i][0] || res.Rows[i][1] != want[i][1] {
			t.Fatalf("tables = %q, want %q", res.Rows, want)
		}
	}
}

// TestInsertModeProbe pins what the probe finds on this server: 18.x servers
// answer INSERT ... FORMAT Native with an empty header and need the external
// path; newer ones take native batches. The probe itself inserts nothing.
func TestInsertModeProbe(t *testing.T) {
	s := openStore(t, Options{})
	v := s.ServerVersion()
	switch {
	case !v.AtLeast(19, 1) && s.InsertMode() != InsertExternal:
		t.Fatalf("server %s: InsertMode = %v, want external", v, s.InsertMode())
	case v.AtLeast(22, 1) && s.InsertMode() != InsertBatch:
		t.Fatalf("server %s: InsertMode = %v, want batch", v, s.InsertMode())
	}
	res, err := s.Query(context.Background(), "SELECT count(*) FROM rollouts")
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	if res.Rows[0][0] != "0" {
		t.Fatalf("probe left %s rows in rollouts", res.Rows[0][0])
	}
}

func TestQueryRendersTypes(t *testing.T) {
	s := openStore(t, Options{})
	f := func(query string, want ...string) {
		t.Helper()
		res, err := s.Query(context.Background(), query)
		if err != nil {
			t.Fatalf("Query(%s): %v", query, err)
		}
		if len(res.Rows) != 1 || strings.Join(res.Rows[0], "|") != strings.Join(want, "|") {
			t.Fatalf("Query(%s) = %q, want %q", query, res.Rows, want)
		}
	}
	f("SELECT NULL", "NULL")
	f("SELECT toNullable(toUInt8(3)), CAST(NULL AS Nullable(String))", "3", "NULL")
	f("SELECT toInt32(-5), toFloat64(0.1), toFloat32(0.1)", "-5", "0.1", "0.1")
	f("SELECT ['a', 'b''c'], [[1, 2], []], emptyArrayUInt32()", `["a","b'c"]`, "[[1,2],[]]", "[]")
	f("SELECT toDateTime('2024-03-01 12:34:56', 'UTC'), toDate('2024-03-01')", "2024-03-01 12:34:56", "2024-03-01")
	f("SELECT 'héllo\tworld'", "héllo\tworld")
	f("SELECT toFixedString('ab', 3)", "ab\x00")
}

// TestRolloutsReadOptions checks that a bulk read leaves out exactly the
// bodies its options name and reads every other column as Rollout does.
func TestRolloutsReadOptions(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	want := storetest.FullCall("r1", "a1", 1, 0)
	if err := s.Write(ctx, &export.Batch{Calls: []export.Call{want}}); err != nil {
		t.Fatal(err)
	}
	for _, opt := range []export.ReadOptions{{}, {NoResponseBody: true}, {NoRequestBody: true}, {NoRequestBody: true, NoResponseBody: true}} {
		m, err := s.Rollouts(ctx, []string{"r1", "unknown"}, opt)
		if err != nil {
			t.Fatal(err)
		}
		if len(m["unknown"].Calls) != 0 || len(m["r1"].Calls) != 1 {
			t.Fatalf("%+v: %d and %d calls", opt, len(m["r1"].Calls), len(m["unknown"].Calls))
		}
		got, exp := m["r1"].Calls[0], want
		if opt.NoRequestBody {
			exp.RequestBody = ""
		}
		if opt.NoResponseBody {
			exp.ResponseBody = ""
		}
		if got.RequestBody != exp.RequestBody || got.ResponseBody != exp.ResponseBody || got.ResponseMessage != exp.ResponseMessage ||
			len(got.PromptTokenIDs) != len(exp.PromptTokenIDs) || len(got.ResponseLogprobs) != len(exp.ResponseLogprobs) || exp.RequestBody == "" && !opt.NoRequestBody {
			t.Fatalf("%+v: got %+v, want %+v", opt, got, exp)
		}
	}
}

// TestConformanceTextReads runs the suite with llm_calls read as text
// through clickhouse-go (Options.TextReads), the path the store falls back
// to when its native reader fails.
func TestConformanceTextReads(t *testing.T) {
	storetest.Run(t, func(t *testing.T) export.Store {
		s, err := Open(context.Background(), freshDSN(t), Options{TextReads: true})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		if !s.TextReads() {
			t.Fatal("TextReads() = false with Options.TextReads")
		}
		return s
	})
}
