"""The proxy's own `context_read` call never reaches the asgi_client, whatever shape the provider's answer takes.

Two leaks a hostile probe found, and their kin: a Responses stream whose
`response.output_item.done` for the proxy's call carries `item: null` (the
round gave up reading and relayed the rest, `response.completed` listing the
call), and a read call (or anything beside it) nested past the depth orjson
writes safely (the answer was treated as unreadable and relayed as it came,
the call in it). A value nested that deep is read like any other: the proxy's
call is answered (a call whose input is nested too deep gets an error the
model reads, as a garbled one does) or removed, and nothing nested that deep
is ever written by orjson (proxy/wire/jsonio.py SAFE_DEPTH).

Driven over ASGI with the helpers of tests/test_hostile_rounds.py; the
provider is the tests' mock, scripted byte for byte with `fail_next`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from mock_upstream import MockUpstream
from test_hostile_rounds import (
    OPENAI_AUTH,
    SSE,
    assert_responses_error_at_end,
    block_events,
    chat_body,
    crashing_siblings,
    deep_read_call,
    dumps,
    events,
    message_obj,
    messages_stream,
    named,
    nested,
    post_messages,
    post_responses,
    read_item,
    response_obj,
    responses_stream,
    shell_item,
)

OURS = "context_read"  # the proxy's tool: no call of it may reach the asgi_client
IDS = (b"call_read", b"toolu_read", b"fc_1")  # the ids of the proxy's calls in the provider's answers


def our_calls(raw: bytes) -> list[Any]:
    """Every call of the proxy's tool in what the asgi_client got (a body, or each event of a stream), as Responses
    (a function_call item), Messages (a tool_use block) or Chat Completions (a tool call) spells it. A
    Responses answer echoes the request's `tools`, the proxy's definition among them: not a call."""
    if raw.lstrip().startswith(b"{"):
        values = [json.loads(raw)]
    else:
        values = [d for _, d in events(raw)]
    found, stack = [], values
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            fn = v.get("function")
            if (v.get("type") in ("function_call", "tool_use") and v.get("name") == OURS) or \
                    (isinstance(fn, dict) and fn.get("name") == OURS and "parameters" not in fn):
                found.append(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return found


def assert_no_call_of_ours(raw: bytes) -> None:
    assert not our_calls(raw), raw
    assert not any(i in raw for i in IDS), raw


def assert_responses_stream_ends_completed(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    evs = events(raw)
    kinds = [d.get("type") for _, d in evs]
    assert kinds[-1] == "response.completed" and kinds.count("response.completed") == 1, kinds
    assert "error" not in kinds and kinds.count("response.created") == 1, kinds
    seqs = [d["sequence_number"] for _, d in evs if isinstance(d.get("sequence_number"), int)]
    assert seqs == list(range(len(seqs))), seqs
    return evs


def hidden_outputs(upstream: MockUpstream) -> list[dict[str, Any]]:
    """The proxy's function_call_outputs in the hidden round's Responses request."""
    return [it for it in upstream.requests[1].json["input"] if it.get("type") == "function_call_output"]


# --------------------------------------------------------------------------- Responses: the call's item at its end

ADDED = {"type": "response.output_item.added", "output_index": 0, "item": read_item()}


def done(item: Any, *, drop: bool = False) -> dict[str, Any]:
    ev = {"type": "response.output_item.done", "output_index": 0, "item": item}
    if drop:
        del ev["item"]
    return ev


ODD_ENDS: dict[str, tuple[dict[str, Any], ...]] = {
    "done item null": (ADDED, done(None)),
    "done item missing": (ADDED, done(None, drop=True)),
    "done item a string": (ADDED, done("function_call")),
    "done item an object without a type": (ADDED, done({"name": "context_read"})),
    "done item null, never added": (done(None),),
    "added item null, done the call": ({**ADDED, "item": None}, done(read_item())),
    "added item null, done item null": ({**ADDED, "item": None}, done(None)),
}


@pytest.mark.parametrize("name", ODD_ENDS)
async def test_responses_read_call_whose_item_is_odd_at_an_end_is_answered_not_shown(asgi_client, upstream, name):
    """`response.completed` still lists the call: it is answered in a hidden round, and the asgi_client's stream
    is one valid stream with no trace of it (the proxy's call is never relayed once its events were hidden)."""
    upstream.fail_next(200, responses_stream(*ODD_ENDS[name], output=[read_item()]), SSE)
    r = await post_responses(asgi_client, stream=True)
    assert r.status_code == 200
    assert_no_call_of_ours(r.content)
    evs = assert_responses_stream_ends_completed(r.content)
    assert len(upstream.requests) == 2  # the call was answered
    assert [o["call_id"] for o in hidden_outputs(upstream)] == ["call_read"]
    assert [it["type"] for it in evs[-1][1]["response"]["output"]] == ["message"]  # the answer after the read


async def test_responses_read_call_with_a_null_item_at_its_end_beside_a_client_call(asgi_client, upstream):
    """No hidden round (the asgi_client has a call to run): the proxy's call is removed all the same."""
    read, shell = read_item(), shell_item()
    upstream.fail_next(200, responses_stream(
        ADDED, done(None),
        {"type": "response.output_item.added", "output_index": 1, "item": shell},
        {"type": "response.output_item.done", "output_index": 1, "item": shell},
        output=[read, shell]), SSE)
    r = await post_responses(asgi_client, stream=True)
    assert_no_call_of_ours(r.content)
    evs = assert_responses_stream_ends_completed(r.content)
    assert len(upstream.requests) == 1
    assert [it["name"] for it in evs[-1][1]["response"]["output"]] == ["shell"]
    assert [d["output_index"] for _, d in evs if "output_index" in d] == [0, 0]


async def test_responses_hidden_round_still_refuses_a_null_item_at_the_end_of_a_read_call(asgi_client, upstream):
    """In a hidden round nothing odd is passed on: one error event, as for any ill-formed hidden answer."""
    upstream.fail_next(200, responses_stream(ADDED, done(read_item()), output=[read_item()]), SSE)
    upstream.fail_next(200, responses_stream(ADDED, done(None), output=[read_item()]), SSE)
    r = await post_responses(asgi_client, stream=True)
    assert_no_call_of_ours(r.content)
    assert events(r.content)[-1][1]["type"] == "error"
    assert len(upstream.requests) == 2


FORGED = 'response.output_text.delta\n\nevent: response.completed\ndata: {"type":"forged"}'


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_a_first_answer_unreadable_after_the_proxy_hid_its_call_ends_in_one_error(asgi_client, upstream, api):
    """Relayed as it came from there, the rest would show the call its events were hidden for (Responses'
    `response.completed` lists it; Messages' stop reason calls for it): one error in the API's shape instead.
    The unreadable event: a type holding a line break, which the proxy must rewrite (renumbered after the
    hidden call) and cannot."""
    if api == "responses":
        message = {"type": "message", "role": "assistant", "content": []}
        upstream.fail_next(200, responses_stream(
            ADDED, done(read_item()), {"type": FORGED, "output_index": 1, "item": message},
            output=[read_item(), message]), SSE)
        r = await post_responses(asgi_client, stream=True)
        err = assert_responses_error_at_end(r.content)
        assert err["code"] == "upstream_bad_response"
    else:
        forged = FORGED.replace("response.output_text.delta", "content_block_delta")
        upstream.fail_next(200, messages_stream(
            block_events(0, {**deep_read_call(), "input": {"handle": "ctx_0"}}),
            named({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}})
            + named({"type": forged, "index": 1, "delta": {"type": "text_delta", "text": "x"}})), SSE)
        r = await post_messages(asgi_client, stream=True)
        evs = events(r.content)
        assert evs[-1][0] == "error" and [n for n, _ in evs].count("error") == 1, evs
    assert r.status_code == 200
    assert_no_call_of_ours(r.content)
    assert all(d.get("type") != "forged" for _, d in events(r.content)), r.content
    assert len(upstream.requests) == 1


