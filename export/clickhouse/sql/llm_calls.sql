CREATE TABLE IF NOT EXISTS {{.Table "llm_calls"}} (
    span_id String{{codec "ZSTD(1)"}},
    trace_id String{{codec "ZSTD(1)"}},
    rollout_id String,
    attempt_id String,
    task_id String,
    agent_name {{lowCardinality}},
    sequence_id UInt64,
    choice_index UInt32,
    start_time_unix_nano UInt64{{codec "DoubleDelta, ZSTD(1)"}},
    end_time_unix_nano UInt64{{codec "DoubleDelta, ZSTD(1)"}},
    ttft_nano UInt64{{codec "ZSTD(1)"}},
    endpoint {{lowCardinality}},
    model {{lowCardinality}},
    backend {{lowCardinality}},
    policy_version {{lowCardinality}},
    stream UInt8,
    http_status UInt16,
    error String{{codec "ZSTD(3)"}},
    request_body String{{codec "ZSTD(3)"}},
    response_body String{{codec "ZSTD(3)"}},
    response_message String{{codec "ZSTD(3)"}},
    prompt_token_ids Array(UInt32){{codec "ZSTD(1)"}},
    response_token_ids Array(UInt32){{codec "ZSTD(1)"}},
    response_logprobs Array(Float32){{codec "ZSTD(1)"}},
    token_source {{lowCardinality}},
    token_check {{lowCardinality}},
    finish_reason {{lowCardinality}},
    prompt_tokens UInt32,
    completion_tokens UInt32,
    turn_kind {{lowCardinality}},
    turn_prefix_len UInt32,
    turn_prev_sequence_id UInt64,
    api_key_name {{lowCardinality}}
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, sequence_id, choice_index)
{{- if .TTL}}
TTL toDateTime(intDiv(start_time_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 8192
