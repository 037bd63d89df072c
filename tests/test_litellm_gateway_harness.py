"""A real LiteLLM proxy (tests/litellm_gateway.py) in front of the mock provider, and its `headroom` guardrail.

These tests check the harness and turn the Headroom contract that LiteLLM speaks
(tests/gateways/HEADROOM_CONTRACT.md) into evidence: a tiny fake Headroom
service, written here, records every request LiteLLM makes to it, and the
assertions pin what LiteLLM sends to POST /v1/compress (which rows, which
headers, which fields), what it accepts back, what a failure gives the client,
and how it runs the `headroom_retrieve` round trip through GET /v1/retrieve/{hash}.

One proxy starts for the module (~10 s): the guardrail `headroom` (pre_call,
default_on) at the fake, and a second, opt-in one (`headroom-open`, fail_open)
at a closed port. The plain route (no guardrail call) is checked with requests
that leave the guardrail nothing to send; a second proxy without a guardrail
would cost another ~10 s of CPU for the same route.

Without tests/gateways/.venv the tests skip with the install command; under CI=true they fail.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest
import uvicorn
from litellm_gateway import INSTALL, LiteLLMGateway, installed
from mock_upstream import MockUpstream
from starlette.requests import Request
from starlette.responses import JSONResponse

GUARDRAIL_KEY = "sk-headroom-fake"
HASH = "0123456789abcdef01234567"  # 24 hex: what Headroom issues, and what older LiteLLM releases parse from text
MARKER = f"[200 items compressed to 3. Retrieve more: hash={HASH}]"
ORIGINAL = "line 1\nline 2\nline 7: the one the model wants\n" * 20
pytestmark = pytest.mark.timeout(120)  # the first test carries the proxy's start, slower on a loaded machine
SHELL_TOOL = {"type": "function", "function": {"name": "shell", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}
RETRIEVE_TOOL = {  # litellm/proxy/guardrails/guardrail_hooks/headroom/headroom.py _build_headroom_retrieve_tool
    "type": "function",
    "function": {
        "name": "headroom_retrieve",
        "description": ("Retrieve original content that was compressed by Headroom. "
                        "Call this when you encounter a compression marker containing a hash."),
        "parameters": {
            "type": "object",
            "properties": {
                "hash": {"type": "string", "description": "The hex hash from the compression marker."},
                "query": {"type": "string", "description": "Optional search query for BM25-ranked retrieval."},
            },
            "required": ["hash"],
        },
    },
}


def call(id_: str, cmd: str = "ls") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": id_, "type": "function", "function": {"name": "shell", "arguments": json.dumps({"cmd": cmd})}}]}


def result(id_: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": id_, "content": text}


# A long agent session: system, three user turns, three tool exchanges (the last one open), an answer.
T1, T2, T3 = ("T1 " + "a" * 400, "T2 " + "b" * 400, "T3 " + "c" * 400)
AGENT_SESSION: list[dict[str, Any]] = [
    {"role": "system", "content": "SYS you are an agent"},
    {"role": "user", "content": "U1 list the files"},
    call("call_a"), result("call_a", T1),
    {"role": "assistant", "content": "A1 there are files"},
    {"role": "user", "content": "U2 show one"},
    call("call_b", "cat x"), result("call_b", T2),
    {"role": "user", "content": "U3 and the directory?"},
    call("call_c", "pwd"), result("call_c", T3),
]


# --------------------------------------------------------------------------- the fake Headroom service

@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    json: Any


def echo(body: dict[str, Any]) -> tuple[int, Any]:
    """Every row back unchanged, with the statistics fields Headroom returns."""
    return 200, {"messages": body["messages"], "tokens_before": 1000, "tokens_after": 1000, "tokens_saved": 0,
                 "compression_ratio": 1.0, "transforms_applied": [], "ccr_hashes": []}


@dataclass
class FakeHeadroom:
    """POST /v1/compress answers `compress(body)`; GET /v1/retrieve/{hash} answers from `originals` or 404."""

    compress: Callable[[dict[str, Any]], tuple[int, Any]] = echo
    originals: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""

    def reset(self) -> None:
        self.compress, self.originals, self.seen = echo, {}, []

    def compress_calls(self) -> list[Seen]:
        return [s for s in self.seen if (s.method, s.path) == ("POST", "/v1/compress")]

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        raw = await request.body()
        seen = Seen(request.method, request.url.path, dict(request.query_params),
                    {k.lower(): v for k, v in request.headers.items()}, json.loads(raw) if raw else None)
        self.seen.append(seen)
        if (seen.method, seen.path) == ("POST", "/v1/compress"):
            status, body = self.compress(seen.json)
        elif seen.method == "GET" and seen.path.startswith("/v1/retrieve/"):
            hash_ = seen.path.rsplit("/", 1)[1]
            found = hash_ in self.originals
            status, body = (200, {"hash": hash_, "original_content": self.originals[hash_]}) if found \
                else (404, {"error": "not found"})
        else:
            status, body = 404, {"error": "no such route"}
        await JSONResponse(body, status)(scope, receive, send)

    def serve(self) -> Iterator[FakeHeadroom]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(self.app, interface="asgi3", lifespan="off",
                                               log_level="warning", access_log=False))
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        try:
            yield self
        finally:
            server.should_exit = True
            thread.join(timeout=5)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def fake_headroom() -> Iterator[FakeHeadroom]:
    yield from FakeHeadroom().serve()


@pytest.fixture(scope="module")
def gateway(mock_upstream: MockUpstream, fake_headroom: FakeHeadroom) -> Iterator[LiteLLMGateway]:
    """One proxy for the module (a start costs ~10 s of CPU): `headroom` default_on, plus `headroom-open`."""
    if not installed():
        if os.environ.get("CI") == "true":
            pytest.fail(f"tests/gateways/.venv is missing; install LiteLLM: {INSTALL} (.ci/run does)",
                        pytrace=False)
        pytest.skip(f"LiteLLM is not installed; to run the gateway tests: {INSTALL}")
    fail_open = {"guardrail_name": "headroom-open", "litellm_params": {
        "guardrail": "headroom", "mode": "pre_call", "api_base": f"http://127.0.0.1:{closed_port()}",
        "default_on": False, "unreachable_fallback": "fail_open", "timeout": 5}}
    with LiteLLMGateway(mock_upstream.base_url, fake_headroom.url, GUARDRAIL_KEY,
                        extra_guardrails=[fail_open]) as gw:
        yield gw


@pytest.fixture
def fake(fake_headroom: FakeHeadroom) -> FakeHeadroom:
    fake_headroom.reset()
    return fake_headroom


def chat_client(gw: LiteLLMGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=gw.master_key, max_retries=0, timeout=30)


def chat_calls(upstream: MockUpstream) -> list[Any]:
    return [r.json for r in upstream.requests if r.path == "/v1/chat/completions"]


# --------------------------------------------------------------------------- (a) the harness

def test_config_without_a_guardrail_url_has_no_guardrail() -> None:
    config = LiteLLMGateway("http://127.0.0.1:1/v1", None).config()
    assert "guardrails" not in config
    assert [(m["model_name"], m["litellm_params"]["model"], m["litellm_params"]["api_base"])
            for m in config["model_list"]] == [
        ("gpt-4o-mini", "openai/gpt-4o-mini", "http://127.0.0.1:1/v1"),
        ("agent-model", "openai/agent-model", "http://127.0.0.1:1/v1"),
        ("claude-opus-5-5", "anthropic/claude-opus-5-5", "http://127.0.0.1:1"),
    ]


def test_chat_completion_through_litellm_reaches_the_mock(gateway: LiteLLMGateway, upstream: MockUpstream,
                                                          fake: FakeHeadroom) -> None:
    gw = gateway
    assert gw.startup_seconds is not None
    reply = chat_client(gw).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content == "ok"
    (sent,) = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert sent.headers["authorization"] == "Bearer sk-mock-upstream"  # the config's key, not the master key
    assert sent.json["model"] == "gpt-4o-mini"
    assert sent.json["messages"] == [{"role": "user", "content": "hello"}]
    # a lone user row is the live instruction: the guardrail has nothing to send and makes no call
    assert fake.seen == []


def test_messages_through_litellm_reach_the_mock(gateway: LiteLLMGateway, upstream: MockUpstream,
                                                 fake: FakeHeadroom) -> None:
    gw = gateway
    client = anthropic.Anthropic(base_url=gw.url, api_key=gw.master_key, max_retries=0, timeout=30)
    reply = client.messages.create(model=gw.anthropic_models[0], max_tokens=64,
                                   messages=[{"role": "user", "content": "hello"}])
    assert [b.text for b in reply.content if b.type == "text"] == ["ok"]
    (sent,) = [r for r in upstream.requests if r.path == "/v1/messages"]
    assert sent.headers["x-api-key"] == "sk-mock-upstream"
    assert sent.json["messages"] == [{"role": "user", "content": "hello"}]
    assert fake.seen == []


# --------------------------------------------------------------------------- (b) what LiteLLM posts to /v1/compress

def test_compress_gets_only_older_user_and_tool_rows(gateway: LiteLLMGateway, upstream: MockUpstream,
                                                     fake: FakeHeadroom) -> None:
    chat_client(gateway).chat.completions.create(
        model="agent-model", messages=AGENT_SESSION, tools=[SHELL_TOOL],
        extra_headers={"x-session-id": "s-1", "x-request-id": "r-1"}, user="end-user-1")
    (posted,) = fake.compress_calls()
    # the request: POST {api_base}/v1/compress, the guardrail's key as a Bearer token, JSON, nothing of the client's
    assert posted.headers["authorization"] == f"Bearer {GUARDRAIL_KEY}"
    assert posted.headers["content-type"] == "application/json"
    assert posted.headers["user-agent"].startswith("litellm/")
    assert not {"x-session-id", "x-request-id", "x-api-key"} & set(posted.headers)
    assert set(posted.json) == {"messages", "model"}
    assert posted.json["model"] == "agent-model"  # the name the client asked for
    # withheld: system rows, every assistant row, the last user row, the last assistant's tool exchange
    assert posted.json["messages"] == [
        {"role": "user", "content": "U1 list the files"},
        result("call_a", T1),
        {"role": "user", "content": "U2 show one"},
        result("call_b", T2),
    ]
    # an unchanged answer (and no ccr_hashes) leaves the request as the client sent it: no retrieve tool
    (sent,) = chat_calls(upstream)
    assert [m.get("content") for m in sent["messages"]] == [m["content"] for m in AGENT_SESSION]
    assert sent["tools"] == [SHELL_TOOL]


def test_compress_never_gets_the_cached_prefix_and_gets_text_parts_joined(
        gateway: LiteLLMGateway, fake: FakeHeadroom) -> None:
    session = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "U1"},
        call("call_a"),
        {"role": "tool", "tool_call_id": "call_a",
         "content": [{"type": "text", "text": "T1 cached", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [{"type": "text", "text": "U2 part a"}, {"type": "text", "text": "U2 part b"}]},
        call("call_b"), result("call_b", "T2"),
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "U3"},
    ]
    chat_client(gateway).chat.completions.create(model="agent-model", messages=session)
    (posted,) = fake.compress_calls()
    # rows 0..3 end at the last cache_control breakpoint: withheld; all-text parts arrive as one string
    assert posted.json["messages"] == [
        {"role": "user", "content": "U2 part a\n\nU2 part b"},
        result("call_b", "T2"),
    ]


def test_nothing_compressible_means_no_call(gateway: LiteLLMGateway, upstream: MockUpstream,
                                            fake: FakeHeadroom) -> None:
    chat_client(gateway).chat.completions.create(
        model="agent-model", messages=[{"role": "system", "content": "SYS"}, {"role": "user", "content": "hi"}])
    assert fake.seen == []
    assert len(chat_calls(upstream)) == 1


def test_messages_endpoint_sends_tool_results_as_tool_rows(gateway: LiteLLMGateway, fake: FakeHeadroom) -> None:
    gw = gateway
    client = anthropic.Anthropic(base_url=gw.url, api_key=gw.master_key, max_retries=0, timeout=30)
    client.messages.create(
        model=gw.anthropic_models[0], max_tokens=64, system="SYS",
        tools=[{"name": "shell", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}],
        messages=[
            {"role": "user", "content": "U1"},
            {"role": "assistant", "content": [{"type": "text", "text": "A1"},
                                              {"type": "tool_use", "id": "toolu_1", "name": "shell",
                                               "input": {"cmd": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "R1"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "shell",
                                               "input": {"cmd": "cat"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                          "content": [{"type": "text", "text": "R2"}]}]},
            {"role": "assistant", "content": "A3"},
            {"role": "user", "content": "U4"},
        ])
    (posted,) = fake.compress_calls()
    assert posted.json == {"model": gw.anthropic_models[0], "messages": [
        {"role": "user", "content": "U1"},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "R1"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "R2"},
    ]}


def test_responses_endpoint_sends_developer_rows_and_older_outputs(gateway: LiteLLMGateway, fake: FakeHeadroom) -> None:
    chat_client(gateway).responses.create(
        model="agent-model", instructions="INSTR",
        tools=[{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}],
        input=[
            {"role": "developer", "content": "DEV"},
            {"role": "user", "content": "U1"},
            {"type": "function_call", "call_id": "fc_1", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "fc_1", "output": "OUT1"},
            {"role": "assistant", "content": "A1"},
            {"role": "user", "content": "U2"},
            {"type": "function_call", "call_id": "fc_2", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "fc_2", "output": "OUT2"},
        ])
    (posted,) = fake.compress_calls()
    # `instructions` is not a row; a developer row is not a system row, so it is sent
    assert posted.json["messages"] == [
        {"role": "developer", "content": "DEV"},
        {"role": "user", "content": "U1"},
        {"role": "tool", "content": "OUT1", "tool_call_id": "fc_1"},
    ]


# --------------------------------------------------------------------------- what LiteLLM accepts back

def test_compressed_rows_are_applied_and_hashes_bring_the_retrieve_tool(
        gateway: LiteLLMGateway, upstream: MockUpstream, fake: FakeHeadroom) -> None:
    def compress(body: dict[str, Any]) -> tuple[int, Any]:
        rows = [dict(m, content=MARKER) if m.get("tool_call_id") == "call_a" else m for m in body["messages"]]
        # only `messages` is required; tokens_saved is derived from tokens_before - tokens_after when absent
        return 200, {"messages": rows, "tokens_before": 900, "tokens_after": 300, "ccr_hashes": [HASH.upper()]}

    fake.compress = compress
    fake.originals[HASH] = ORIGINAL
    upstream.script({"tool_calls": [{"name": "headroom_retrieve", "arguments": {"hash": HASH, "query": "line 7"}}]},
                    "final answer")
    reply = chat_client(gateway).chat.completions.create(
        model="agent-model", messages=AGENT_SESSION, tools=[SHELL_TOOL])
    # the client sees only the model's last answer: LiteLLM ran the retrieve round trip itself
    assert reply.choices[0].message.content == "final answer"
    assert not reply.choices[0].message.tool_calls
    first, second = chat_calls(upstream)
    expected = [dict(m, content=MARKER) if m.get("tool_call_id") == "call_a" else m for m in AGENT_SESSION]
    assert [m.get("content") for m in first["messages"]] == [m["content"] for m in expected]
    assert first["tools"] == [SHELL_TOOL, RETRIEVE_TOOL]  # appended after the client's tools
    (retrieve,) = [s for s in fake.seen if s.method == "GET"]
    assert retrieve.path == f"/v1/retrieve/{HASH}"  # lower-cased: ccr_hashes entries are lower-cased
    assert retrieve.query == {"query": "line 7"}
    assert retrieve.headers["authorization"] == f"Bearer {GUARDRAIL_KEY}"
    # the follow-up: the conversation sent first, the model's retrieve call, its answer = original_content
    assert second["messages"][:-2] == first["messages"]
    assistant, tool = second["messages"][-2:]
    (tool_call,) = assistant["tool_calls"]
    assert tool_call["function"]["name"] == "headroom_retrieve"
    assert json.loads(tool_call["function"]["arguments"]) == {"hash": HASH, "query": "line 7"}
    assert tool == {"role": "tool", "tool_call_id": tool_call["id"], "content": ORIGINAL}


def test_a_streamed_chat_runs_the_round_trip_upstream_unstreamed(
        gateway: LiteLLMGateway, upstream: MockUpstream, fake: FakeHeadroom) -> None:
    fake.compress = lambda body: (200, {"messages": body["messages"], "ccr_hashes": [HASH]})
    fake.originals[HASH] = ORIGINAL
    upstream.script({"tool_calls": [{"name": "headroom_retrieve", "arguments": {"hash": HASH}}]}, "streamed answer")
    stream = chat_client(gateway).chat.completions.create(
        model="agent-model", messages=AGENT_SESSION, tools=[SHELL_TOOL], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "streamed answer"
    # with the retrieve tool offered, LiteLLM asks the model without streaming and streams the result itself
    assert [c.get("stream") for c in chat_calls(upstream)] == [None, None]
    assert [(s.method, s.path, s.query) for s in fake.seen] == [
        ("POST", "/v1/compress", {}), ("GET", f"/v1/retrieve/{HASH}", {})]


def test_messages_endpoint_runs_the_round_trip_in_anthropic_blocks(
        gateway: LiteLLMGateway, upstream: MockUpstream, fake: FakeHeadroom) -> None:
    def compress(body: dict[str, Any]) -> tuple[int, Any]:
        rows = [dict(m, content=MARKER) if m.get("tool_call_id") == "toolu_1" else m for m in body["messages"]]
        return 200, {"messages": rows, "ccr_hashes": [HASH]}

    fake.compress = compress
    fake.originals[HASH] = ORIGINAL
    upstream.script({"tool_calls": [{"name": "headroom_retrieve", "arguments": {"hash": HASH}}]}, "final")
    client = anthropic.Anthropic(base_url=gateway.url, api_key=gateway.master_key, max_retries=0, timeout=30)
    with client.messages.stream(
            model=gateway.anthropic_models[0], max_tokens=64,
            tools=[{"name": "shell", "input_schema": {"type": "object", "properties": {}}}],
            messages=[
                {"role": "user", "content": "U1"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "R1"}]},
                {"role": "assistant", "content": "A2"},
                {"role": "user", "content": "U3"},
            ]) as stream:
        final = stream.get_final_message()
    assert [b.text for b in final.content if b.type == "text"] == ["final"]
    first, second = [r.json for r in upstream.requests if r.path == "/v1/messages"]
    assert first["stream"] is True and second["stream"] is True
    assert [t["name"] for t in first["tools"]] == ["shell", "headroom_retrieve"]
    assert first["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": MARKER}]
    assistant, user = second["messages"][-2:]
    (tool_use,) = assistant["content"]
    assert (tool_use["type"], tool_use["name"], tool_use["input"]) == ("tool_use", "headroom_retrieve", {"hash": HASH})
    assert user == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": tool_use["id"], "content": ORIGINAL}]}


def test_retrieve_misses_become_tool_text(gateway: LiteLLMGateway, upstream: MockUpstream, fake: FakeHeadroom) -> None:
    declared, foreign = "abcdef012345", "ffffffffffffffffffffffff"  # 12 hex is the shortest LiteLLM accepts

    def compress(body: dict[str, Any]) -> tuple[int, Any]:
        # malformed entries are dropped silently: too short, too long, not hex
        return 200, {"messages": body["messages"], "ccr_hashes": [declared, "abc", "0" * 32, "zz" * 12]}

    fake.compress = compress
    upstream.script({"tool_calls": [{"name": "headroom_retrieve", "arguments": {"hash": declared}},
                                    {"name": "headroom_retrieve", "arguments": {"hash": foreign}}]}, "done")
    reply = chat_client(gateway).chat.completions.create(
        model="agent-model", messages=AGENT_SESSION, tools=[SHELL_TOOL])
    assert reply.choices[0].message.content == "done"
    # only the hash this request's compress call declared is looked up (404 here), no query parameter
    (retrieve,) = [s for s in fake.seen if s.method == "GET"]
    assert (retrieve.path, retrieve.query) == (f"/v1/retrieve/{declared}", {})
    _, second = chat_calls(upstream)
    assert [m["content"] for m in second["messages"][-2:]] == [
        f"[Headroom: hash={declared} not found or expired]",
        f"[Headroom: hash={foreign} was not produced by the current request]",
    ]


def test_only_malformed_hashes_bring_no_tool(gateway: LiteLLMGateway, upstream: MockUpstream,
                                             fake: FakeHeadroom) -> None:
    fake.compress = lambda body: (200, {"messages": body["messages"], "ccr_hashes": ["abc", "0" * 25]})
    chat_client(gateway).chat.completions.create(
        model="agent-model", messages=AGENT_SESSION, tools=[SHELL_TOOL])
    (sent,) = chat_calls(upstream)
    assert sent["tools"] == [SHELL_TOOL]


# --------------------------------------------------------------------------- failures

@pytest.mark.parametrize(("answer", "error"), [
    ((500, {"error": "boom"}), "Headroom compression service returned an error"),
    ((404, {"detail": "Not Found"}), "Headroom compression service returned an error"),
    ((200, {"tokens_before": 1}), "Headroom compression service response missing 'messages'"),
    ((200, ["not", "an", "object"]), "Headroom compression service returned unexpected response shape"),
    ((200, {"messages": []}), "Headroom compression service returned empty message list"),
    ((200, {"messages": [{"role": "user", "content": "U1"}]}),
     "Headroom compression service changed the message count"),
])
def test_fail_closed_answers_502(gateway: LiteLLMGateway, upstream: MockUpstream, fake: FakeHeadroom,
                                 answer: tuple[int, Any], error: str) -> None:
    fake.compress = lambda body: answer
    with pytest.raises(openai.InternalServerError) as caught:
        chat_client(gateway).chat.completions.create(model="agent-model", messages=AGENT_SESSION)
    assert caught.value.status_code == 502
    assert caught.value.message.endswith(error)
    assert chat_calls(upstream) == []  # the model is never called


def test_fail_open_forwards_uncompressed_and_bypass_header_skips(
        gateway: LiteLLMGateway, upstream: MockUpstream, fake: FakeHeadroom) -> None:
    client = chat_client(gateway)
    # `headroom-open` (fail_open) points at a closed port; asked for by name, it lets the request through
    reply = client.chat.completions.create(model="agent-model", messages=AGENT_SESSION,
                                           extra_body={"guardrails": ["headroom-open"]})
    assert reply.choices[0].message.content == "ok"
    assert len(fake.compress_calls()) == 1  # the default_on `headroom` still ran
    # x-headroom-bypass: true skips compression altogether, even when the service would fail the request
    fake.compress = lambda body: (500, {"error": "boom"})
    reply = client.chat.completions.create(model="agent-model", messages=AGENT_SESSION,
                                           extra_headers={"x-headroom-bypass": "true"})
    assert reply.choices[0].message.content == "ok"
    assert len(fake.compress_calls()) == 1
    assert len(chat_calls(upstream)) == 2
