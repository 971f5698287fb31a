"""Anthropic Messages agents through rollgate (issue 32, item 1).

An agent on the official `anthropic` Python SDK (a hand-written tool loop:
a forced `add` tool call, the tool's result sent back as a `tool_result`,
then the answer) runs through `rollgate serve` on POST /v1/messages, streamed
(`messages.stream`) and not, attributed by the per-rollout base URL
`/rollout/{r}/attempt/{a}` (the SDK appends /v1/messages) or by the
x-rollout-id / x-attempt-id default headers. Then:

- the SDK parsed every answer (a tool_use block with an object input, then
  text; stop reasons tool_use and end_turn / max_tokens);
- one row per call, endpoint /v1/messages, sequence ids 1, 2 in call order,
  token_source engine;
- the rows' prompt and response ids equal the engine's own for the row's
  request (the chat request rollgate sent, posted straight to the engine
  asking for return_token_ids), and the SDK's text and tool input are the
  engine's answer;
- the agent really used the answer: the second request carries the tool
  call's id as the tool message's tool_call_id and the sum as its content.

Engines: rollgate's built-in mock and the real vLLM of ROLLGATE_TEST_VLLM_URL
(fails without it: conftest.vllm).
"""

import json

import httpx
import pytest

# vllm_gateway (a module fixture) and the row reader are the Python agents' tests'; mock_gateway is conftest's.
from test_agents_through_gateway import vllm_gateway, wait_rows  # noqa: F401

TOOLS = [
    {
        "name": "add",
        "description": "Add two integers and return the sum.",
        # strict: vLLM's structured output makes even the tiny model honour it.
        "strict": True,
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    }
]
QUESTION = "What is 17 + 25? Use the add tool."
MAX_TOKENS = 96


def run_anthropic(base_url, headers, model, stream):
    """The tool loop; returns the SDK's two messages."""
    import anthropic

    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-unused", default_headers=headers, max_retries=0)
    messages = [{"role": "user", "content": QUESTION}]
    out = []
    for turn in range(2):
        kw = dict(
            model=model,
            max_tokens=MAX_TOKENS,
            system=[{"type": "text", "text": "You are a calculator."}],
            messages=messages,
            tools=TOOLS,
            tool_choice={"type": "any"} if turn == 0 else {"type": "none"},
            # anthropic 2.x has no temperature argument (the API dropped it);
            # greedy sampling makes the engine's answer repeatable.
            extra_body={"temperature": 0},
        )
        if stream:
            with client.messages.stream(**kw) as s:
                for _ in s:
                    pass
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kw)
        out.append(msg)
        if turn == 0:
            uses = [b for b in msg.content if b.type == "tool_use"]
            # max_tokens when the tiny model runs on after the call (vLLM's own route says the same).
            assert msg.stop_reason in ("tool_use", "max_tokens") and len(uses) == 1, msg
            use = uses[0]
            assert use.name == "add" and isinstance(use.input, dict), use
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
            total = str(int(use.input["a"]) + int(use.input["b"]))
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": total}]})
    assert out[1].stop_reason in ("end_turn", "max_tokens"), out[1]
    assert [b.type for b in out[1].content] == ["text"], out[1]
    return out


def engine_answer(engine_url, request):
    """The engine's own whole answer to a stored chat request, with ids."""
    body = dict(request)
    body["stream"] = False
    body.pop("stream_options", None)
    body["return_token_ids"] = True
    r = httpx.post(engine_url + "/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, f"direct call to the engine: {r.status_code} {r.text}"
    return r.json()


def run_and_check(gw, model, attribution, stream, rollout):
    if attribution == "path":
        base_url, headers = f"{gw.url}/rollout/{rollout}/attempt/1", None
    else:
        base_url, headers = gw.url, {"x-rollout-id": rollout, "x-attempt-id": "1"}
    msgs = run_anthropic(base_url, headers, model, stream)
    rows = wait_rows(gw, rollout, "1", 2)
    assert [(r["sequence_id"], r["endpoint"], r["token_source"], r["stream"]) for r in rows] == [
        (1, "/v1/messages", "engine", int(stream)),
        (2, "/v1/messages", "engine", int(stream)),
    ], rows
    for i, (row, msg) in enumerate(zip(rows, msgs)):
        request = json.loads(row["request_body"])
        ans = engine_answer(gw.engine_url, request)
        ch = ans["choices"][0]
        assert json.loads(row["prompt_token_ids"]) == ans["prompt_token_ids"], f"call {i}: prompt ids differ from the engine's"
        assert json.loads(row["response_token_ids"]) == ch["token_ids"], f"call {i}: response ids differ from the engine's"
        if i == 0:
            use = next(b for b in msg.content if b.type == "tool_use")
            (tc,) = ch["message"]["tool_calls"]
            assert use.name == tc["function"]["name"] and use.input == json.loads(tc["function"]["arguments"]), (use, tc)
        else:
            assert msg.content[0].text == ch["message"]["content"], (msg.content[0].text, ch["message"]["content"])
    # The second request carries the tool's result under the call's id.
    use = next(b for b in msgs[0].content if b.type == "tool_use")
    second = json.loads(rows[1]["request_body"])["messages"]
    tool = [m for m in second if m["role"] == "tool"]
    assert tool == [{"role": "tool", "content": str(int(use.input["a"]) + int(use.input["b"])), "tool_call_id": use.id}], second
    assert second[0] == {"role": "system", "content": "You are a calculator."}, second
    assert "sk-ant-unused" not in rows[0]["request_body"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("attribution", ["path", "headers"])
def test_anthropic_on_mock(mock_gateway, attribution, stream):
    run_and_check(mock_gateway, "mock-model", attribution, stream, f"anth-{attribution}-{'stream' if stream else 'whole'}")


@pytest.mark.parametrize("stream,attribution", [(False, "path"), (True, "headers")], ids=["whole-path", "stream-headers"])
def test_anthropic_on_vllm(vllm_gateway, vllm, attribution, stream):
    run_and_check(vllm_gateway, vllm[2], attribution, stream, f"vllm-anth-{attribution}-{'stream' if stream else 'whole'}")


def test_anthropic_errors_on_mock(mock_gateway):
    """The SDK raises Anthropic's error types with the field named."""
    import anthropic

    client = anthropic.Anthropic(base_url=f"{mock_gateway.url}/rollout/anth-bad/attempt/1", api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="mock-model", max_tokens=8, messages=[{"role": "user", "content": [{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}]}])
    assert e.value.body["type"] == "error" and "messages[0].content[0].type" in e.value.body["error"]["message"], e.value.body


def test_anthropic_image_refused_on_vllm(vllm_gateway, vllm):
    """An image to a text-only model: the engine's refusal, as an Anthropic
    error the SDK raises (never an answer that silently ignored the image)."""
    import anthropic

    client = anthropic.Anthropic(base_url=f"{vllm_gateway.url}/rollout/vllm-anth-image/attempt/1", api_key="x", max_retries=0)
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
    with pytest.raises(anthropic.APIStatusError) as e:
        client.messages.create(
            model=vllm[2],
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}, {"type": "text", "text": "What is this?"}]}],
        )
    assert 400 <= e.value.status_code < 500 and e.value.body["type"] == "error", (e.value.status_code, e.value.body)
    print("vLLM's refusal:", e.value.status_code, e.value.body)
