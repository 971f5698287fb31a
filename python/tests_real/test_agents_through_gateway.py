"""Python agents through rollgate (issue 32, item 3).

Agents written with the `openai` Python SDK (a hand-written tool loop),
`openai-agents` (Agent + function tool on the chat-completions model) and
LangGraph (a StateGraph with langchain-openai's ChatOpenAI and a ToolNode) run
through `rollgate serve`, streamed and not, each calling a tool and answering
from its result. Every HTTP exchange the SDK makes is recorded as the SDK sent
and received it (an httpx response hook), and then, as the JavaScript
scenarios do (cmd/rollgate/loop_e2e_test.go, realvllm_e2e_test.go):

- one stored row per call and choice, found by the call's x-request-id (its
  span id), attributed to the rollout and attempt of the per-rollout base URL
  `/rollout/{r}/attempt/{a}/v1`, or of the x-rollout-id / x-attempt-id
  headers on the plain `/v1`;
- sequence ids 1, 2, ... in the order the agent made its calls, within each
  attempt (a second attempt of the same rollout starts again at 1);
- the rows' prompt and response ids, logprobs and finish reason equal the
  engine's own for the same request (a direct call to the engine that asks for
  return_token_ids and logprobs); token_source engine;
- transparency: the bytes the SDK received equal those of a direct call to the
  engine with the request the SDK sent, ids and timestamps masked;
- the agent really used the answer: the tool call the engine wrote comes back
  in the next request as a tool result with the engine's call id and the sum.

Engines: rollgate's built-in mock (no --upstream) and the real vLLM of
ROLLGATE_TEST_VLLM_URL (SmolLM2-135M-Instruct, hermes tool parser). The first
call forces a tool call (tool_choice "required" on a strict tool, which vLLM's
structured output makes even the tiny model honour), the next ones answer with
tool_choice "none" (the LangGraph graph and the plain SDK loop) or "auto"
(openai-agents resets it after a tool use; whatever the model then does is
checked the same way). Without ROLLGATE_TEST_VLLM_URL the vLLM cases fail
(conftest.vllm), never skip.
"""

import asyncio
import json
import math
import re
import sqlite3
import time

import httpx
import pytest

from conftest import Gateway

# The one tool every agent has.
TOOL_NAME = "add"
TOOL_DESC = "Add two integers and return the sum."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESC,
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
            # vLLM's structured output enforces the parameters' schema only
            # for strict tools: without it SmolLM2 writes "2 + 3".
            "strict": True,
        },
    }
]
QUESTION = "What is 2 + 3? Use the add tool."
# max_tokens per call: a forced hermes tool call takes ~48 tokens of SmolLM2.
MAX_TOKENS = 64


def add(a, b):
    return a + b


# ---------------------------------------------------------------------------
# The wire: every exchange as the SDK saw it.


class Exchange:
    def __init__(self, response):
        req = response.request
        self.method = req.method
        self.url = str(req.url)
        self.request_headers = req.headers
        self.request = json.loads(req.content) if req.content else None
        self.status = response.status_code
        self.headers = response.headers
        self.body = response.content

    @property
    def stream(self):
        return bool(self.request and self.request.get("stream"))


class Wire:
    """Records each response (and its request) as the SDK receives it. The
    hook reads the whole body first; the SDK then reads it from httpx's copy,
    byte for byte (a stream arrives at the SDK in one piece, which changes
    nothing it parses)."""

    def __init__(self):
        self.exchanges = []

    def _hook(self, response):
        response.read()
        self.exchanges.append(Exchange(response))

    async def _ahook(self, response):
        await response.aread()
        self.exchanges.append(Exchange(response))

    def client(self):
        return httpx.Client(event_hooks={"response": [self._hook]}, timeout=600)

    def async_client(self):
        return httpx.AsyncClient(event_hooks={"response": [self._ahook]}, timeout=600)


# ---------------------------------------------------------------------------
# The agents: plain framework code; only the base URL (and, for header
# attribution, two default headers) point them at rollgate.


