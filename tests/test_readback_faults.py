"""The hidden read-back loop survives whatever the provider answers.

A request with tools gets the proxy's `context_read` tool, so every reply to it
goes through the loop that looks for calls to that tool (proxy/rewrite/context_read/loop.py).
A reply of any other shape than the documented one is relayed exactly as the
provider sent it; the reply to a round the client never saw, when it is
unusable, becomes one clean OpenAI-shaped error - never the provider's raw
bytes inside the client's stream, never a 500.

Replies are scripted byte for byte with the mock's `fail_next(200, body)`.
"""

from __future__ import annotations

import itertools
import json
import socket
from typing import Any

import httpx
import pytest
from proxy_server import InProcessProxy, make_settings
from test_faults import RawUpstream, read_request

KEY = "sk-readback-faults"
AUTH = {"authorization": f"Bearer {KEY}"}
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
MARK = b"injected"  # in every unusable provider reply: must never reach the client
READ = {"id": "call_r", "type": "function", "function": {"name": "context_read", "arguments": '{"handle":"ctx_0"}'}}
SSE = {"content-type": "text/event-stream"}


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def completion(message: Any, finish: str = "tool_calls") -> dict[str, Any]:
    return {"id": "chatcmpl-x", "object": "chat.completion", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def calling(calls: Any) -> dict[str, Any]:
    return completion({"role": "assistant", "content": None, "tool_calls": calls})


def chunk(delta: Any, finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def sse(*events: Any) -> bytes:
    """Events as a provider frames them (bytes are taken as already framed), ending in [DONE]."""
    out = [e if isinstance(e, bytes) else b"data: " + dumps(e) + b"\n\n" for e in events]
    return b"".join(out) + b"data: [DONE]\n\n"


OPENING = chunk({"role": "assistant", "content": None})
FINISH = chunk({}, "tool_calls")
TC = {"index": 0, "id": "call_r", "type": "function",
      "function": {"name": "context_read", "arguments": '{"handle":"ctx_0"}'}}
READ_STREAM = sse(OPENING, chunk({"tool_calls": [TC]}), FINISH)
READ_REPLY = dumps(calling([READ]))




def chat(p: InProcessProxy, stream: bool) -> httpx.Response:
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "stream": stream}
    return p.post("/v1/chat/completions", json=body, headers=AUTH, timeout=20)


def events(body: bytes) -> list[Any]:
    """Each event of a proxy stream, strictly: one `data:` line of JSON or [DONE], blank-line terminated."""
    assert body.endswith(b"\n\n"), body[-200:]
    out = []
    for ev in body[:-2].split(b"\n\n"):
        assert ev.startswith(b"data: ") and b"\n" not in ev, ev
        payload = ev[6:]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def assert_one_error_event_at_the_end(body: bytes) -> dict[str, Any]:
    assert MARK not in body, body
    evs = events(body)
    errors = [e for e in evs if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and evs[-1] is errors[0], evs
    err = errors[0]["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str) and "code" in err
    return err


def assert_openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    assert MARK not in r.content, r.content
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str) and "code" in err
    return err


# --------------------------------------------------------------------------- first round: relayed untouched

MALFORMED_REPLIES: dict[str, bytes] = {
    "message a string": dumps(completion("context_read")),
    "message a list": dumps(completion([READ])),
    "message null": dumps(completion(None)),
    "tool_calls an object": dumps(calling(READ)),
    "tool_calls a string": dumps(calling("context_read")),
    "a call that is a string": dumps(calling(["context_read"])),
    "a call that is a list": dumps(calling([[READ]])),
    "read call beside a string": dumps(calling([READ, "bash"])),
    "function a string": dumps(calling([{**READ, "function": "context_read"}])),
    "function a list": dumps(calling([{**READ, "function": ["context_read"]}])),
    "arguments an object": dumps(calling([{**READ, "function": {"name": "context_read",
                                                                 "arguments": {"handle": "ctx_0"}}}])),
    "arguments a number": dumps(calling([{**READ, "function": {"name": "context_read", "arguments": 7}}])),
    "name a list": dumps(calling([{**READ, "function": {"name": ["context_read"], "arguments": "{}"}}])),
    "id an object": dumps(calling([{**READ, "id": {"x": 1}}])),
    "choices an object": dumps({"id": "c", "choices": {"0": calling([READ])["choices"][0]}}),
    "choices a string": dumps({"id": "c", "choices": "x"}),
    "choice a string": dumps({"id": "c", "choices": ["x"]}),
    "choices missing": dumps({"id": "c", "object": "chat.completion"}),
    "body a list": dumps([calling([READ])]),
    "body a string": dumps("context_read"),
    "body null": b"null",
    "not JSON": b"<html>Bad gateway</html>",
}


@pytest.mark.parametrize("name", MALFORMED_REPLIES)
def test_ill_formed_reply_is_relayed_as_the_provider_sent_it(proxy, upstream, name):
    raw = MALFORMED_REPLIES[name]
    upstream.fail_next(200, raw)
    r = chat(proxy, stream=False)
    assert r.status_code == 200 and r.content == raw, (r.status_code, r.text)
    assert len(upstream.requests) == 1  # no hidden round on a reply the proxy cannot read


MALFORMED_STREAMS: dict[str, bytes] = {
    "delta a string": sse(OPENING, chunk("context_read"), FINISH),
    "delta a list": sse(OPENING, chunk([TC]), FINISH),
    "choice a string": sse(OPENING, {"id": "c", "choices": ["x"]}, FINISH),
    "choices an object": sse(OPENING, {"id": "c", "choices": {"index": 0, "delta": {"tool_calls": [TC]}}}, FINISH),
    "choices a string": sse(OPENING, {"id": "c", "choices": "x"}, FINISH),
    "two choices": sse(OPENING, {"id": "c", "choices": [chunk({"tool_calls": [TC]})["choices"][0]] * 2}, FINISH),
    "tool_calls an object": sse(OPENING, chunk({"tool_calls": TC}), FINISH),
    "tool_calls a string": sse(OPENING, chunk({"tool_calls": "context_read"}), FINISH),
    "a call that is a string": sse(OPENING, chunk({"tool_calls": ["context_read"]}), FINISH),
    "index a list": sse(OPENING, chunk({"tool_calls": [{**TC, "index": [0]}]}), FINISH),
    "index an object": sse(OPENING, chunk({"tool_calls": [{**TC, "index": {"i": 0}}]}), FINISH),
    "index a string": sse(OPENING, chunk({"tool_calls": [{**TC, "index": "0"}]}), FINISH),
    "function a string": sse(OPENING, chunk({"tool_calls": [{**TC, "function": "context_read"}]}), FINISH),
    "name a number": sse(OPENING, chunk({"tool_calls": [{**TC, "function": {"name": 5, "arguments": ""}}]}), FINISH),
    "arguments an object": sse(OPENING, chunk({"tool_calls": [{**TC, "function": {
        "name": "context_read", "arguments": {"handle": "ctx_0"}}}]}), FINISH),
    "id a list": sse(OPENING, chunk({"tool_calls": [{**TC, "id": ["call_r"]}]}), FINISH),
    "read call then an ill-formed call": sse(OPENING, chunk({"tool_calls": [TC]}),
                                             chunk({"tool_calls": [{**TC, "index": [1]}]}), FINISH),
    "chunk a list": sse(OPENING, [chunk({"tool_calls": [TC]})], FINISH),
    "chunk a string": sse(OPENING, "context_read", FINISH),
    "data not JSON": sse(OPENING, b"data: <html>Bad gateway</html>\n\n", FINISH),
}


@pytest.mark.parametrize("name", MALFORMED_STREAMS)
def test_ill_formed_stream_is_relayed_as_the_provider_sent_it(proxy, upstream, name):
    raw = MALFORMED_STREAMS[name]
    upstream.fail_next(200, raw, SSE)
    r = chat(proxy, stream=True)
    assert r.status_code == 200 and r.content == raw, (r.status_code, r.text)
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("stream", [False, True])
def test_read_call_with_content_and_usage_of_odd_types_still_reads_back(proxy, upstream, stream):
    """Fields the loop does not need may be anything: the read is answered all the same."""
    if stream:
        odd = chunk({"tool_calls": [TC], "content": {"odd": 1}})
        upstream.fail_next(200, sse(OPENING, odd, FINISH, {"id": "c", "choices": [], "usage": "many"}), SSE)
    else:
        reply = calling([READ])
        reply["choices"][0]["message"]["content"] = 5
        upstream.fail_next(200, dumps({**reply, "usage": ["many"]}))
    upstream.script("read it")
    r = chat(proxy, stream=stream)
    assert r.status_code == 200, r.text
    assert len(upstream.requests) == 2
    if stream:
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events(r.content)
                       if isinstance(e, dict) and e.get("choices"))
        assert text == "read it"
    else:
        assert r.json()["choices"][0]["message"]["content"] == "read it"


# --------------------------------------------------------------------------- hidden round: one clean error

HIDDEN_FAILURES: dict[str, tuple[int, bytes, dict[str, str]]] = {
    "HTML 502 from a gateway": (502, b"<html><body>Bad gateway\n\ndata: {\"injected\": true}\n\n</body></html>",
                                {"content-type": "text/html"}),
    "HTML 200": (200, b"<html>\n\ndata: {\"choices\": [{\"delta\": {\"content\": \"injected\"}}]}\n\n</html>",
                 {"content-type": "text/html"}),
    "empty 200": (200, b"", {"content-type": "application/json"}),
    "JSON 200 with message a string": (200, dumps(completion("injected")), {}),
    "JSON 200 with choices an object": (200, dumps({"choices": {"injected": 1}}), {}),
    "JSON 200 that is an error": (200, dumps({"error": {"message": "overloaded", "type": "server_error"},
                                              "injected": True}), {}),
    "JSON 503 that is not an OpenAI error": (503, dumps({"detail": "injected"}), {}),
    "event stream with a non-JSON event": (200, sse(OPENING, b"data: <html>injected</html>\n\n",
                                                    chunk({}, "stop")), SSE),
    "event stream with a delta that is a string": (200, sse(OPENING, chunk("injected"), chunk({}, "stop")), SSE),
    "event stream with an index that is a list": (200, sse(OPENING, chunk({"tool_calls": [{**TC, "index": [0],
                                                   "id": "injected"}]}), chunk({}, "stop")), SSE),
    "event stream with a chunk that is a list": (200, sse(OPENING, [{"injected": 1}], chunk({}, "stop")), SSE),
    "event stream with an error event": (200, sse(OPENING, {"error": {"message": "overloaded", "type": "x",
                                                                     "injected": True}}), SSE),
}


@pytest.mark.parametrize("name", HIDDEN_FAILURES)
@pytest.mark.parametrize("stream", [False, True])
def test_unusable_answer_to_a_hidden_round_is_one_clean_error(proxy, upstream, name, stream):
    status, raw, headers = HIDDEN_FAILURES[name]
    if stream:
        upstream.fail_next(200, READ_STREAM, SSE)
    else:
        upstream.fail_next(200, READ_REPLY)
    upstream.fail_next(status, raw, headers)
    r = chat(proxy, stream=stream)
    assert len(upstream.requests) == 2  # the hidden round was asked
    if stream:
        assert r.status_code == 200
        assert_one_error_event_at_the_end(r.content)
    else:
        assert_openai_error(r, status if status >= 400 else 502)


@pytest.mark.parametrize("stream", [False, True])
def test_provider_error_in_a_hidden_round_keeps_its_status_and_message(proxy, upstream, stream):
    body = {"error": {"message": "Rate limit reached for gpt-4o", "type": "requests", "param": None,
                      "code": "rate_limit_exceeded"}}
    upstream.fail_next(200, READ_STREAM if stream else READ_REPLY, SSE if stream else {})
    upstream.fail_next(429, dumps(body), {"retry-after": "7"})
    r = chat(proxy, stream=stream)
    if stream:
        err = assert_one_error_event_at_the_end(r.content)
        assert err["message"] == body["error"]["message"] and err["code"] == "rate_limit_exceeded"
    else:
        assert r.status_code == 429 and r.json() == body and r.headers["retry-after"] == "7"


def _read_call_then_hang_up(conn: socket.socket, n: itertools.count, stream: bool) -> None:
    """First connection: a read call; every later one: read the request and close without a word."""
    read_request(conn)
    if next(n):
        return
    body, ctype = (READ_STREAM, b"text/event-stream") if stream else (READ_REPLY, b"application/json")
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                 % (ctype, len(body), body))


