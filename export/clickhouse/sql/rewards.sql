CREATE TABLE IF NOT EXISTS {{.Table "rewards"}} (
{{columns "rewards"}}
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(toDateTime(intDiv(time_unix_nano, 1000000000)))
ORDER BY (rollout_id, attempt_id, sequence_id, name)
{{- if .TTL}}
TTL toDateTime(intDiv(time_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 8192
