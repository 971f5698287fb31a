CREATE TABLE IF NOT EXISTS {{.Table "agent_spans"}} (
    rollout_id String,
    attempt_id String,
    trace_id String,
    span_id String,
    parent_span_id String,
    name {{lowCardinality}},
    kind {{lowCardinality}},
    service_name {{lowCardinality}},
    tool_name {{lowCardinality}},
    tool_call_id String,
    status_code {{lowCardinality}},
    status_message String,
    start_time_unix_nano UInt64{{codec "DoubleDelta, ZSTD(1)"}},
    end_time_unix_nano UInt64{{codec "DoubleDelta, ZSTD(1)"}},
    attributes String{{codec "ZSTD(3)"}},
    received_unix_nano UInt64
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, start_time_unix_nano, span_id)
{{- if .TTL}}
TTL toDateTime(intDiv(start_time_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 8192
