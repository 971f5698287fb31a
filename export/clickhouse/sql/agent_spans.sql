CREATE TABLE IF NOT EXISTS {{.Table "agent_spans"}} (
{{columns "agent_spans"}}
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, start_time_unix_nano, span_id)
{{- if .TTL}}
TTL toDateTime(intDiv(start_time_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 8192
