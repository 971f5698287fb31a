CREATE TABLE IF NOT EXISTS {{.Table "rollouts"}} (
{{columns "rollouts"}}
)
ENGINE = ReplacingMergeTree(updated_unix_nano)
ORDER BY (rollout_id, attempt_id)
{{- if .TTL}}
TTL toDateTime(intDiv(updated_unix_nano, 1000000000)) + INTERVAL {{.TTLDays}} DAY
{{- end}}
SETTINGS index_granularity = 8192
