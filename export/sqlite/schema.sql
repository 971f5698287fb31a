-- The tables of docs/contract.md §3 in SQLite: same table and column names as
-- ClickHouse. Token-id and logprob arrays are JSON text ([1,2,3]) so that
-- json_each() and json_array_length() work on them. A text/template: the
-- columns action lists a table's columns from export's column table
-- (export/row.go).
CREATE TABLE IF NOT EXISTS llm_calls (
{{columns "llm_calls"}}
);
CREATE INDEX IF NOT EXISTS llm_calls_by_rollout ON llm_calls (rollout_id, attempt_id, sequence_id, choice_index);
CREATE INDEX IF NOT EXISTS llm_calls_by_span ON llm_calls (span_id);
CREATE INDEX IF NOT EXISTS llm_calls_by_attempt ON llm_calls (attempt_id);

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
