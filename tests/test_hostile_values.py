"""Ill-typed values where the proxy looks things up are a clear 400, never a 500 (issue 23).

A role, a part or item `type`, or a tool-result id that is a list or an object
cannot be a dict key or a set member: used as one, it raised a TypeError (a
500, one of them in accounting after the provider had answered and billed).
Each is now a 400 in the client API's error shape naming the field, where the
provider refuses it too, checked before anything is looked up.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgi_proxy import asgi_proxy

AUTH = {"authorization": "Bearer sk-hostile-values", "content-type": "application/json"}
ODD = [["user"], {"a": 1}]  # unhashable: a list and an object

CALL = {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}


def responses(*items: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": list(items)}


def chat(*messages: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages)}


def messages(*turns: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": list(turns)}


def tool_turns(tool_use_id: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "run it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use_id, "content": "ok"}]}]


# (path, body, the field the 400 must name)
CASES: dict[str, tuple[str, dict[str, Any], str]] = {}
for n, odd in enumerate(ODD):
    CASES |= {
        f"responses role {n}": ("/v1/responses", responses({"role": odd, "content": "hi"}), "input[0].role"),
        f"responses part type {n}": ("/v1/responses", responses(
            {"role": "user", "content": [{"type": odd, "text": "hi"}]}), "input[0].content[0].type"),
        f"responses assistant part type {n}": ("/v1/responses", responses(
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": odd, "text": "yes"}]},
            {"role": "user", "content": "go on"}), "input[1].content[0].type"),
        f"responses item type {n}": ("/v1/responses", responses({"type": odd, "role": "user", "content": "hi"}),
                                     "input[0].type"),
        f"responses item type after an output {n}": ("/v1/responses", responses(
            {"role": "user", "content": "hi"}, CALL, OUTPUT, {"type": odd}), "input[3].type"),
        f"chat role {n}": ("/v1/chat/completions", chat({"role": odd, "content": "hi"}), "messages[0].role"),
        f"chat part type {n}": ("/v1/chat/completions", chat(
            {"role": "user", "content": [{"type": odd, "text": "hi"}]}), "messages[0].content[0].type"),
        f"chat tool_call_id {n}": ("/v1/chat/completions", chat(
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": odd, "content": "ok"}), "messages[2].tool_call_id"),
        f"messages tool_use_id {n}": ("/v1/messages", messages(*tool_turns(odd)), "messages.2.content.0.tool_use_id"),
        f"count_tokens tool_use_id {n}": ("/v1/messages/count_tokens",
                                          {k: v for k, v in messages(*tool_turns(odd)).items() if k != "max_tokens"},
                                          "messages.2.content.0.tool_use_id"),
        f"messages role {n}": ("/v1/messages", messages({"role": odd, "content": "hi"}), "messages.0.role"),
        f"messages block type {n}": ("/v1/messages", messages({"role": "user", "content": [{"type": odd}]}),
                                     "messages.0.content.0.type"),
    }


@pytest.mark.parametrize("case", list(CASES))
async def test_an_unhashable_value_is_a_clear_400_naming_its_field(case, upstream, tmp_path):
    path, body, field = CASES[case]
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db") as client:
        r = await client.post(path, content=json.dumps(body).encode(), headers=AUTH)
        assert r.status_code == 400, r.text
        err = r.json()
        if "/v1/messages" in path:
            assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
            assert err["error"]["message"].startswith(field + ":"), err
        else:
            assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == field, err
        assert not upstream.requests  # refused before anything went upstream
        assert (await client.get("/healthz")).status_code == 200


# Odd values the proxy never looks up (or reads tolerantly): forwarded as they came, never a 500.
FORWARDED: dict[str, tuple[str, dict[str, Any]]] = {
    "chat tool call type": ("/v1/chat/completions", chat(
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": ["function"], "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"})),
    "responses reasoning summary type": ("/v1/responses", responses(
        {"role": "user", "content": "hi"}, {"type": "reasoning", "summary": [{"type": ["x"], "text": "t"}]},
        {"role": "user", "content": "go on"})),
    "messages text block with an odd cache_control": ("/v1/messages", messages(
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": ["ephemeral"]}}]})),
}


@pytest.mark.parametrize("case", list(FORWARDED))
async def test_an_odd_value_the_proxy_does_not_read_is_forwarded(case, upstream, tmp_path):
    path, body = FORWARDED[case]
    raw = json.dumps(body).encode()
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db") as client:
        r = await client.post(path, content=raw, headers=AUTH)
    assert r.status_code != 500, r.text
    items = "input" if "input" in body else "messages"
    sent = json.loads(upstream.requests[0].body)[items]  # the proxy may add its status after them
    assert sent[:len(body[items])] == body[items]
