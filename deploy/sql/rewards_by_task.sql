-- Episode-level rewards (sequence_id 0, name 'primary') per task: how many
-- attempts were rewarded and the mean, min and max reward (the GRPO group view).
-- Runs on ClickHouse (18.16 and later) and on the embedded SQLite store.
SELECT
    task_id,
    count(*) AS rewarded_attempts,
    avg(value) AS mean_reward,
    min(value) AS min_reward,
    max(value) AS max_reward
FROM
(
    SELECT rollout_id, attempt_id, value
    FROM rewards
    WHERE sequence_id = 0 AND name = 'primary'
) AS r
JOIN
(
    SELECT DISTINCT rollout_id, attempt_id, task_id
    FROM rollouts
) AS t USING (rollout_id, attempt_id)
GROUP BY task_id
ORDER BY task_id
