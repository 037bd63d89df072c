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
from proxy_server import InProcessProxy
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
