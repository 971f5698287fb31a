CREATE TABLE IF NOT EXISTS {{.Table "rollouts"}} (
    rollout_id String,
    attempt_id String,
    task_id String,
    group_id String,
    status {{lowCardinality}},
    metadata String{{codec "ZSTD(3)"}},
    created_unix_nano UInt64,
    updated_unix_nano UInt64
)
ENGINE = ReplacingMergeTree(updated_unix_nano)
ORDER BY (rollout_id, attempt_id)
{{- if .TTL}}
TTL toDateTime(intDiv(updated_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 8192