def run_openai_sdk(base_url, headers, model, stream, wire, answer_choices=1):
    """A hand-written tool loop on the openai SDK's chat completions; the
    answer after the tool result asks for answer_choices choices (n) and
    takes the first."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", default_headers=headers, max_retries=0, http_client=wire.client())
    messages = [{"role": "user", "content": QUESTION}]
    for turn in range(2):
        kw = dict(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice="required" if turn == 0 else "none",
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        if turn == 1 and answer_choices != 1:
            # vLLM refuses n > 1 with greedy sampling: seeded sampling instead.
            kw.update(n=answer_choices, temperature=1, seed=7)
        if stream:
            with client.chat.completions.stream(**kw) as s:
                for _ in s:
                    pass
                msg = s.get_final_completion().choices[0].message
        else:
            msg = client.chat.completions.create(**kw).choices[0].message
        if not msg.tool_calls:
            return msg.content
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            args = json.loads(tc.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": str(add(args["a"], args["b"]))})
    raise AssertionError(f"no answer after the tool call: {messages}")


def run_openai_agents(base_url, headers, model, stream, wire):
    """An openai-agents Agent with a function tool on the chat-completions model."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool(name_override=TOOL_NAME, description_override=TOOL_DESC)
    def add_tool(a: int, b: int) -> int:
        return add(a, b)

    async def go():
        client = AsyncOpenAI(base_url=base_url, api_key="unused", default_headers=headers, max_retries=0, http_client=wire.async_client())
        agent = Agent(
            name="adder",
            instructions="You add numbers with the add tool.",
            tools=[add_tool],
            model=OpenAIChatCompletionsModel(model=model, openai_client=client),
            model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=MAX_TOKENS),
        )
        if stream:
            r = Runner.run_streamed(agent, QUESTION, max_turns=4)
            async for _ in r.stream_events():
                pass
        else:
            r = await Runner.run(agent, QUESTION, max_turns=4)
        return r.final_output

    return asyncio.run(go())


