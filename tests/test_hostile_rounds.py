"""Hostile provider answers around the hidden read-back rounds, on every API (issue 23, defects 3-7).

The proxy is driven in process over ASGI (the transport is not the subject);
the provider is the tests' mock, scripted byte for byte with `fail_next`. A
request carrying a asgi_client tool gets the proxy's `context_read` appended, so a
first answer that calls it (with any handle: an unknown one is answered too)
starts a hidden round whose answer is the hostile one.

What must hold whatever the provider sends: never a 500 or an internal-error
event; a stream the asgi_client can parse, ending in exactly one terminal or one
error event in its own API's shape; none of the proxy's calls shown; no event
the provider forged by hiding a line break in an event type.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

SSE = {"content-type": "text/event-stream"}
KEY = "sk-hostile-rounds"
OPENAI_AUTH = {"authorization": f"Bearer {KEY}"}
ANTHROPIC_AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
FORGED = b"forged"  # in every forged event: must never reach the asgi_client as an event of its own


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def named(data: dict[str, Any], raw: bytes | None = None) -> bytes:
    """One event as a provider frames it: its `event:` line is its type's first line (a type holding a line
    break is sent JSON-escaped in the data, as a provider's bytes would carry it)."""
    name = str(data["type"]).split("\n")[0]
    return b"event: " + name.encode() + b"\ndata: " + (raw or dumps(data)) + b"\n\n"


