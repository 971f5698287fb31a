-- Where token ids came from (engine, tokenize, retokenized, none) per model,
-- and how many calls failed a token-id check (token_check != '').
-- Runs on ClickHouse (18.16 and later) and on the embedded SQLite store.
SELECT
    model,
    token_source,
    count(*) AS choices,
    sum(CASE WHEN token_check != '' THEN 1 ELSE 0 END) AS failed_checks,
    sum(completion_tokens) AS completion_tokens
FROM llm_calls
GROUP BY model, token_source
ORDER BY model, choices DESC, token_source