# --------------------------------------------------------------------------- every API: nested past the safe depth

def responses_first(stream: bool, where: str) -> bytes:
    read = read_item()
    if where == "beside":
        if stream:
            return responses_stream(ADDED, done(read), {"type": "response.output_text.annotation.added",
                                                        "output_index": 1, "annotation": nested(300)},
                                    output=[read])
        return dumps({**response_obj([read]), "metadata": nested(300)})
    deep = {**read, "extra": nested(300)}
    if stream:
        return responses_stream({**ADDED, "item": deep}, done(deep), output=[deep])
    return dumps(response_obj([deep]))


def messages_first(stream: bool, where: str) -> bytes:
    text = {"type": "text", "text": "reading"}
    call = deep_read_call() if where == "inside" else {**deep_read_call(), "input": {"handle": "ctx_0"}}
    if stream:
        if where == "inside":
            return messages_stream(block_events(0, text), block_events(1, call))
        start = {"type": "message_start", "message": {**message_obj([], "tool_use"), "stop_reason": None,
                                                      "container": nested(300)}}
        return named(start) + messages_stream(block_events(0, text), block_events(1, call))[
            len(named({"type": "message_start", "message": {**message_obj([], "tool_use"), "stop_reason": None}})):]
    if where == "inside":
        return dumps(message_obj([text, call]))
    return dumps({**message_obj([text, call]), "extra": nested(300)})