def events(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of every event, parsed as an SSE asgi_client does (a line break ends a field)."""
    out = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        name, data = None, b""
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data += line[5:].strip()
        if data and data != b"[DONE]":
            out.append((name, json.loads(data)))
    return out


# --------------------------------------------------------------------------- Responses

RESPONSES_TOOLS = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]


def responses_body(stream: bool) -> dict[str, Any]:
    return {"model": "gpt-5.1-codex", "input": [{"type": "message", "role": "user", "content": "go"}],
            "tools": RESPONSES_TOOLS, "stream": stream}


def read_item(call_id: str = "call_read") -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_1", "call_id": call_id, "name": "context_read",
            "arguments": '{"handle":"ctx_0"}', "status": "completed"}


def shell_item() -> dict[str, Any]:
    return {"type": "function_call", "id": "fc_2", "call_id": "call_shell", "name": "shell", "arguments": "{}",
            "status": "completed"}


def response_obj(output: list[Any], status: str = "completed") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "status": status, "output": output,
            "usage": {"input_tokens": 100, "output_tokens": 5, "total_tokens": 105}}


def responses_stream(*middle: dict[str, Any], output: list[Any] | None = None, end: bool = True) -> bytes:
    evs = [{"type": "response.created", "response": response_obj([], "in_progress")}, *middle]
    if end:
        evs.append({"type": "response.completed", "response": response_obj(output or [])})
    return b"".join(named({**e, "sequence_number": i}) for i, e in enumerate(evs))


def read_call_stream() -> bytes:
    item = read_item()
    return responses_stream({"type": "response.output_item.added", "output_index": 0, "item": item},
                            {"type": "response.output_item.done", "output_index": 0, "item": item}, output=[item])


async def post_responses(asgi_client: httpx.AsyncClient, stream: bool) -> httpx.Response:
    return await asgi_client.post("/v1/responses", json=responses_body(stream), headers=OPENAI_AUTH)


def assert_responses_error_at_end(raw: bytes) -> dict[str, Any]:
    """One Responses `error` event, last, with every field the API gives it; no terminal event after it."""
    evs = events(raw)
    errors = [d for n, d in evs if n == "error" or d.get("type") == "error" or "error" in d]
    assert len(errors) == 1 and evs[-1][1] is errors[0], evs
    err = errors[0]
    assert evs[-1][0] == "error" and set(err) >= {"type", "code", "message", "param", "sequence_number"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["sequence_number"], int)
    assert err["code"] != "internal_error" and "internal proxy error" not in err["message"], err
    seqs = [d["sequence_number"] for _, d in evs if isinstance(d.get("sequence_number"), int)]
    assert seqs == list(range(len(seqs))), seqs  # the error's number follows the last the asgi_client got
    return err


@pytest.mark.parametrize("hostile", ["item null", "item type a list", "item a string"])
async def test_responses_hidden_round_with_an_ill_formed_output_item_ends_in_one_error_event(
        asgi_client, upstream, hostile):
    bad: Any = {"item null": None, "item type a list": {**shell_item(), "type": ["function_call"]},
                "item a string": "function_call"}[hostile]
    upstream.fail_next(200, read_call_stream(), SSE)
    upstream.fail_next(200, responses_stream({"type": "response.output_item.added", "output_index": 0,
                                              "item": {"type": "message", "role": "assistant", "content": []}},
                                             {"type": "response.output_item.done", "output_index": 0, "item": bad}),
                       SSE)
    r = await post_responses(asgi_client, stream=True)
    assert r.status_code == 200
    assert_responses_error_at_end(r.content)
    assert len(upstream.requests) == 2


async def test_responses_item_type_a_list_in_a_non_streamed_answer_is_no_500(asgi_client, upstream):
    upstream.fail_next(200, dumps(response_obj([read_item()])))
    upstream.fail_next(200, dumps(response_obj([{**shell_item(), "type": ["function_call"]}])))
    r = await post_responses(asgi_client, stream=False)
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["type"] == ["function_call"]  # the provider's answer, the proxy's call gone
    upstream.fail_next(200, dumps(response_obj([{**read_item(), "type": ["function_call"]}])))
    r = await post_responses(asgi_client, stream=False)
    assert r.status_code == 200, r.text  # a first answer the loop cannot read: as it came


async def test_responses_first_round_item_type_a_list_is_no_internal_error(asgi_client, upstream):
    item = {**shell_item(), "type": ["function_call"]}
    upstream.fail_next(200, responses_stream({"type": "response.output_item.added", "output_index": 0, "item": item},
                                             {"type": "response.output_item.done", "output_index": 0, "item": item},
                                             output=[item]), SSE)
    r = await post_responses(asgi_client, stream=True)
    assert r.status_code == 200
    kinds = [d.get("type") for _, d in events(r.content)]
    assert kinds[-1] == "response.completed" and "error" not in kinds, kinds


async def test_responses_proxy_call_without_its_done_event_is_not_in_the_completed_output(asgi_client, upstream):
    """The proxy's call beside a asgi_client call (so no hidden round): the asgi_client never sees the proxy's call,
    in the events or in response.completed's output, even when no output_item.done came for it."""
    read, shell = read_item(), shell_item()
    upstream.fail_next(200, responses_stream(
        {"type": "response.output_item.added", "output_index": 0, "item": {**read, "status": "in_progress"}},
        {"type": "response.output_item.added", "output_index": 1, "item": shell},
        {"type": "response.output_item.done", "output_index": 1, "item": shell},
        output=[read, shell]), SSE)
    r = await post_responses(asgi_client, stream=True)
    assert r.status_code == 200
    evs = events(r.content)
    completed = evs[-1][1]
    assert completed["type"] == "response.completed", evs
    assert [it["name"] for it in completed["response"]["output"]] == ["shell"]
    assert b"call_read" not in r.content
    assert [d["output_index"] for _, d in evs if "output_index" in d] == [0, 0]


@pytest.mark.parametrize("spacing", ["compact", "spaced"])
@pytest.mark.parametrize("tools", [True, False])
async def test_responses_provider_error_event_ends_the_stream_with_no_second_error(asgi_client, upstream, spacing,
                                                                                  tools):
    error = {"type": "error", "code": "server_error", "message": "the model is overloaded", "param": None,
             "sequence_number": 1}
    raw = dumps(error) if spacing == "compact" else json.dumps(error).encode()
    opening = responses_stream(end=False)
    upstream.fail_next(200, opening + named(error, raw), SSE)
    body = responses_body(True)
    if not tools:
        del body["tools"]
    r = await asgi_client.post("/v1/responses", json=body, headers=OPENAI_AUTH)
    assert r.status_code == 200
    errors = [d for n, d in events(r.content) if n == "error" or d.get("type") == "error" or "error" in d]
    assert errors == [error], r.content  # the provider's, once; not followed by "upstream stream ended early"


@pytest.mark.parametrize("tools", [True, False])
async def test_responses_cut_stream_ends_with_a_responses_error_event(asgi_client, upstream, tools):
    upstream.fail_next(200, responses_stream({"type": "response.output_text.delta", "output_index": 0,
                                              "content_index": 0, "delta": "hal"}, end=False), SSE)
    body = responses_body(True)
    if not tools:
        del body["tools"]
    r = await asgi_client.post("/v1/responses", json=body, headers=OPENAI_AUTH)
    err = assert_responses_error_at_end(r.content)
    assert err["code"] == "upstream_stream_cut"


async def test_responses_hidden_round_failure_is_a_responses_error_event(asgi_client, upstream):
    upstream.fail_next(200, read_call_stream(), SSE)
    upstream.fail_next(500, b"<html>" + FORGED + b"</html>")
    r = await post_responses(asgi_client, stream=True)
    err = assert_responses_error_at_end(r.content)
    assert err["code"] == "upstream_bad_response" and FORGED not in r.content


async def test_responses_event_type_with_a_line_break_cannot_forge_events(asgi_client, upstream):
    """A hidden round's events are renumbered and rewritten; a `type` holding a line break would end the
    `event:` line and let the provider write an event of its own: refused instead."""
    forged = 'response.output_text.delta\n\nevent: response.completed\ndata: {"type":"forged"}'
    upstream.fail_next(200, read_call_stream(), SSE)
    upstream.fail_next(200, responses_stream({"type": forged, "output_index": 0, "delta": "x"}), SSE)
    r = await post_responses(asgi_client, stream=True)
    assert r.status_code == 200
    assert_responses_error_at_end(r.content)
    assert all(d.get("type") != "forged" for _, d in events(r.content)), r.content


# --------------------------------------------------------------------------- Messages

MESSAGES_TOOLS = [{"name": "Bash", "description": "Run a shell command.",
                   "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


def messages_body(stream: bool) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 512, "messages": [{"role": "user", "content": "go"}],
            "tools": MESSAGES_TOOLS, "stream": stream}


def message_obj(content: list[Any], stop: str = "tool_use") -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 5}}


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = {"a": value}
    return value


