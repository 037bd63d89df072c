"""Codex's 2026 request shapes through the proxy: Responses Lite, `additional_tools`, namespaces, compaction_trigger.

What Codex (codex-rs) sends when its model uses Responses Lite: no `instructions`
and no top-level `tools`; the tools in a leading input item `{"type":
"additional_tools", "role": "developer", "tools": [...]}` whose functions are
grouped in `namespace` tools (`functions` for Codex's own, one per MCP server);
`client_metadata` (the Lite flag among it) and `reasoning.context`. Its own
compaction is an ordinary request whose last input item is `{"type":
"compaction_trigger"}`, answered with one `compaction` item that the next
requests carry. The client is the official `openai` SDK; the provider the tests'
mock, which refuses a trigger that is not the last item, as the API does.
"""

from __future__ import annotations

import json
import re

import openai
import orjson
import pytest
from openai.types.responses import Response, ResponseCompactionItem, ResponseStreamEvent
from proxy_server import InProcessProxy, make_settings
from pydantic import TypeAdapter

KEY = "sk-codex"
MODEL = "gpt-5.6-sol"
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
FUNCTIONS = {"type": "namespace", "name": "functions", "description": "Codex's own tools.", "tools": [
    {"type": "function", "name": "exec_command", "description": "Run a command in the workspace.", "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "custom", "name": "apply_patch", "description": "Apply a patch to the workspace."}]}
MCP = {"type": "namespace", "name": "mcp__docs", "description": "The docs MCP server.", "tools": [
    {"type": "function", "name": "search", "description": "Search the docs.", "strict": False,
     "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]}
ADDITIONAL = {"type": "additional_tools", "id": "at_0198c0de5a7e", "role": "developer", "tools": [FUNCTIONS, MCP]}
BASE = {"type": "message", "id": "msg_0198c0de5a7e", "role": "developer",
        "content": [{"type": "input_text", "text": "You are Codex, a coding agent in the user's terminal."}]}
TASK = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find the bad item."}]}
LITE = {"ws_request_header_x_openai_internal_codex_responses_lite": "true", "x-codex-turn-metadata": '{"turn":1}'}
REASONING = {"effort": "medium", "summary": "auto", "context": "all_turns"}
TRIGGER = {"type": "compaction_trigger"}
STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def config(**defaults: object) -> dict:
    return {"defaults": {"offload": {"tool_result_tokens": 2000}, **defaults}}


pytestmark = pytest.mark.proxy_config(**config())


def big_log(lines: int = 3000) -> str:
    return "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                     for i in range(lines))


def call(n: int, output: str) -> list[dict]:
    """One exec_command call in Codex's `functions` namespace, and its output."""
    return [{"type": "function_call", "namespace": "functions", "name": "exec_command", "call_id": f"call_{n}",
             "arguments": json.dumps({"cmd": f"cat part{n}.log"})},
            {"type": "function_call_output", "call_id": f"call_{n}", "output": output}]


def lite(items: list[dict], **fields: object) -> dict:
    """A Responses Lite request as codex-rs builds it: the tools item and base instructions lead the input."""
    return {"model": MODEL, "input": [ADDITIONAL, BASE, *items], "tool_choice": "auto", "parallel_tool_calls": False,
            "reasoning": REASONING, "store": False, "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "0198c0de-5a7e-7c41-9d1e-codexthread", "client_metadata": LITE, **fields}


def client(proxy: InProcessProxy) -> openai.OpenAI:
    return proxy.openai("/v1", api_key=KEY, max_retries=0)


def sdk_args(body: dict) -> dict:
    """`body` as the SDK's arguments: Codex's fields the SDK does not type go as extra body."""
    typed = ("model", "input", "tool_choice", "parallel_tool_calls", "reasoning", "store", "include",
             "prompt_cache_key", "stream", "tools")
    return {**{k: v for k, v in body.items() if k in typed},
            "extra_body": {k: v for k, v in body.items() if k not in typed}}


def create(c: openai.OpenAI, body: dict) -> Response:
    return c.responses.create(**sdk_args(body))


def post(p: InProcessProxy, body: dict):  # noqa: ANN201
    return p.post("/v1/responses", content=orjson.dumps(body), headers={"authorization": f"Bearer {KEY}"}, timeout=60)


def sent(upstream, n: int = -1) -> dict:
    return json.loads(upstream.requests[n].body)


def read_tool(name: str = "context_read") -> dict:
    from proxy.rewrite.context_read.tool import tool_spec
    from proxy.wire.responses.codec import RESPONSES
    return RESPONSES.tool_definition(tool_spec(name))


def without_clock(body: bytes) -> bytes:
    return re.sub(rb"elapsed: [^\\]+|time: [0-9T:-]+Z", b"", body)


def test_the_read_tool_joins_the_additional_tools_item_never_a_new_tools_list(proxy, upstream):
    body = lite([TASK, *call(1, big_log())])
    r = create(client(proxy), body)
    assert r.output_text == "ok"
    up = sent(upstream)
    assert "tools" not in up and "instructions" not in up  # still the Lite shape
    assert up["input"][0] == {**ADDITIONAL, "tools": [FUNCTIONS, MCP, read_tool()]}  # id, role, key order kept
    assert list(up["input"][0]) == list(ADDITIONAL)
    assert up["input"][1:4] == [BASE, TASK, body["input"][3]]
    assert HANDLE.search(up["input"][4]["output"])  # offloaded, naming the tool the model now has
    assert "<agent_status>" in up["input"][-1]["content"][0]["text"]


def test_a_lite_request_is_rewritten_into_the_same_bytes_twice_and_after_a_restart(upstream, tmp_path):
    body = orjson.dumps(lite([TASK, *call(1, big_log())]))
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/r.db", **config())
    bodies = []
    for _ in range(2):
        with InProcessProxy(settings) as p:
            for _ in range(2):
                r = p.post("/v1/responses", content=body, headers={"authorization": f"Bearer {KEY}"})
                assert r.status_code == 200, r.text
                bodies.append(without_clock(upstream.requests[-1].body))
    assert bodies[0] == bodies[1] == bodies[2] == bodies[3]
    assert orjson.dumps({**ADDITIONAL, "tools": [FUNCTIONS, MCP, read_tool()]}) in bodies[0]


def test_a_lite_first_turn_is_an_agent_turn_and_its_fields_pass_as_sent(proxy, upstream):
    """No tool result yet, no top-level tools: the additional_tools item makes it an agent request. Its
    client_metadata, reasoning.context and the missing instructions pass as the client sent them."""
    body = lite([TASK], stream=False)
    r = create(client(proxy), body)
    assert r.status == "completed"
    raw, up = upstream.requests[-1].body, sent(upstream)
    assert up["input"][0]["tools"][-1] == read_tool() and "tools" not in up and "instructions" not in up
    assert up["input"][-1]["role"] == "user" and "<agent_status>" in up["input"][-1]["content"][0]["text"]
    assert up["client_metadata"] == LITE and up["reasoning"] == REASONING
    assert orjson.dumps(LITE) in raw and orjson.dumps(REASONING) in raw  # byte for byte


def test_names_inside_namespace_tools_are_taken(proxy, upstream):
    """An MCP server offering `context_read` in its namespace: the proxy's read tool takes another name."""
    memory = {"type": "namespace", "name": "mcp__memory", "description": "Notes.", "tools": [
        {"type": "function", "name": "context_read", "description": "Read a note.", "strict": False,
         "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}]}
    body = {"model": MODEL, "tools": [FUNCTIONS, memory], "store": False,
            "input": [TASK, *call(1, big_log())]}
    r = create(client(proxy), body)
    assert r.output_text == "ok"
    up = sent(upstream)
    assert up["tools"] == [FUNCTIONS, memory, read_tool("ctxproxy_context_read")]
    assert 'ctxproxy_context_read(handle="ctx_' in up["input"][2]["output"]


def test_an_additional_tools_item_whose_tools_are_not_a_list_is_a_400_naming_it(proxy, upstream):
    """The proxy may add its read tool there, so it is checked as the top-level `tools` is."""
    body = lite([TASK])
    body["input"][0] = {**ADDITIONAL, "tools": {"not": "a list"}}
    r = post(proxy, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].tools"
    assert not upstream.requests


def test_the_mock_refuses_a_compaction_trigger_that_is_not_last_and_answers_one_that_is(upstream):
    """The provider's rules, checked against the SDK's own types: what the proxy must not break."""
    c = openai.OpenAI(base_url=upstream.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError, match="'compaction_trigger' item must be the final input item"):
        c.responses.create(model=MODEL, input=[TASK, TRIGGER, TASK])
    r = c.responses.create(model=MODEL, input=[TASK, TRIGGER])
    assert [o.type for o in r.output] == ["compaction"]
    ResponseCompactionItem.model_validate(r.output[0].model_dump())
    events = list(c.responses.create(model=MODEL, input=[TASK, TRIGGER], stream=True))
    for e in events:
        STREAM_EVENT.validate_python(e.model_dump(exclude_unset=True))
    assert "response.compaction.compacting" in [e.type for e in events]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done == events[-1].response.output and done[0].encrypted_content


def _summary_or_ok(body: dict) -> str:
    last = json.dumps(body.get("input", [])[-1:])
    if "compacting it" not in last and "<transcript>" not in last:
        return "ok"
    from proxy.rewrite.compress.summarizer import SECTIONS
    return "\n".join(f"## {s}\n- the agent read part {i} of the log" for i, s in enumerate(SECTIONS))


def _output(n: int) -> str:
    return "\n".join(f"part {n} line {j}: worker {j * 31 % 97} processed item {n * 1000 + j} ok" for j in range(60))


MODEL_32K = "gpt-test-32k"


def compacted_session(upstream, tmp_path) -> tuple[InProcessProxy, list[dict], str]:
    """A Lite session the proxy compacted, one turn past it: its proxy (open), history, compaction version."""
    s = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", models={MODEL_32K: {"context_window": 32000}},
                      **config(compress={"precompute": None, "exclude_tools": ["exec_command"]}))
    upstream.script(*[_summary_or_ok] * 100)
    history: list[dict] = [TASK]
    p = InProcessProxy(s).__enter__()
    compacted = False
    for n in range(40):
        history += call(n, _output(n))
        r = post(p, lite(history, model=MODEL_32K))
        assert r.status_code == 200, r.text
        if compacted and "x-ctxproxy-compacted" not in r.headers:
            return p, history, r.headers["x-ctxproxy-compaction"]  # a turn after the compaction replays it
        compacted = compacted or "x-ctxproxy-compacted" in r.headers
    raise AssertionError("the session was never compacted")


def test_the_summary_call_of_a_lite_session_keeps_the_tools_in_their_item(upstream, tmp_path):
    """The cached-shape summary call repeats the agent's first item, read tool included, and no tools list."""
    p, _, _ = compacted_session(upstream, tmp_path)
    with p:
        agent = sent(upstream)
        summaries = [rq for rq in upstream.requests if "compacting it" in json.dumps(rq.json["input"][-1:])]
        assert summaries and all("tools" not in rq.json for rq in summaries)
        assert all(rq.json["input"][0] == agent["input"][0] for rq in summaries)
        assert sum(rq.usage["input_tokens_details"]["cached_tokens"] for rq in summaries) > 0  # the agent's cache


def test_codexs_own_compaction_stays_last_is_not_compacted_and_the_session_goes_on(upstream, tmp_path):
    """Codex compacts a session the proxy compacted before: its trigger stays last, nothing is added after
    it, the proxy replays its own compaction (the same prefix, the same bytes) but makes no new one, though
    the history is over its trigger; the next request, carrying Codex's compaction item, is handled as any
    other."""
    p, history, version = compacted_session(upstream, tmp_path)
    with p:
        previous = sent(upstream)
        raw = client(p).responses.with_raw_response.create(**sdk_args(lite([*history, TRIGGER], model=MODEL_32K,
                                                                           stream=True)))
        events = list(raw.parse())
        up = sent(upstream)
        assert up["input"][-1] == TRIGGER  # last, as the API requires: no status bar after it
        assert up["input"][:-1] == previous["input"][:-1]  # the previous turn's bytes, its status aside
        assert raw.headers["x-ctxproxy-compaction"] == version and "x-ctxproxy-compacted" not in raw.headers
        assert raw.headers["x-ctxproxy-compress"].startswith("skipped: the client compacts")
        assert raw.headers["x-ctxproxy-status-bar"] == "skipped: the client compacts its history with this request"
        compaction = events[-1].response.output[0].model_dump(exclude_none=True)
        assert compaction["type"] == "compaction"

        go_on = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Go on."}]}
        r = post(p, lite([TASK, compaction, go_on], model=MODEL_32K))
        assert r.status_code == 200, r.text
        assert "x-ctxproxy-compaction" not in r.headers  # the proxy's record is of the history before
        up = sent(upstream)
        assert up["input"][:5] == [{**ADDITIONAL, "tools": [FUNCTIONS, MCP, read_tool()]}, BASE, TASK, compaction,
                                   go_on]
        assert "<agent_status>" in up["input"][-1]["content"][0]["text"]
