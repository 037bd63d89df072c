"""The hidden read-back loop on /v1/messages survives whatever the provider answers.

tests/test_readback_faults.py for Anthropic's Messages API: a request with a
big tool result gets it offloaded behind a handle, and the proxy's
`context_read` tool; when the model calls that tool with the handle, the
proxy answers in a round the client never sees (proxy/rewrite/context_read/loop.py).
A first answer the loop cannot read is relayed exactly as the provider sent
it; an unusable answer to a hidden round becomes one Anthropic-shaped error
(`{"type": "error", "error": {...}}`, in a stream one `event: error`), never
the provider's bytes spliced in, never a 500.

The handle is learnt from a first request (the same request is always
rewritten into the same bytes, handle included); replies are then scripted
byte for byte with the mock's `fail_next(200, body)`.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
from typing import Any

import httpx
import pytest
from mock_upstream import MockUpstream
from proxy_server import InProcessProxy, make_settings
from test_faults import CLAUDE as MODEL
from test_faults import MESSAGES, OFFLOAD, RawUpstream, read_request, sse_frames
from test_faults import MESSAGES_TOOLS as TOOLS
from test_faults import _messages_big as big_tool_turns

AUTH = MESSAGES.headers()


def assert_anthropic_error(r: httpx.Response, status: int, type_: str | None = None) -> dict[str, Any]:
    return MESSAGES.assert_error(r, status, {"type": type_} if type_ else None)


def assert_one_error_event_at_the_end(raw: bytes, type_: str | None = None) -> dict[str, Any]:
    return MESSAGES.one_error_event_at_the_end(raw, {"type": type_} if type_ else None)


frames = sse_frames

MARK = b"injected"  # in every unusable provider reply: must never reach the client
SSE = {"content-type": "text/event-stream"}
HANDLE = re.compile(r'context_read\(handle=\\?"(ctx_[0-9a-f]+)')  # in the JSON body: its quote escaped


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def ev(data: Any, name: str | None = None) -> bytes:
    """One event as a provider frames it; `name` for data that is not an object with a type."""
    kind = name or (data["type"] if isinstance(data, dict) else "x")
    return b"event: " + kind.encode() + b"\ndata: " + (data if isinstance(data, bytes) else dumps(data)) + b"\n\n"


def message(content: Any, stop: str = "tool_use", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "id": "msg_x", "type": "message", "role": "assistant", "content": content,
            "stop_reason": stop, "stop_sequence": None, "usage": {"input_tokens": 500, "output_tokens": 20},
            **extra}


def read_call(handle: str, id_: Any = "toolu_read") -> dict[str, Any]:
    return {"type": "tool_use", "id": id_, "name": "context_read", "input": {"handle": handle, "offset": 10}}


START = ev({"type": "message_start", "message": {**message([], None), "usage": {"input_tokens": 500,
                                                                                  "output_tokens": 1}}})
PING = ev({"type": "ping"})


def stop(reason: str = "tool_use") -> bytes:
    return (ev({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": 20}}) + ev({"type": "message_stop"}))


def streamed_call(handle: str, index: int = 0, id_: Any = "toolu_read") -> bytes:
    args = json.dumps({"handle": handle, "offset": 10})
    return (ev({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id_, "name": "context_read", "input": {}}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                           "partial_json": ""}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                           "partial_json": args[:9]}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta",
                                                                           "partial_json": args[9:]}})
            + ev({"type": "content_block_stop", "index": index}))


def streamed_text(text: str, index: int = 0) -> bytes:
    return (ev({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})
            + ev({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})
            + ev({"type": "content_block_stop", "index": index}))


pytestmark = pytest.mark.proxy_config(defaults=OFFLOAD)


def body(stream: bool) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 512, "messages": big_tool_turns("readback"), "tools": TOOLS,
            "stream": stream}


def send(p: InProcessProxy, stream: bool) -> httpx.Response:
    return p.post("/v1/messages", json=body(stream), headers=AUTH, timeout=20)


def learn_handle(p: InProcessProxy, upstream: MockUpstream) -> str:
    """The handle the proxy gives the big tool result: a first request shows it; then the mock is reset."""
    r = send(p, stream=False)
    assert r.status_code == 200 and r.headers.get("x-ctxproxy-offloaded") == "1", (r.status_code, r.headers)
    found = HANDLE.search(upstream.requests[-1].body.decode())
    assert found, upstream.requests[-1].body[:3000]
    upstream.reset()
    return found.group(1)


@pytest.fixture
def handle(proxy, upstream) -> str:
    return learn_handle(proxy, upstream)


def hidden_request_results(upstream: MockUpstream) -> list[dict[str, Any]]:
    """The proxy's tool_result blocks in the hidden round's request."""
    last = upstream.requests[1].json["messages"][-1]
    return [b for b in last["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


# --------------------------------------------------------------------------- the round, working

@pytest.mark.parametrize("stream", [False, True])
def test_a_read_call_on_the_offloaded_result_is_answered_in_a_hidden_round(proxy, upstream, handle, stream):
    """The control: the scripted call reads the stored text back, and the client sees only the final answer."""
    upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": handle, "offset": 10}}]},
                    "line 10 says ok")
    r = send(proxy, stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    (result,) = hidden_request_results(upstream)
    assert "readback line 10: worker processed item" in result["content"]
    if stream:
        evs = frames(r.content)
        assert [n for n, _ in evs].count("message_start") == 1 and evs[-1][0] == "message_stop"
        assert not any(d.get("content_block", {}).get("type") == "tool_use" for _, d in evs)
        assert "".join(d["delta"].get("text", "") for n, d in evs if n == "content_block_delta") == \
            "line 10 says ok"
    else:
        out = r.json()
        assert out["content"] == [{"type": "text", "text": "line 10 says ok"}] and out["stop_reason"] == "end_turn"
        assert r.headers["x-ctxproxy-read-rounds"] == "1"


# --------------------------------------------------------------------------- first round: relayed untouched

def malformed_replies(h: str) -> dict[str, bytes]:
    call = read_call(h)
    return {
        "content a string": dumps(message("context_read")),
        "content an object": dumps(message(call)),
        "content null": dumps(message(None)),
        "a block that is a string": dumps(message(["context_read"])),
        "a block that is a list": dumps(message([[call]])),
        "name a list": dumps(message([{**call, "name": ["context_read"]}])),
        "id an object": dumps(message([read_call(h, {"x": 1})])),
        "id a list": dumps(message([read_call(h, ["toolu_read"])])),
        "type not message": dumps({**message([call]), "type": "completion"}),
        "type missing": dumps({k: v for k, v in message([call]).items() if k != "type"}),
        "body a list": dumps([message([call])]),
        "body a string": dumps("context_read"),
        "body null": b"null",
        "not JSON": b"<html>Bad gateway</html>",
        "empty": b"",
    }


MALFORMED_NAMES = list(malformed_replies("ctx_0"))


@pytest.mark.parametrize("name", MALFORMED_NAMES)
def test_ill_formed_reply_is_relayed_as_the_provider_sent_it(proxy, upstream, handle, name):
    raw = malformed_replies(handle)[name]
    upstream.fail_next(200, raw)
    r = send(proxy, stream=False)
    assert r.status_code == 200 and r.content == raw, (r.status_code, r.text)
    assert len(upstream.requests) == 1  # no hidden round on a reply the proxy cannot read


def malformed_streams(h: str) -> dict[str, bytes]:
    call = streamed_call(h)
    return {
        "content_block a string": START + ev({"type": "content_block_start", "index": 0,
                                               "content_block": "context_read"}) + stop(),
        "content_block a list": START + ev({"type": "content_block_start", "index": 0,
                                             "content_block": [read_call(h)]}) + stop(),
        "index a string": START + call.replace(b'"index":0', b'"index":"0"') + stop(),
        "index a list": START + call.replace(b'"index":0', b'"index":[0]') + stop(),
        "id a list": START + streamed_call(h, id_=["toolu_read"]) + stop(),
        "data a list": START + ev(dumps([read_call(h)]), "content_block_start") + stop(),
        "data a string": START + ev(b'"context_read"', "content_block_start") + stop(),
        "data not JSON": START + ev(b"<html>Bad gateway</html>", "content_block_start") + stop(),
        "an event of an unknown type": START + ev({"type": "future_event", "x": 1}) + streamed_text("hi") + stop(
            "end_turn"),
    }


STREAM_NAMES = list(malformed_streams("ctx_0"))


@pytest.mark.parametrize("name", STREAM_NAMES)
def test_ill_formed_stream_is_relayed_as_the_provider_sent_it(proxy, upstream, handle, name):
    raw = malformed_streams(handle)[name]
    upstream.fail_next(200, raw, SSE)
    r = send(proxy, stream=True)
    assert r.status_code == 200 and r.content == raw, (r.status_code, r.content)
    assert len(upstream.requests) == 1


def test_a_read_call_whose_streamed_input_is_garbled_is_answered_with_an_error_the_model_reads(proxy, upstream,
                                                                                               handle):
    """The proxy hides its call's events as they come, so a garbled one cannot be relayed as sent any more:
    the round runs on what could be read, and the model is told its arguments were unreadable."""
    first_piece = json.dumps({"handle": handle, "offset": 10})[:9]  # '{"handle"' (see streamed_call)
    garbled = streamed_call(handle).replace(
        b'"delta":{"type":"input_json_delta","partial_json":' + dumps(first_piece) + b"}", b'"delta":"injected"')
    assert garbled != streamed_call(handle)
    upstream.fail_next(200, START + garbled + stop(), SSE)
    upstream.script("sorry, again")
    r = send(proxy, stream=True)
    assert r.status_code == 200 and MARK not in r.content, r.content
    assert len(upstream.requests) == 2
    (result,) = hidden_request_results(upstream)
    assert result["content"].startswith("error: arguments must be")
    evs = frames(r.content)
    assert evs[-1][0] == "message_stop" and not any(d.get("content_block", {}).get("type") == "tool_use"
                                                    for _, d in evs)


# --------------------------------------------------------------------------- hidden round: one clean error

HIDDEN_FAILURES: dict[str, tuple[int, bytes, dict[str, str]]] = {
    "HTML 502 from a gateway": (502, b"<html><body>Bad gateway\n\nevent: error\ndata: {\"injected\": true}\n\n"
                                     b"</body></html>", {"content-type": "text/html"}),
    "HTML 200": (200, b"<html>\n\nevent: content_block_delta\ndata: {\"type\": \"content_block_delta\", "
                      b"\"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"injected\"}}\n\n</html>",
                 {"content-type": "text/html"}),
    "empty 200": (200, b"", {"content-type": "application/json"}),
    "JSON 200 with content a string": (200, dumps(message("injected")), {}),
    "JSON 200 that is not a message": (200, dumps({**message([{"type": "text", "text": "injected"}]),
                                                   "type": "injected"}), {}),
    "JSON 200 that is an error": (200, dumps({"type": "error", "error": {"type": "overloaded_error",
                                                                       "message": "Overloaded"},
                                              "injected": True}), {}),
    "JSON 503 that is not an Anthropic error": (503, dumps({"detail": "injected"}), {}),
    "event stream with a non-JSON event": (200, START + ev(b"<html>injected</html>", "content_block_delta")
                                           + stop("end_turn"), SSE),
    "event stream with data that is a list": (200, START + ev(dumps([{"injected": 1}]), "content_block_start")
                                              + stop("end_turn"), SSE),
    "event stream with an error event": (200, START + streamed_text("fine") + ev(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "injected": True}), SSE),
    "event stream cut before message_stop": (200, START + streamed_text("shown as it came") + ev(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}), SSE),
    "event stream with content_block a string": (200, START + ev({"type": "content_block_start", "index": 0,
                                                                  "content_block": "injected"})
                                                 + stop("end_turn"), SSE),
    "event stream with an index that is a string": (200, START + streamed_text("injected").replace(
        b'"index":0', b'"index":"0"') + stop("end_turn"), SSE),
    "event stream with a delta that is a string": (200, START + ev(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        + ev({"type": "content_block_delta", "index": 0, "delta": "injected"}) + stop("end_turn"), SSE),
}


def first_read(handle: str, stream: bool) -> tuple[bytes, dict[str, str]]:
    if stream:
        return START + streamed_text("Let me look.") + streamed_call(handle, 1) + stop(), SSE
    return dumps(message([{"type": "text", "text": "Let me look."}, read_call(handle)])), {}


@pytest.mark.parametrize("name", HIDDEN_FAILURES)
@pytest.mark.parametrize("stream", [False, True])
def test_unusable_answer_to_a_hidden_round_is_one_clean_anthropic_error(proxy, upstream, handle, name, stream):
    status, raw, headers = HIDDEN_FAILURES[name]
    upstream.fail_next(200, *first_read(handle, stream))
    upstream.fail_next(status, raw, headers)
    r = send(proxy, stream)
    assert len(upstream.requests) == 2  # the hidden round was asked
    assert "readback line 10" in hidden_request_results(upstream)[0]["content"]
    assert MARK not in r.content, r.content
    if stream:
        assert r.status_code == 200
        assert_one_error_event_at_the_end(r.content)
    else:
        assert_anthropic_error(r, status if status >= 400 else 502)


@pytest.mark.parametrize("status,type_,message", [(429, "rate_limit_error", "Number of request tokens has "
                                                   "exceeded your per-minute rate limit"),
                                                  (529, "overloaded_error", "Overloaded")])
@pytest.mark.parametrize("stream", [False, True])
def test_provider_error_in_a_hidden_round_keeps_its_status_type_and_message(proxy, upstream, handle, status,
                                                                           type_, message, stream):
    error = {"type": "error", "error": {"type": type_, "message": message}, "request_id": "req_011abc"}
    upstream.fail_next(200, *first_read(handle, stream))
    upstream.fail_next(status, dumps(error), {"retry-after": "7"})
    r = send(proxy, stream)
    if stream:
        err = assert_one_error_event_at_the_end(r.content, type_)
        assert err["message"] == message
    else:
        assert r.status_code == status and r.json() == error and r.headers["retry-after"] == "7"


def test_an_error_event_in_a_hidden_round_keeps_the_providers_error_type(proxy, upstream, handle):
    """Overloaded mid-stream is still `overloaded_error` to the client (Claude Code retries on it)."""
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    upstream.fail_next(200, *first_read(handle, True))
    upstream.fail_next(200, START + ev(error), SSE)
    r = send(proxy, True)
    err = assert_one_error_event_at_the_end(r.content, "overloaded_error")
    assert err["message"] == "Overloaded"


def _read_call_then_hang_up(conn: socket.socket, n: itertools.count, handle: str, stream: bool) -> None:
    """First connection: a read call; every later one: read the request and close without a word."""
    read_request(conn)
    if next(n):
        return
    raw, headers = first_read(handle, stream)
    ctype = (headers.get("content-type") or "application/json").encode()
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                 % (ctype, len(raw), raw))


@pytest.mark.parametrize("stream", [False, True])
def test_transport_failure_in_a_hidden_round_is_one_clean_anthropic_error(tmp_path, stream):
    with MockUpstream() as mock, InProcessProxy(make_settings(mock.base_url, f"sqlite:///{tmp_path}/ctx.db",
                                                           defaults=OFFLOAD)) as learn:
        handle = learn_handle(learn, mock)
    n = itertools.count()
    with RawUpstream(lambda conn: _read_call_then_hang_up(conn, n, handle, stream)) as raw, \
            InProcessProxy(make_settings(raw.base_url, f"sqlite:///{tmp_path}/ctx.db", defaults=OFFLOAD)) as p:
        r = send(p, stream)
        assert raw.connections >= 2  # the hidden round was asked (a connection closed unanswered is retried once)
    if stream:
        assert r.status_code == 200
        err = assert_one_error_event_at_the_end(r.content, "api_error")
    else:
        err = assert_anthropic_error(r, 502, "api_error")
    assert f"127.0.0.1:{raw.port}" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_proxy_bug_in_a_hidden_round_is_one_anthropic_error(proxy, upstream, handle, monkeypatch, stream):
    """The last resort: an unexpected failure is said in Anthropic's shape (in a stream, as its last event)."""
    async def broken(*args: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr("proxy.rewrite.context_read.loop.answer", broken)
    upstream.fail_next(200, *first_read(handle, stream))
    r = send(proxy, stream)
    if stream:
        assert r.status_code == 200
        err = assert_one_error_event_at_the_end(r.content, "api_error")
    else:
        err = assert_anthropic_error(r, 500, "api_error")
    assert "internal proxy error" in err["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_usage_summed_over_rounds_past_64_bits_is_still_written(proxy, upstream, handle, stream):
    """A gateway's absurd figures: the sum of two rounds passes what orjson writes (was a 500 / an error event)."""
    most = 2 ** 64 - 1
    usage = {"input_tokens": most, "output_tokens": most}
    if stream:
        def end(reason: str) -> bytes:
            return ev({"type": "message_delta", "delta": {"stop_reason": reason}, "usage": usage}) + \
                ev({"type": "message_stop"})
        upstream.fail_next(200, START + streamed_call(handle) + end("tool_use"), SSE)
        upstream.fail_next(200, START + streamed_text("read it") + end("end_turn"), SSE)
    else:
        upstream.fail_next(200, dumps({**message([read_call(handle)]), "usage": usage}))
        upstream.fail_next(200, dumps({**message([{"type": "text", "text": "read it"}], "end_turn"), "usage": usage}))
    r = send(proxy, stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    if stream:
        evs = frames(r.content)
        assert evs[-1][0] == "message_stop"
        (delta,) = [d for n, d in evs if n == "message_delta"]
        assert delta["usage"]["output_tokens"] == 2 * most
    else:
        assert r.json()["usage"]["output_tokens"] == 2 * most
        assert r.json()["content"] == [{"type": "text", "text": "read it"}]