@pytest.mark.parametrize("stream", [False, True])
def test_transport_failure_in_a_hidden_round_is_one_clean_error(upstream, tmp_path, stream):
    n = itertools.count()
    with RawUpstream(lambda conn: _read_call_then_hang_up(conn, n, stream)) as raw, \
            InProcessProxy(make_settings(raw.base_url, f"sqlite:///{tmp_path}/ctx.db")) as p:
        r = chat(p, stream=stream)
    if stream:
        assert r.status_code == 200
        err = assert_one_error_event_at_the_end(r.content)
        assert err["code"] == "upstream_unreachable"
    else:
        assert assert_openai_error(r, 502)["code"] == "upstream_unreachable"


def test_a_proxy_bug_mid_stream_still_ends_the_stream_with_an_error_event(proxy, upstream, monkeypatch):
    """The last resort: headers are out, so an unexpected failure is said in the stream, not by cutting it."""
    async def broken(*args: Any) -> str:
        raise RuntimeError("a bug")

    monkeypatch.setattr("proxy.rewrite.context_read.loop.answer", broken)
    upstream.fail_next(200, READ_STREAM, SSE)
    r = chat(proxy, stream=True)
    assert r.status_code == 200
    assert assert_one_error_event_at_the_end(r.content)["code"] == "internal_error"
