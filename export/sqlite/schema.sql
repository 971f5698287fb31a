-- The tables of docs/contract.md §3 in SQLite: same table and column names as
-- ClickHouse. Token-id and logprob arrays are JSON text ([1,2,3]) so that
-- json_each() and json_array_length() work on them.
CREATE TABLE IF NOT EXISTS llm_calls (
    span_id              TEXT    NOT NULL DEFAULT '',
    trace_id             TEXT    NOT NULL DEFAULT '',
    rollout_id           TEXT    NOT NULL DEFAULT '',
    attempt_id           TEXT    NOT NULL DEFAULT '',
    task_id              TEXT    NOT NULL DEFAULT '',
    agent_name           TEXT    NOT NULL DEFAULT '',
    sequence_id          INTEGER NOT NULL DEFAULT 0,
    choice_index         INTEGER NOT NULL DEFAULT 0,
    start_time_unix_nano INTEGER NOT NULL DEFAULT 0,
    end_time_unix_nano   INTEGER NOT NULL DEFAULT 0,
    ttft_nano            INTEGER NOT NULL DEFAULT 0,
    endpoint             TEXT    NOT NULL DEFAULT '',
    model                TEXT    NOT NULL DEFAULT '',
    backend              TEXT    NOT NULL DEFAULT '',
    policy_version       TEXT    NOT NULL DEFAULT '',
    stream               INTEGER NOT NULL DEFAULT 0,
    http_status          INTEGER NOT NULL DEFAULT 0,
    error                TEXT    NOT NULL DEFAULT '',
    request_body         TEXT    NOT NULL DEFAULT '',
    response_body        TEXT    NOT NULL DEFAULT '',
    response_message     TEXT    NOT NULL DEFAULT '',
    prompt_token_ids     TEXT    NOT NULL DEFAULT '[]',
    response_token_ids   TEXT    NOT NULL DEFAULT '[]',
    response_logprobs    TEXT    NOT NULL DEFAULT '[]',
    token_source         TEXT    NOT NULL DEFAULT '',
    token_check          TEXT    NOT NULL DEFAULT '',
    finish_reason        TEXT    NOT NULL DEFAULT '',
    prompt_tokens        INTEGER NOT NULL DEFAULT 0,
    completion_tokens    INTEGER NOT NULL DEFAULT 0,
    turn_kind            TEXT    NOT NULL DEFAULT '',
    turn_prefix_len      INTEGER NOT NULL DEFAULT 0,
    turn_prev_sequence_id INTEGER NOT NULL DEFAULT 0,
    api_key_name         TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS llm_calls_by_rollout ON llm_calls (rollout_id, attempt_id, sequence_id, choice_index);
CREATE INDEX IF NOT EXISTS llm_calls_by_span ON llm_calls (span_id);
CREATE INDEX IF NOT EXISTS llm_calls_by_attempt ON llm_calls (attempt_id);

CREATE TABLE IF NOT EXISTS rewards (
    rollout_id     TEXT    NOT NULL DEFAULT '',
    attempt_id     TEXT    NOT NULL DEFAULT '',
    sequence_id    INTEGER NOT NULL DEFAULT 0,
    name           TEXT    NOT NULL DEFAULT '',
    value          REAL    NOT NULL DEFAULT 0,
    source         TEXT    NOT NULL DEFAULT '',
    time_unix_nano INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS rewards_by_rollout ON rewards (rollout_id, attempt_id, sequence_id);

-- One row per (rollout, attempt): a write replaces the row when its
-- updated_unix_nano is not older (ClickHouse: ReplacingMergeTree).
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id        TEXT    NOT NULL DEFAULT '',
    attempt_id        TEXT    NOT NULL DEFAULT '',
    task_id           TEXT    NOT NULL DEFAULT '',
    group_id          TEXT    NOT NULL DEFAULT '',
    status            TEXT    NOT NULL DEFAULT '',
    metadata          TEXT    NOT NULL DEFAULT '',
    created_unix_nano INTEGER NOT NULL DEFAULT 0,
    updated_unix_nano INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (rollout_id, attempt_id)
);

-- Agent spans received over OTLP (POST /v1/traces). Extra table.
CREATE TABLE IF NOT EXISTS agent_spans (
    rollout_id           TEXT    NOT NULL DEFAULT '',
    attempt_id           TEXT    NOT NULL DEFAULT '',
    trace_id             TEXT    NOT NULL DEFAULT '',
    span_id              TEXT    NOT NULL DEFAULT '',
    parent_span_id       TEXT    NOT NULL DEFAULT '',
    name                 TEXT    NOT NULL DEFAULT '',
    kind                 TEXT    NOT NULL DEFAULT '',
    service_name         TEXT    NOT NULL DEFAULT '',
    tool_name            TEXT    NOT NULL DEFAULT '',
    tool_call_id         TEXT    NOT NULL DEFAULT '',
    status_code          TEXT    NOT NULL DEFAULT '',
    status_message       TEXT    NOT NULL DEFAULT '',
    start_time_unix_nano INTEGER NOT NULL DEFAULT 0,
    end_time_unix_nano   INTEGER NOT NULL DEFAULT 0,
    attributes           TEXT    NOT NULL DEFAULT '{}',
    received_unix_nano   INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS agent_spans_by_rollout ON agent_spans (rollout_id, attempt_id, start_time_unix_nano);
