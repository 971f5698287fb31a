-- rollgate's tables on a ClickHouse cluster: ReplicatedMergeTree tables
-- (<table>_local) on every server, and Distributed tables with the contract's
-- names (llm_calls, rewards, rollouts, agent_spans) over them, so that
--
--     rollgate serve --clickhouse clickhouse://USER:PASSWORD@HOST:9000/rollgate
--
-- pointed at any server of the cluster writes and reads through the
-- Distributed tables (it creates tables only when they are missing, so it
-- leaves these alone).
--
-- Apply once, on any one server: clickhouse-client --multiquery < cluster.sql
-- (ON CLUSTER runs every statement on every server through ZooKeeper).
--
-- Every server needs, in its config: <zookeeper> (or ClickHouse Keeper),
-- <distributed_ddl>, a cluster in <remote_servers> whose shards set
-- <internal_replication>true</internal_replication>, and the macros
-- <cluster> (that cluster's name), <shard> and <replica> (unique per server).
--
-- Rows are sharded by rollout_id, so one rollout's calls, rewards and status
-- rows live on one shard (its "latest row wins" merge and per-rollout reads
-- stay local); calls and spans without a rollout spread by span id.
--
-- In the profile of the user rollgate connects as, set
--     <insert_distributed_sync>1</insert_distributed_sync>
--     <load_balancing>in_order</load_balancing>
-- so an insert returns once every shard has stored its rows, as capture
-- expects (a rollout's status waits for its calls to be stored), and reads go
-- to the replica that took the writes (the first healthy one of each shard),
-- so a rollout read right after its calls were stored lists them all.
-- (Numeric settings such as insert_distributed_sync=1 may also go in the DSN.)
--
-- Columns and types are those export/clickhouse creates on a single server
-- (deploy/deploytest checks both against a real cluster). Low-cardinality
-- columns are plain String and there are no codecs, so the file runs on every
-- server from 18.16; on 19.3+ you may declare them LowCardinality(String) and
-- on 20.1+ add the codecs of export/clickhouse/sql, on the _local tables.
--
-- To use another database name, replace every "rollgate" below.
--
-- Upgrading: on a single server rollgate adds the columns of a newer release
-- itself; on a cluster it does not alter these tables (it stops and names the
-- ALTER to run). Add a new column to the _local tables first (ON CLUSTER),
-- then to the Distributed ones on every server, one by one (18.16 refuses
-- ALTER ON CLUSTER on a table that is not replicated). For example the
-- rollouts table's group_id (added with the training group; before it, the
-- group was only in metadata):
--     ALTER TABLE rollgate.rollouts_local ON CLUSTER '{cluster}' ADD COLUMN group_id String AFTER task_id;
--     ALTER TABLE rollgate.rollouts ADD COLUMN group_id String AFTER task_id;

CREATE DATABASE IF NOT EXISTS rollgate ON CLUSTER '{cluster}';

CREATE TABLE IF NOT EXISTS rollgate.llm_calls_local ON CLUSTER '{cluster}' (
    span_id String,
    trace_id String,
    rollout_id String,
    attempt_id String,
    task_id String,
    agent_name String,
    sequence_id UInt64,
    choice_index UInt32,
    start_time_unix_nano UInt64,
    end_time_unix_nano UInt64,
    ttft_nano UInt64,
    endpoint String,
    model String,
    backend String,
    policy_version String,
    stream UInt8,
    http_status UInt16,
    error String,
    request_body String,
    response_body String,
    response_message String,
    prompt_token_ids Array(UInt32),
    response_token_ids Array(UInt32),
    response_logprobs Array(Float32),
    token_source String,
    token_check String,
    finish_reason String,
    prompt_tokens UInt32,
    completion_tokens UInt32,
    turn_kind String,
    turn_prefix_len UInt32,
    turn_prev_sequence_id UInt64,
    api_key_name String,
    prompt_token_source String,
    response_token_source String,
    overrides String,
    backend_attempts UInt16,
    token_in String,
    retry_count UInt16,
    retry_of String,
    policy_versions String
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/llm_calls_local', '{replica}')
PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, sequence_id, choice_index)
SETTINGS index_granularity = 1024;

CREATE TABLE IF NOT EXISTS rollgate.llm_calls ON CLUSTER '{cluster}' AS rollgate.llm_calls_local
ENGINE = Distributed('{cluster}', rollgate, llm_calls_local,
    if(rollout_id = '', cityHash64(span_id), cityHash64(rollout_id)));

CREATE TABLE IF NOT EXISTS rollgate.rewards_local ON CLUSTER '{cluster}' (
    rollout_id String,
    attempt_id String,
    sequence_id UInt64,
    name String,
    value Float64,
    source String,
    time_unix_nano UInt64
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/rewards_local', '{replica}')
PARTITION BY toYYYYMM(toDateTime(intDiv(time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, sequence_id, name)
SETTINGS index_granularity = 8192;

CREATE TABLE IF NOT EXISTS rollgate.rewards ON CLUSTER '{cluster}' AS rollgate.rewards_local
ENGINE = Distributed('{cluster}', rollgate, rewards_local, cityHash64(rollout_id));

CREATE TABLE IF NOT EXISTS rollgate.rollouts_local ON CLUSTER '{cluster}' (
    rollout_id String,
    attempt_id String,
    task_id String,
    group_id String,
    status String,
    metadata String,
    created_unix_nano UInt64,
    updated_unix_nano UInt64
)
ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/rollouts_local', '{replica}', updated_unix_nano)
ORDER BY (rollout_id, attempt_id)
SETTINGS index_granularity = 8192;

CREATE TABLE IF NOT EXISTS rollgate.rollouts ON CLUSTER '{cluster}' AS rollgate.rollouts_local
ENGINE = Distributed('{cluster}', rollgate, rollouts_local, cityHash64(rollout_id));

CREATE TABLE IF NOT EXISTS rollgate.agent_spans_local ON CLUSTER '{cluster}' (
    rollout_id String,
    attempt_id String,
    trace_id String,
    span_id String,
    parent_span_id String,
    name String,
    kind String,
    service_name String,
    tool_name String,
    tool_call_id String,
    status_code String,
    status_message String,
    start_time_unix_nano UInt64,
    end_time_unix_nano UInt64,
    attributes String,
    received_unix_nano UInt64
)
ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/{database}/agent_spans_local', '{replica}')
PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, start_time_unix_nano, span_id)
SETTINGS index_granularity = 8192;

CREATE TABLE IF NOT EXISTS rollgate.agent_spans ON CLUSTER '{cluster}' AS rollgate.agent_spans_local
ENGINE = Distributed('{cluster}', rollgate, agent_spans_local,
    if(rollout_id = '', cityHash64(span_id), cityHash64(rollout_id)));
