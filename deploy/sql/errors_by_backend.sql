-- Failed calls (an error or an HTTP status >= 400) per backend and status.
-- Runs on ClickHouse (18.16 and later) and on the embedded SQLite store.
SELECT
    backend,
    http_status,
    count(*) AS choices,
    max(error) AS example_error
FROM llm_calls
WHERE error != '' OR http_status >= 400
GROUP BY backend, http_status
ORDER BY choices DESC, backend, http_status