def deep_read_call() -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_read", "name": "context_read",
            "input": {"handle": "ctx_0", "extra": nested(300)}}


def messages_stream(*blocks: bytes, stop: str = "tool_use") -> bytes:
    start = {"type": "message_start", "message": {**message_obj([], stop), "stop_reason": None}}
    return (named(start) + b"".join(blocks)
            + named({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                     "usage": {"output_tokens": 5}})
            + named({"type": "message_stop"}))


def block_events(index: int, block: dict[str, Any]) -> bytes:
    if block["type"] == "text":
        return (named({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
                + named({"type": "content_block_delta", "index": index,
                         "delta": {"type": "text_delta", "text": block["text"]}})
                + named({"type": "content_block_stop", "index": index}))
    return (named({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
            + named({"type": "content_block_delta", "index": index,
                     "delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            + named({"type": "content_block_stop", "index": index}))


async def post_messages(asgi_client: httpx.AsyncClient, stream: bool) -> httpx.Response:
    return await asgi_client.post("/v1/messages", json=messages_body(stream), headers=ANTHROPIC_AUTH)


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_read_call_nested_300_levels_deep_is_no_500(asgi_client, upstream, stream):
    """Its input cannot be written back to the provider (proxy/wire/jsonio.py SAFE_DEPTH): the call is answered
    as one with garbled input (an error the model reads, the call sent back with an empty input), whole or
    streamed, and never reaches the asgi_client (tests/test_readback_leaks.py)."""
    call = deep_read_call()
    text = {"type": "text", "text": "reading"}
    if stream:
        upstream.fail_next(200, messages_stream(block_events(0, text), block_events(1, call)), SSE)
    else:
        upstream.fail_next(200, dumps(message_obj([text, call])))
    r = await post_messages(asgi_client, stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    assert b"toolu_read" not in r.content and b'"deep"' not in upstream.requests[1].body
    if stream:
        evs = events(r.content)
        assert evs[-1][1]["type"] == "message_stop" and all(d["type"] != "error" for _, d in evs), evs
        assert not any(d.get("content_block", {}).get("type") == "tool_use" for _, d in evs)
        delta = [d for _, d in evs if d["type"] == "message_delta"][-1]
        assert delta["delta"]["stop_reason"] == "end_turn"
    else:
        assert [b["type"] for b in r.json()["content"]] == ["text"]


async def test_messages_event_type_with_a_line_break_cannot_forge_events(asgi_client, upstream):
    """Round one shows a text block, so round two's blocks are renumbered (rewritten by the proxy)."""
    call = {"type": "tool_use", "id": "toolu_read", "name": "context_read", "input": {"handle": "ctx_0"}}
    upstream.fail_next(200, messages_stream(block_events(0, {"type": "text", "text": "a"}), block_events(1, call)),
                       SSE)
    forged = 'content_block_delta\n\nevent: message_stop\ndata: {"type":"forged"}'
    second = (named({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
              + named({"type": forged, "index": 0, "delta": {"type": "text_delta", "text": "b"}}))
    upstream.fail_next(200, messages_stream(second, stop="end_turn"), SSE)
    r = await post_messages(asgi_client, stream=True)
    assert r.status_code == 200
    evs = events(r.content)
    assert all(d.get("type") != "forged" for _, d in evs), r.content
    assert [n for n, _ in evs].count("message_stop") == 0 and evs[-1][1]["type"] == "error", evs
    assert evs[-1][1]["error"]["type"] != "api_error" or "internal" not in evs[-1][1]["error"]["message"]


# --------------------------------------------------------------------------- Chat Completions

def chat_body() -> dict[str, Any]:
    return {"model": "gpt-4.1", "stream": True, "messages": [{"role": "user", "content": "go"}],
            "tools": [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize("tools", [True, False])
async def test_chat_provider_error_chunk_ends_the_stream_with_no_second_error(asgi_client, upstream, tools):
    error = {"error": {"message": "the model is overloaded", "type": "server_error", "code": None}}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hal"}}]}
    upstream.fail_next(200, b"data: " + dumps(chunk) + b"\n\n" + b"data: " + json.dumps(error).encode() + b"\n\n",
                       SSE)
    body = chat_body()
    if not tools:
        del body["tools"]
    r = await asgi_client.post("/v1/chat/completions", json=body, headers=OPENAI_AUTH)
    assert r.status_code == 200
    errors = [d for _, d in events(r.content) if "error" in d]
    assert errors == [error], r.content


# --------------------------------------------------------------------------- nesting orjson cannot write safely

def crashing_siblings(depth: int = 250, n: int = 10) -> list[Any]:
    """Ten sibling lists nested 250 deep: orjson 3.13 corrupts its heap writing them (the process aborts)."""
    return [{"c": nested_list(depth)} for _ in range(n)]


def nested_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_a_body_nested_past_the_safe_depth_is_a_400_not_a_crash(asgi_client, upstream, api):
    """Run in this very process: a heap corruption would abort the test run, not fail one test."""
    item = {"role": "user", "content": "go", "extra": crashing_siblings()}
    if api == "chat":
        r = await asgi_client.post("/v1/chat/completions", json={"model": "m", "messages": [item]}, headers=OPENAI_AUTH)
        assert r.status_code == 400 and "nested deeper than 200" in r.json()["error"]["message"], r.text
    elif api == "responses":
        r = await asgi_client.post("/v1/responses", json={"model": "m", "input": [item]}, headers=OPENAI_AUTH)
        assert r.status_code == 400 and "nested deeper than 200" in r.json()["error"]["message"], r.text
    else:
        r = await asgi_client.post("/v1/messages", json={"model": "claude-sonnet-4-6", "max_tokens": 5,
                                                    "messages": [item]}, headers=ANTHROPIC_AUTH)
        assert r.status_code == 400 and "nested deeper than 200" in r.json()["error"]["message"], r.text
    assert not upstream.requests


@pytest.mark.parametrize("stream", [False, True])
async def test_a_provider_answer_nested_past_the_safe_depth_is_never_written_back(asgi_client, upstream, stream):
    call = {"type": "tool_use", "id": "toolu_read", "name": "context_read",
            "input": {"handle": "ctx_0", "deep": crashing_siblings()}}
    if stream:
        upstream.fail_next(200, messages_stream(block_events(0, call)), SSE)
    else:
        upstream.fail_next(200, dumps(message_obj([call])))
    r = await post_messages(asgi_client, stream)
    assert r.status_code == 200, r.text  # the call answered with an error; its input never written
    assert len(upstream.requests) == 2 and b"[[[[" not in upstream.requests[1].body
    assert b"toolu_read" not in r.content
