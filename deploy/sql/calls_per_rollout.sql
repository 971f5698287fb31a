-- Calls, tokens and errors per rollout attempt, latest first.
-- Runs on ClickHouse (18.16 and later) and on the embedded SQLite store.
SELECT
    rollout_id,
    attempt_id,
    count(DISTINCT span_id) AS requests,
    count(*) AS choices,
    sum(prompt_tokens) AS prompt_tokens,
    sum(completion_tokens) AS completion_tokens,
    sum(CASE WHEN error != '' THEN 1 ELSE 0 END) AS errors,
    max(end_time_unix_nano) AS last_end_unix_nano
FROM llm_calls
WHERE rollout_id != ''
GROUP BY rollout_id, attempt_id
ORDER BY last_end_unix_nano DESC, rollout_id, attempt_id
LIMIT 100
