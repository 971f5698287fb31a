-- The tables of docs/contract.md §3 in SQLite: same table and column names as
-- ClickHouse. Token-id and logprob arrays are JSON text ([1,2,3]) so that
-- json_each() and json_array_length() work on them. A text/template: the
-- columns action lists a table's columns from export's column table
-- (export/row.go).
CREATE TABLE IF NOT EXISTS llm_calls (
{{columns "llm_calls"}}
);
CREATE INDEX IF NOT EXISTS llm_calls_by_rollout ON llm_calls (rollout_id, attempt_id, sequence_id, choice_index);
-- Only the rollout index: every read of rollgate's (the API, the viewer, the
-- bridge, the checks) selects a rollout's calls. Files from before 2026-11-29
-- also had indexes on span_id and attempt_id alone, which nothing read and
-- every row paid for (span and attempt ids are random, so each row dirtied a
-- page of each: 94 -> 51 µs per stored row at 300,000 rows, BenchmarkWriteBatch).
-- Opening such a file drops them. To look calls up by span id often, create
-- an index of another name; rollgate leaves it alone.
DROP INDEX IF EXISTS llm_calls_by_span;
DROP INDEX IF EXISTS llm_calls_by_attempt;

CREATE TABLE IF NOT EXISTS rewards (
{{columns "rewards"}}
);
CREATE INDEX IF NOT EXISTS rewards_by_rollout ON rewards (rollout_id, attempt_id, sequence_id);

-- One row per (rollout, attempt): a write replaces the row when its
-- updated_unix_nano is not older (ClickHouse: ReplacingMergeTree).
CREATE TABLE IF NOT EXISTS rollouts (
{{columns "rollouts"}},
    PRIMARY KEY (rollout_id, attempt_id)
);
-- The viewer's live list asks for the latest update (a change since its
-- last look) every 2 s per open tab: an index answers without a scan.
CREATE INDEX IF NOT EXISTS rollouts_by_update ON rollouts (updated_unix_nano);

-- Agent spans received over OTLP (POST /v1/traces). Extra table.
CREATE TABLE IF NOT EXISTS agent_spans (
{{columns "agent_spans"}}
);
CREATE INDEX IF NOT EXISTS agent_spans_by_rollout ON agent_spans (rollout_id, attempt_id, start_time_unix_nano);
