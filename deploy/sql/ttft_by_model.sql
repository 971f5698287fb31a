-- Time to first token of streamed calls per model and backend, in milliseconds.
-- Runs on ClickHouse (18.16 and later) and on the embedded SQLite store.
-- On ClickHouse, quantiles(0.5, 0.95)(ttft_nano) gives percentiles as well.
SELECT
    model,
    backend,
    count(*) AS streamed_choices,
    avg(ttft_nano) / 1000000.0 AS avg_ttft_ms,
    min(ttft_nano) / 1000000.0 AS min_ttft_ms,
    max(ttft_nano) / 1000000.0 AS max_ttft_ms,
    avg(end_time_unix_nano - start_time_unix_nano) / 1000000.0 AS avg_latency_ms
FROM llm_calls
WHERE stream = 1 AND ttft_nano > 0
GROUP BY model, backend
ORDER BY avg_ttft_ms DESC, model, backend
