-- How each rollout's calls continue one another: turns whose prompt ids start with
-- the previous prompt + response ids ("prefix", safe to merge into one trajectory)
-- versus breaks (template, retokenized, edited). Works on ClickHouse and SQLite.
SELECT
    rollout_id,
    attempt_id,
    count(*) AS calls,
    sum(CASE WHEN turn_kind = 'prefix' THEN 1 ELSE 0 END) AS prefix,
    sum(CASE WHEN turn_kind = 'template' THEN 1 ELSE 0 END) AS template_breaks,
    sum(CASE WHEN turn_kind = 'retokenized' THEN 1 ELSE 0 END) AS retokenized_breaks,
    sum(CASE WHEN turn_kind = 'edited' THEN 1 ELSE 0 END) AS edited_breaks
FROM llm_calls
WHERE rollout_id != '' AND choice_index = 0
GROUP BY rollout_id, attempt_id
ORDER BY rollout_id, attempt_id
