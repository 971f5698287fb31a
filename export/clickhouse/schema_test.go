package clickhouse

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestFeaturesFor(t *testing.T) {
	f := func(v Version, want Features) {
		t.Helper()
		if got := FeaturesFor(v); got != want {
			t.Fatalf("FeaturesFor(%s) = %+v, want %+v", v, got, want)
		}
	}
	f(Version{18, 16, 1}, Features{})
	f(Version{19, 3, 0}, Features{LowCardinality: true})
	f(Version{19, 6, 0}, Features{LowCardinality: true, TTL: true})
	f(Version{20, 1, 0}, Features{LowCardinality: true, Codecs: true, TTL: true})
	f(Version{24, 8, 3}, Features{LowCardinality: true, Codecs: true, TTL: true})
}

func TestRenderDDLOldServer(t *testing.T) {
	stmts, err := RenderDDL(FeaturesFor(Version{18, 16, 1}), "rollgate", 30)
	if err != nil {
		t.Fatal(err)
	}
	if len(stmts) != 4 {
		t.Fatalf("%d statements, want 4", len(stmts))
	}
	all := strings.Join(stmts, "\n")
	for _, bad := range []string{"LowCardinality", "CODEC", "TTL", "{{", "}}"} {
		if strings.Contains(all, bad) {
			t.Errorf("18.16 DDL contains %q:\n%s", bad, all)
		}
	}
	for _, want := range []string{
		"CREATE TABLE IF NOT EXISTS `rollgate`.`llm_calls` (",
		"    model String,\n",
		"    prompt_token_ids Array(UInt32),\n",
		"    response_logprobs Array(Float32),\n",
		"    token_check String,\n",
		"ORDER BY (rollout_id, attempt_id, sequence_id, choice_index)\nSETTINGS",
		"PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))",
		"CREATE TABLE IF NOT EXISTS `rollgate`.`rewards` (",
		"CREATE TABLE IF NOT EXISTS `rollgate`.`agent_spans` (",
		"ENGINE = ReplacingMergeTree(updated_unix_nano)",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("18.16 DDL lacks %q:\n%s", want, all)
		}
	}
}

func TestRenderDDLNewServer(t *testing.T) {
	stmts, err := RenderDDL(FeaturesFor(Version{24, 8, 0}), "rg", 30)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(stmts, "\n")
	for _, want := range []string{
		"    model LowCardinality(String),\n",
		"    token_source LowCardinality(String),\n",
		"    finish_reason LowCardinality(String),\n",
		"    rollout_id String,\n", // high cardinality stays String
		"    start_time_unix_nano UInt64 CODEC(DoubleDelta, ZSTD(1)),\n",
		"    request_body String CODEC(ZSTD(3)),\n",
		"    prompt_token_ids Array(UInt32) CODEC(ZSTD(1)),\n",
		"ORDER BY (rollout_id, attempt_id, sequence_id, choice_index)\nTTL toDateTime(intDiv(start_time_unix_nano, 1000000000)) + INTERVAL 30 DAY\nSETTINGS",
		"TTL toDateTime(intDiv(time_unix_nano, 1000000000)) + INTERVAL 30 DAY",
		"TTL toDateTime(intDiv(updated_unix_nano, 1000000000)) + INTERVAL 30 DAY",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("new-server DDL lacks %q:\n%s", want, all)
		}
	}
	// TTLDays 0: no TTL clause even where supported.
	stmts, err = RenderDDL(FeaturesFor(Version{24, 8, 0}), "rg", 0)
	if err != nil {
		t.Fatal(err)
	}
	if all := strings.Join(stmts, "\n"); strings.Contains(all, "TTL") {
		t.Errorf("TTLDays 0 rendered a TTL:\n%s", all)
	}
}

func TestRenderDDLRejectsBadInput(t *testing.T) {
	for _, db := range []string{"", "a-b", "1abc", "x`y", "a b"} {
		if _, err := RenderDDL(Features{}, db, 0); err == nil {
			t.Errorf("RenderDDL(db %q): no error", db)
		}
	}
	if _, err := RenderDDL(Features{}, "ok", -1); err == nil {
		t.Error("RenderDDL(ttl -1): no error")
	}
}

// TestLLMCallsGranularity checks that the server makes llm_calls with
// LLMCallsGranularity-row granules, and that the cluster DDL a deployment
// runs says the same.
func TestLLMCallsGranularity(t *testing.T) {
	s := openStore(t, Options{})
	var engine string
	if err := s.conn.QueryRow(context.Background(), "SELECT engine_full FROM system.tables WHERE database = currentDatabase() AND name = 'llm_calls'").Scan(&engine); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("index_granularity = %d", LLMCallsGranularity)
	if !strings.Contains(engine, want) {
		t.Errorf("llm_calls engine %q lacks %q", engine, want)
	}
	cluster, err := os.ReadFile("../../deploy/clickhouse/cluster.sql")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(cluster), "llm_calls_local', '{replica}')")
	settings, _, _ := strings.Cut(rest, ";")
	if !ok || !strings.Contains(settings, want) {
		t.Errorf("deploy/clickhouse/cluster.sql's llm_calls_local lacks %q before its end: %q", want, settings)
	}
}