def run_langgraph(base_url, headers, model, stream, wire):
    """A LangGraph StateGraph: model node (langchain-openai's ChatOpenAI with
    the tool bound), ToolNode, tools_condition."""
    from langchain_core.messages import ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    @tool(TOOL_NAME, description=TOOL_DESC)
    def add_tool(a: int, b: int) -> int:
        return add(a, b)

    llm = ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key="unused",
        default_headers=headers,
        temperature=0,
        max_tokens=MAX_TOKENS,
        streaming=stream,
        max_retries=0,
        http_client=wire.client(),
    )

    def model_node(state):
        first = not any(isinstance(m, ToolMessage) for m in state["messages"])
        bound = llm.bind_tools([add_tool], tool_choice="required" if first else "none", strict=True)
        return {"messages": [bound.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("model", model_node)
    g.add_node("tools", ToolNode([add_tool]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition)
    g.add_edge("tools", "model")
    out = g.compile().invoke({"messages": [("user", QUESTION)]}, {"recursion_limit": 8})
    return out["messages"][-1].content


AGENTS = {"openai": run_openai_sdk, "openai-agents": run_openai_agents, "langgraph": run_langgraph}


# ---------------------------------------------------------------------------
# The engine's own answer, parsed the way a client assembles it.

_ID = re.compile(rb'"id":"[^"]*"')
_CREATED = re.compile(rb'"created":[0-9]+')


def mask(b):
    """What differs between two calls with the same request: ids (response,
    tool calls) and timestamps."""
    return _CREATED.sub(b'"created":0', _ID.sub(b'"id":"ID"', b))


def sse_events(body):
    out = []
    for ev in body.split(b"\n\n"):
        for line in ev.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[6:])
    return out


def parse_answer(body, stream):
    """{prompt_ids, ids{i}, logprobs{i}, text{i}, tool_calls{i}: [(id, name, args)], finish{i}, usage}."""
    a = {"prompt_ids": None, "ids": {}, "logprobs": {}, "text": {}, "tool_calls": {}, "finish": {}, "usage": None}
    docs = [body]
    if stream:
        docs = [d for d in sse_events(body) if d != b"[DONE]"]
    for d in docs:
        r = json.loads(d)
        if a["prompt_ids"] is None:
            a["prompt_ids"] = r.get("prompt_token_ids")
        if r.get("usage"):
            a["usage"] = r["usage"]
        for c in r.get("choices") or []:
            i = c["index"]
            if a["prompt_ids"] is None and c.get("prompt_token_ids"):
                a["prompt_ids"] = c["prompt_token_ids"]
            a["ids"].setdefault(i, []).extend(c.get("token_ids") or [])
            m = c.get("message") or c.get("delta") or {}
            a["text"][i] = a["text"].get(i, "") + (m.get("content") or "")
            calls = a["tool_calls"].setdefault(i, [])
            for tc in m.get("tool_calls") or []:
                k = tc.get("index", len(calls))
                while len(calls) <= k:
                    calls.append(["", "", ""])
                f = tc.get("function") or {}
                calls[k][0] += tc.get("id") or ""
                calls[k][1] += f.get("name") or ""
                calls[k][2] += f.get("arguments") or ""
            lp = (c.get("logprobs") or {}).get("content") or []
            a["logprobs"].setdefault(i, []).extend(e["logprob"] for e in lp)
            if c.get("finish_reason") is not None:
                a["finish"][i] = c["finish_reason"]
    return a


def engine_call(engine_url, request, with_ids):
    """POSTs request to the engine directly, as the SDK sent it, or (with_ids)
    asking for what rollgate asks for: prompt and response ids, logprobs, and
    usage on a stream."""
    body = dict(request)
    if with_ids:
        body["return_token_ids"] = True
        body["logprobs"] = True
        if body.get("stream"):
            body["stream_options"] = {"include_usage": True}
    r = httpx.post(engine_url + "/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, f"direct call to the engine: {r.status_code} {r.text}\n{body}"
    return r.content


# ---------------------------------------------------------------------------
# The stored rows.


def read_rows(db, rollout, attempt):
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        c.row_factory = sqlite3.Row
        return [
            dict(r)
            for r in c.execute(
                "SELECT * FROM llm_calls WHERE rollout_id = ? AND attempt_id = ? ORDER BY sequence_id, choice_index",
                (rollout, attempt),
            )
        ]
    finally:
        c.close()


def wait_rows(gw, rollout, attempt, n):
    """The rows of (rollout, attempt) once there are n; capture is
    asynchronous, so this polls the store (it cannot tell us) for up to 60 s."""
    deadline = time.monotonic() + 60
    while True:
        rows = read_rows(gw.db, rollout, attempt)
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def check_exchanges(gw, wire, rollout, attempt, base_url, via_headers):
    """Everything the module docstring promises, for the exchanges of one run."""
    ex = wire.exchanges
    assert ex, "the agent made no call"
    for e in ex:
        assert e.method == "POST" and e.url == base_url + "/chat/completions", (e.method, e.url)
        assert e.status == 200, f"{e.url}: {e.status} {e.body[:500]!r}"
        if via_headers:
            assert (e.request_headers.get("x-rollout-id"), e.request_headers.get("x-attempt-id")) == (rollout, attempt)
        # rollgate says where it put the call.
        assert (e.headers.get("x-rollout-id"), e.headers.get("x-attempt-id")) == (rollout, attempt), dict(e.headers)

    answers = [parse_answer(e.body, e.stream) for e in ex]
    want_rows = sum(len(a["finish"]) for a in answers)
    rows = wait_rows(gw, rollout, attempt, want_rows)
    assert len(rows) == want_rows, f"{len(rows)} rows for {len(ex)} calls with {want_rows} choices\n{open(gw.log_path).read()}"

    for k, (e, got) in enumerate(zip(ex, answers), start=1):
        span, seq = e.headers["x-request-id"], int(e.headers["x-sequence-id"])
        # Sequence ids follow the agent's calls, from 1 within the attempt.
        assert seq == k, f"call {k} of the agent has sequence id {seq}"
        mine = [r for r in rows if r["span_id"] == span]
        assert [r["choice_index"] for r in mine] == sorted(got["finish"]), (span, [r["choice_index"] for r in mine])
        assert all(r["sequence_id"] == k for r in mine), [r["sequence_id"] for r in mine]

        # Transparency: the SDK got the engine's bytes. A stream's chunking is
        # the engine's own and may differ between two identical calls of a
        # loaded vLLM (see TestRealVLLM): up to 4 direct calls.
        for attempt_no in range(4):
            direct = engine_call(gw.engine_url, e.request, with_ids=False)
            if mask(direct) == mask(e.body):
                break
        else:
            raise AssertionError(
                f"call {k}: the SDK's bytes differ from a direct call's\nrequest: {json.dumps(e.request)}\n"
                f" direct: {mask(direct)!r}\n via rollgate: {mask(e.body)!r}"
            )
        assert b'token_ids":[' not in e.body, f"injected token ids reached the SDK: {e.body[:500]!r}"
        if not e.request.get("logprobs"):
            assert b'"logprob":' not in e.body, f"injected logprobs reached the SDK: {e.body[:500]!r}"

        # The rows hold the engine's ids and logprobs for this request.
        ref = parse_answer(engine_call(gw.engine_url, e.request, with_ids=True), e.stream)
        assert ref["text"] == got["text"] and ref["finish"] == got["finish"], (
            f"call {k}: the reference call sampled another answer: {ref['text']} {ref['finish']}, the SDK's {got['text']} {got['finish']}"
        )
        assert ref["prompt_ids"], f"call {k}: the engine gave no prompt ids"
        for r in mine:
            i = r["choice_index"]
            where = f"call {k} (sequence {seq}) choice {i}"
            assert r["endpoint"] == "/v1/chat/completions" and bool(r["stream"]) == e.stream and r["http_status"] == 200, (where, r)
            assert (r["token_source"], r["prompt_token_source"], r["response_token_source"], r["token_check"]) == (
                "engine",
                "engine",
                "engine",
                "",
            ), (where, r["token_source"], r["prompt_token_source"], r["response_token_source"], r["token_check"])
            assert json.loads(r["prompt_token_ids"]) == ref["prompt_ids"], f"{where}: stored prompt ids differ from the engine's"
            ids = json.loads(r["response_token_ids"])
            assert ids and ids == ref["ids"][i], f"{where}: stored response ids {ids}, the engine's {ref['ids'][i]}"
            lps = json.loads(r["response_logprobs"])
            assert len(lps) == len(ids) and all(
                math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-5) for x, y in zip(lps, ref["logprobs"][i])
            ), f"{where}: stored logprobs {lps}, the engine's {ref['logprobs'][i]}"
            assert r["finish_reason"] == got["finish"][i], (where, r["finish_reason"], got["finish"][i])
            assert (r["prompt_tokens"], r["completion_tokens"]) == (
                ref["usage"]["prompt_tokens"],
                ref["usage"]["completion_tokens"],
            ), (where, r["prompt_tokens"], r["completion_tokens"], ref["usage"])

    # The agent used what the engine wrote: the first call's tool call comes
    # back in the second request, same id, with the sum of the engine's
    # arguments.
    first = answers[0]
    assert first["finish"][0] == "tool_calls" and len(first["tool_calls"][0]) == 1, (
        f"the first call (tool_choice required) made no tool call: {first}"
    )
    call_id, name, arguments = first["tool_calls"][0][0]
    assert name == TOOL_NAME, name
    args = json.loads(arguments)
    assert len(ex) >= 2, "the agent stopped after the tool call"
    tool_msgs = [m for m in ex[1].request["messages"] if m.get("role") == "tool"]
    assert [(m["tool_call_id"], str(m["content"])) for m in tool_msgs] == [(call_id, str(add(args["a"], args["b"])))], tool_msgs
    return answers


# ---------------------------------------------------------------------------
# The tests.


@pytest.fixture(scope="module")
def vllm_gateway(rollgate_bin, vllm, tmp_path_factory):
    """rollgate serve in front of the real vLLM (fails without it: conftest.vllm)."""
    d = tmp_path_factory.mktemp("vllm")
    g = Gateway(rollgate_bin, vllm[0], str(d / "rollgate.db"), str(d / "serve.log"))
    yield g
    g.stop()


def run_and_check(gw, model, framework, attribution, stream, rollout, attempt):
    """Runs one agent in (rollout, attempt), checks its exchanges and rows,
    returns the engine's answers in call order."""
    if attribution == "path":
        base_url, headers = f"{gw.url}/rollout/{rollout}/attempt/{attempt}/v1", None
    else:
        base_url, headers = gw.url + "/v1", {"x-rollout-id": rollout, "x-attempt-id": attempt}
    wire = Wire()
    final = AGENTS[framework](base_url, headers, model, stream, wire)
    answers = check_exchanges(gw, wire, rollout, attempt, base_url, attribution == "headers")
    # The agent's final answer is the engine's last text.
    assert final == answers[-1]["text"][0], (final, answers[-1]["text"])
    return answers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("attribution", ["path", "headers"])
@pytest.mark.parametrize("framework", list(AGENTS))
def test_agent_on_mock(mock_gateway, framework, attribution, stream):
    rollout = f"{framework}-{attribution}-{'stream' if stream else 'whole'}"
    # Two attempts of the same rollout: each numbers its calls from 1.
    for attempt in ["1", "2"]:
        answers = run_and_check(mock_gateway, "mock-model", framework, attribution, stream, rollout, attempt)
        # The mock: a tool call, then (the last message a tool result) text.
        assert len(answers) == 2 and answers[1]["finish"][0] == "stop" and answers[1]["text"][0], answers


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_sdk_two_choices_on_mock(mock_gateway, stream):
    """n = 2 on the answer: one row per choice, both under its call's sequence id."""
    rollout = f"openai-n2-{'stream' if stream else 'whole'}"
    base_url = f"{mock_gateway.url}/rollout/{rollout}/attempt/1/v1"
    wire = Wire()
    final = run_openai_sdk(base_url, None, "mock-model", stream, wire, answer_choices=2)
    answers = check_exchanges(mock_gateway, wire, rollout, "1", base_url, False)
    assert [sorted(a["finish"]) for a in answers] == [[0], [0, 1]], [a["finish"] for a in answers]
    assert final == answers[1]["text"][0]
    rows = read_rows(mock_gateway.db, rollout, "1")
    assert [(r["sequence_id"], r["choice_index"]) for r in rows] == [(1, 0), (2, 0), (2, 1)], rows


# The real engine takes seconds per call: each framework runs a whole answer
# attributed by path and a stream attributed by headers.
@pytest.mark.parametrize("stream,attribution", [(False, "path"), (True, "headers")], ids=["whole-path", "stream-headers"])
@pytest.mark.parametrize("framework", list(AGENTS))
def test_agent_on_vllm(vllm_gateway, vllm, framework, attribution, stream):
    rollout = f"vllm-{framework}-{attribution}-{'stream' if stream else 'whole'}"
    run_and_check(vllm_gateway, vllm[2], framework, attribution, stream, rollout, "1")
