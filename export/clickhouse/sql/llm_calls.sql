CREATE TABLE IF NOT EXISTS {{.Table "llm_calls"}} (
{{columns "llm_calls"}}
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(toDateTime(intDiv(start_time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, sequence_id, choice_index)
{{- if .TTL}}
TTL toDateTime(intDiv(start_time_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 1024