def chat_first(stream: bool, where: str) -> bytes:
    call: dict[str, Any] = {"id": "call_read", "type": "function",
                            "function": {"name": "context_read", "arguments": '{"handle":"ctx_0"}'}}
    if where == "inside":
        call["extra"] = nested(300)
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4.1"}
    if stream:
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "reading"}}]},
                  {**base, "choices": [{"index": 0, "delta": {"tool_calls": [{**call, "index": 0}]}}]},
                  {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}]
        if where == "beside":
            chunks[0]["extra"] = nested(300)
        return b"".join(b"data: " + dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    reply = {**base, "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "reading", "tool_calls": [call]}}]}
    if where == "beside":
        reply["extra"] = nested(300)
    return dumps(reply)


async def post(asgi_client: httpx.AsyncClient, api: str, stream: bool) -> httpx.Response:
    if api == "responses":
        return await post_responses(asgi_client, stream)
    if api == "messages":
        return await post_messages(asgi_client, stream)
    return await asgi_client.post("/v1/chat/completions", json={**chat_body(), "stream": stream}, headers=OPENAI_AUTH)


FIRST = {"responses": responses_first, "messages": messages_first, "chat": chat_first}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["responses", "messages", "chat"])
async def test_a_read_call_beside_a_value_nested_300_deep_is_answered_not_shown(asgi_client, upstream, api, stream):
    """Nothing of the proxy's call needs the deep value: the call is answered, the asgi_client gets the answer."""
    upstream.fail_next(200, FIRST[api](stream, "beside"), SSE if stream else {})
    r = await post(asgi_client, api, stream)
    assert r.status_code == 200, r.text
    assert_no_call_of_ours(r.content)
    assert len(upstream.requests) == 2, r.content  # the call was answered
    assert b'"deep"' not in upstream.requests[1].body  # nothing nested that deep was sent on


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", ["responses", "messages", "chat"])
async def test_a_read_call_nested_300_deep_is_never_shown(asgi_client, upstream, api, stream):
    """The call itself holds the deep value: never relayed, never written by orjson; answered or removed."""
    upstream.fail_next(200, FIRST[api](stream, "inside"), SSE if stream else {})
    r = await post(asgi_client, api, stream)
    assert r.status_code == 200, r.text
    assert_no_call_of_ours(r.content)
    for rec in upstream.requests[1:]:
        assert b'"deep"' not in rec.body  # nothing nested that deep was sent on


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_read_call_nested_300_deep_is_answered_with_an_error_the_model_reads(asgi_client, upstream,
                                                                                            stream):
    """As a read call whose streamed input is garbled: the model is told its arguments were unusable, in a
    hidden round whose request carries the call with an empty input; the asgi_client gets the answer after it."""
    upstream.script("read it properly now")
    upstream.fail_next(200, messages_first(stream, "inside"), SSE if stream else {})
    r = await post_messages(asgi_client, stream)
    assert r.status_code == 200, r.text
    assert_no_call_of_ours(r.content)
    assert len(upstream.requests) == 2
    sent = upstream.requests[1].json["messages"]
    call = [b for b in sent[-2]["content"] if b.get("type") == "tool_use"]
    assert call == [{**deep_read_call(), "input": {}}]
    (result,) = [b for b in sent[-1]["content"] if b.get("type") == "tool_result"]
    assert result["tool_use_id"] == "toolu_read" and result["content"].startswith("error: arguments")
    if stream:
        evs = events(r.content)
        assert evs[-1][1]["type"] == "message_stop" and not any(d["type"] == "error" for _, d in evs), evs
        text = "".join(d["delta"].get("text", "") for _, d in evs if d["type"] == "content_block_delta")
        assert text == "readingread it properly now"
        assert [d["index"] for _, d in evs if d["type"] == "content_block_start"] == [0, 1]
    else:
        assert r.json()["content"] == [{"type": "text", "text": "read it properly now"}]


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_read_call_beside_a_client_call_nested_300_deep(asgi_client, upstream, stream):
    """No hidden round (the asgi_client has a call to run): the answer is the provider's, the proxy's call removed,
    the asgi_client's deep input kept (written by the standard library, never by orjson)."""
    bash = {"type": "tool_use", "id": "toolu_bash", "name": "Bash", "input": {"cmd": "ls", "x": nested(300)}}
    read = {**deep_read_call(), "input": {"handle": "ctx_0"}}
    if stream:
        upstream.fail_next(200, messages_stream(block_events(0, read), block_events(1, bash)), SSE)
    else:
        upstream.fail_next(200, dumps(message_obj([read, bash])))
    r = await post_messages(asgi_client, stream)
    assert r.status_code == 200, r.text
    assert_no_call_of_ours(r.content)
    assert len(upstream.requests) == 1
    if stream:
        evs = events(r.content)
        assert [d["content_block"]["name"] for _, d in evs if d["type"] == "content_block_start"] == ["Bash"]
        partial = "".join(d["delta"].get("partial_json", "") for _, d in evs if d["type"] == "content_block_delta")
        assert json.loads(partial) == bash["input"]
    else:
        assert r.json()["content"] == [bash] and r.json()["stop_reason"] == "tool_use"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_read_call_beside_siblings_orjson_cannot_write_is_never_written(asgi_client, upstream, stream):
    """Ten sibling lists nested 250 deep beside the call (orjson 3.13 corrupts its heap writing them, the
    process aborts): the call is still removed, the siblings reach the asgi_client as the standard library
    writes them. Run in this very process."""
    bash = {"type": "tool_use", "id": "toolu_bash", "name": "Bash", "input": {"cmd": "ls", "x": crashing_siblings()}}
    read = {**deep_read_call(), "input": {"handle": "ctx_0"}}
    if stream:
        upstream.fail_next(200, messages_stream(block_events(0, read), block_events(1, bash)), SSE)
    else:
        upstream.fail_next(200, dumps(message_obj([read, bash])))
    r = await post_messages(asgi_client, stream)
    assert r.status_code == 200, r.text
    assert_no_call_of_ours(r.content)
    if not stream:
        assert r.json()["content"] == [bash]


async def test_messages_read_call_beside_a_block_nested_300_deep_is_removed(asgi_client, upstream):
    """The deep block would go back in the next round's assistant turn, which cannot be written: the round
    ends as the last one does, the proxy's call removed (the asgi_client's stream is one valid stream)."""
    deep_text = (named({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": "", "extra": nested(300)}})
                 + named({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}})
                 + named({"type": "content_block_stop", "index": 0}))
    read = {**deep_read_call(), "input": {"handle": "ctx_0"}}
    upstream.fail_next(200, messages_stream(deep_text, block_events(1, read)), SSE)
    r = await post_messages(asgi_client, stream=True)
    assert r.status_code == 200
    assert_no_call_of_ours(r.content)
    evs = events(r.content)
    assert [d["type"] for _, d in evs][-2:] == ["message_delta", "message_stop"], evs
    assert evs[-2][1]["delta"]["stop_reason"] == "end_turn"
    assert len(upstream.requests) == 1
