"""The `openai` Python SDK's own retries through `rollgate serve` (issue 32,
item 2: retries are one call).

The SDK (max_retries=1, a 1 s timeout) sends every try with
x-stainless-retry-count (0, then 1) and the same body. rollgate's built-in
mock engine delays or fails only the first try (x-mock-first-try-only), so
the SDK's retry is answered. Per scenario: what the agent got, the rows
(both tries under sequence id 1: retry_count 0 and 1, retry_of the first
try's span id), and what `rollgate bridge` makes of them (one sample, the
answered try's; the other excluded as superseded_retry; no air_backend_error).
A stream that already started is not retried by the SDK: one row.
"""

import json
import sqlite3
import time

import openai
import pytest

FIRST_TRY_ONLY = {"x-mock-first-try-only": "1"}

# rollout: (stream, headers for the mock, whether the SDK gets an answer)
SCENARIOS = {
    "ttft-whole": (False, {"x-mock-ttft-ms": "3000"}, True),
    "ttft-stream": (True, {"x-mock-ttft-ms": "3000"}, True),
    "fail-503": (False, {"x-mock-fail": "status=503"}, True),
    "hang-whole": (False, {"x-mock-fail": "hang"}, True),
    "itl-stream": (True, {"x-mock-itl-ms": "1500"}, False),
}


def rows_of(db, rollout, n):
    """The rows of (rollout, attempt a) once there are n (capture is
    asynchronous: polls the store for up to 60 s), by sequence id and try."""
    deadline = time.monotonic() + 60
    while True:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            c.row_factory = sqlite3.Row
            rows = [
                dict(r)
                for r in c.execute(
                    "SELECT span_id, sequence_id, retry_count, retry_of, http_status, error, response_token_ids"
                    " FROM llm_calls WHERE rollout_id = ? AND attempt_id = 'a'"
                    " ORDER BY sequence_id, retry_count, choice_index",
                    (rollout,),
                )
            ]
        finally:
            c.close()
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def call(gw, rollout, stream, headers):
    client = openai.OpenAI(
        base_url=f"{gw.url}/rollout/{rollout}/attempt/a/v1", api_key="none", max_retries=1, timeout=1.0
    )
    kwargs = dict(
        model="mock-model",
        messages=[{"role": "user", "content": f"question of {rollout}"}],
        max_tokens=8,
        extra_headers={**FIRST_TRY_ONLY, **headers},
    )
    if not stream:
        return client.chat.completions.create(**kwargs).choices[0].message.content
    text = ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for ch in chunk.choices:
            text += ch.delta.content or ""
    return text


def describe(rows):
    return [
        (r["sequence_id"], r["retry_count"], r["http_status"], r["error"], len(json.loads(r["response_token_ids"] or "[]")))
        for r in rows
    ]


def test_sdk_retries_are_one_call(mock_gateway, tmp_path):
    gw = mock_gateway
    table = []
    for rollout, (stream, headers, answered) in SCENARIOS.items():
        if answered:
            got = call(gw, rollout, stream, headers)
            assert got, f"{rollout}: empty answer"
            rows = rows_of(gw.db, rollout, 2)
            table.append((rollout, "answer", describe(rows)))
            assert len(rows) == 2, (rollout, describe(rows))
            first, retry = rows
            assert (first["sequence_id"], retry["sequence_id"]) == (1, 1), (rollout, describe(rows))
            assert (first["retry_count"], first["retry_of"]) == (0, ""), (rollout, describe(rows))
            assert (retry["retry_count"], retry["retry_of"]) == (1, first["span_id"]), (rollout, describe(rows))
            assert first["error"] and retry["http_status"] == 200 and not retry["error"], (rollout, describe(rows))
        else:
            with pytest.raises(openai.APITimeoutError):
                call(gw, rollout, stream, headers)
            rows = rows_of(gw.db, rollout, 1)
            table.append((rollout, "APITimeoutError", describe(rows)))
            assert [(r["sequence_id"], r["retry_count"]) for r in rows] == [(1, 0)], (rollout, describe(rows))
    for line in table:
        print(*line)

    retried = [r for r, (_, _, answered) in SCENARIOS.items() if answered]
    out = str(tmp_path / "b.jsonl")
    summary = gw.bridge("--out", out, "--status", "", "--estimator", "none", "--rollouts", ",".join(retried))
    print(summary)
    samples = [json.loads(line) for line in open(out)]
    by_rollout = {}
    for s in samples:
        by_rollout.setdefault(s["rollout_id"], []).append(s["sequence_ids"])
    assert by_rollout == {r: [[1]] for r in retried}, (by_rollout, summary)
    assert f"superseded_retry={len(retried)}" in summary, summary
    assert "air_backend_error" not in summary, summary
