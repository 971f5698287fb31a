package clickhouse

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/rollgate/rollgate/export"
	"github.com/rollgate/rollgate/export/storetest"
)

// TestNativeHostileIDs reads rollouts whose ids hold quotes, backslashes,
// placeholders and control bytes through the native reader's bound IN list.
func TestNativeHostileIDs(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	ids := []string{`a'b`, `c\`, `\'); DROP TABLE llm_calls; --`, "?", "x?y'?", "nl\nnul\x00del\x7f", "é中"}
	var calls []export.Call
	for i, id := range ids {
		c := storetest.FullCall(id, "a1", uint64(i+1), 0)
		c.SpanID = "s" + string(rune('a'+i))
		calls = append(calls, c)
	}
	if err := s.Write(ctx, &export.Batch{Calls: calls}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Rollouts(ctx, append(ids, "missing"), export.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		if d := storetest.EqualCalls(got[id].Calls, calls[i:i+1]); d != "" {
			t.Errorf("rollout %q: %s", id, d)
		}
	}
	if n := len(got["missing"].Calls); n != 0 {
		t.Errorf("unknown rollout has %d calls", n)
	}
	one, err := s.Calls(ctx, export.CallFilter{RolloutID: ids[2], SpanID: calls[2].SpanID})
	if err != nil || len(one) != 1 {
		t.Fatalf("Calls(%q) = %d calls, %v", ids[2], len(one), err)
	}
}

// TestNativeCallsOrder checks that a rollout's calls come back in Calls's
// order (attempt, sequence id, choice, span) although the bulk read leaves
// the sorting to the client, each with its own arrays.
func TestNativeCallsOrder(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	var calls []export.Call
	for _, k := range []struct {
		attempt string
		seq     uint64
		choice  uint32
		span    string
	}{{"a2", 1, 0, "s1"}, {"a1", 3, 0, "s2"}, {"a1", 1, 1, "s3"}, {"a1", 1, 0, "s5"}, {"a1", 1, 0, "s4"}, {"a1", 20, 0, "s6"}} {
		c := storetest.FullCall("r", k.attempt, k.seq, k.choice)
		c.SpanID = k.span
		c.PromptTokenIDs = []uint32{uint32(len(calls)), 1, 2, 3}
		c.ResponseLogprobs = []float32{-float32(len(calls))}
		calls = append(calls, c)
		// One insert per call: parts of their own, as a live store has.
		if err := s.Write(ctx, &export.Batch{Calls: []export.Call{c}}); err != nil {
			t.Fatal(err)
		}
	}
	want, err := s.Calls(ctx, export.CallFilter{RolloutID: "r"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Rollouts(ctx, []string{"r"}, export.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := storetest.EqualCalls(got["r"].Calls, want); d != "" {
		t.Fatal(d)
	}
	// One row per block: each call's arrays are still its own after the
	// later blocks were read (they share a block's memory).
	written := map[string]export.Call{}
	for _, c := range calls {
		written[c.SpanID] = c
	}
	var blocks []export.Call
	cols := export.CallTable.Columns
	if err := readNative(ctx, s.native, "SELECT "+nativeSelectList(cols, nil)+" FROM llm_calls ORDER BY span_id SETTINGS max_block_size = 1",
		cols, func(c *export.Call) { blocks = append(blocks, *c) }); err != nil {
		t.Fatal(err)
	}
	for _, c := range append(blocks, got["r"].Calls...) {
		if d := storetest.EqualCalls([]export.Call{c}, []export.Call{written[c.SpanID]}); d != "" {
			t.Fatalf("span %s: %s", c.SpanID, d)
		}
	}
	var spans []string
	for _, c := range want {
		spans = append(spans, c.SpanID)
	}
	if g := strings.Join(spans, ","); g != "s4,s5,s3,s2,s6,s1" {
		t.Fatalf("Calls order %s", g)
	}
}

// TestNativeErrors: a server exception, a result of the wrong shape and a
// cancelled read each fail with a clear error, and the next read works.
func TestNativeErrors(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	c := storetest.FullCall("r1", "a1", 1, 0)
	if err := s.Write(ctx, &export.Batch{Calls: []export.Call{c}}); err != nil {
		t.Fatal(err)
	}
	readsAgain := func(after string) {
		t.Helper()
		got, err := s.Rollouts(ctx, []string{"r1"}, export.ReadOptions{})
		if err != nil {
			t.Fatalf("read after %s: %v", after, err)
		}
		if d := storetest.EqualCalls(got["r1"].Calls, []export.Call{c}); d != "" {
			t.Fatalf("read after %s: %s", after, d)
		}
	}
	readsAgain("nothing")

	err := s.readCalls(ctx, "FROM no_such_table", export.ReadOptions{}, nil, func(*export.Call) {})
	if err == nil || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("unknown table: %v", err)
	}
	readsAgain("a server exception")

	err = readNative(ctx, s.native, "SELECT 1 AS x", export.CallTable.Columns, func(*export.Call) {})
	if err == nil || !strings.Contains(err.Error(), "1 columns in the result") {
		t.Fatalf("wrong shape: %v", err)
	}
	err = readNative(ctx, s.native, "SELECT "+strings.Repeat("toUInt8(1) AS x, ", len(export.CallTable.Columns)-1)+"toUInt8(1) AS y",
		export.CallTable.Columns, func(*export.Call) {})
	if err == nil || !strings.Contains(err.Error(), "column span_id: the server sent UInt8, which is not String") {
		t.Fatalf("wrong types: %v", err)
	}
	readsAgain("a result of the wrong shape")

	cctx, cancel := context.WithCancel(ctx)
	n := 0
	err = s.native.query(cctx, "SELECT number FROM system.numbers LIMIT 100000000", func(_ proto.Results, rows int) error {
		if n += rows; n > 0 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled read: %v", err)
	}
	readsAgain("a cancelled read")

	if _, err := bindArgs("a ? b ?", []any{"x"}); err == nil {
		t.Fatal("bind of 2 placeholders to 1 argument: no error")
	}
	if q, err := bindArgs("x IN ? AND y = ?", []any{clickhouse.GroupSet{Value: []any{"a'", `b\`}}, "\x01"}); err != nil || q != `x IN ('a\'', 'b\\') AND y = '\x01'` {
		t.Fatalf("bind = %s, %v", q, err)
	}
}

// TestNativeLowCardinality: String columns that a newer server declares
// LowCardinality(String) read as their strings, block after block (each with
// its own dictionary).
func TestNativeLowCardinality(t *testing.T) {
	s := openStore(t, Options{})
	type row struct{ S string }
	cols := []export.Column[row]{export.Col("s", func(r *row) any { return &r.S })}
	var got []string
	err := readNative(context.Background(), s.native, "SELECT toLowCardinality(x) AS s FROM (SELECT arrayJoin(['a', 'b', 'a', '', 'c']) AS x)"+
		" SETTINGS allow_experimental_low_cardinality_type = 1, max_block_size = 2", cols, func(r *row) { got = append(got, r.S) })
	if err != nil {
		t.Fatal(err)
	}
	if g := strings.Join(got, ","); g != "a,b,a,,c" {
		t.Fatalf("strings %q", g)
	}
}

// TestRolloutsNoAttempts checks that ReadOptions.NoAttempts leaves only the
// attempts out of a bulk read: the calls and rewards are those of a full
// read, and a full read still has the attempts.
func TestRolloutsNoAttempts(t *testing.T) {
	ctx := context.Background()
	s := openStore(t, Options{})
	b := &export.Batch{
		Calls:    []export.Call{storetest.FullCall("r1", "a1", 1, 0), storetest.FullCall("r2", "a1", 1, 0)},
		Rollouts: []export.Rollout{{RolloutID: "r1", AttemptID: "a1", Status: "succeeded", Metadata: "{}", UpdatedUnixNano: 5}},
		Rewards:  []export.Reward{{RolloutID: "r1", AttemptID: "a1", Name: "primary", Value: 0.5, Source: "api"}},
	}
	if err := s.Write(ctx, b); err != nil {
		t.Fatal(err)
	}
	full, err := s.Rollouts(ctx, []string{"r1", "r2"}, export.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lean, err := s.Rollouts(ctx, []string{"r1", "r2"}, export.ReadOptions{NoAttempts: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(full["r1"].Attempts); n != 1 {
		t.Fatalf("full read: %d attempts of r1, want 1", n)
	}
	for _, id := range []string{"r1", "r2"} {
		if n := len(lean[id].Attempts); n != 0 {
			t.Errorf("NoAttempts: %d attempts of %s", n, id)
		}
		if d := storetest.EqualCalls(lean[id].Calls, full[id].Calls); d != "" || len(lean[id].Calls) != 1 {
			t.Errorf("NoAttempts: calls of %s: %d, %s", id, len(lean[id].Calls), d)
		}
	}
	if len(lean["r1"].Rewards) != 1 || lean["r1"].Rewards[0] != full["r1"].Rewards[0] {
		t.Errorf("NoAttempts: rewards %+v, full read %+v", lean["r1"].Rewards, full["r1"].Rewards)
	}
}
