"""What a Messages API client (Claude Code, the anthropic SDK) sees when something breaks.

The faults of tests/test_faults.py, tests/test_containment.py and
tests/test_bad_input_and_failures.py on `POST /v1/messages`: a failing
transform, provider errors (5xx and 529 `overloaded_error`), dropped sockets,
streams cut mid-way or ending without `message_stop`, a dead or slow
provider, malformed requests, a store that goes away. Every error the proxy
makes itself is in Anthropic's shape (`{"type": "error", "error": {"type",
"message"}}`), in a stream as one `event: error`; every error the provider
makes reaches the client as it sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings
from silent_server import SilentServer
from test_faults import (
    RawUpstream,
    RedisProcess,
    _chunked,
    close_at_once,
    free_port,
    read_request,
    read_then_close,
    read_then_reset,
    reset,
    truncated_json,
)

import proxy.store.guarded as guarded
from proxy.store import open_store

KEY = "sk-ant-faults"
AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
MODEL = "claude-sonnet-4-6"
HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"name": "Bash", "description": "Run a shell command.",
          "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
OFFLOAD = {"offload": {"tool_result_tokens": 300}}
ANTHROPIC_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
                   "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}


# --------------------------------------------------------------------------- shapes

# A request that waited on the dead store (the Redis client's own 5-10 s stalls) fails as a ReadTimeout:
# the client's timeout bounds the answer, in process as over a socket. A store call costs at most
# store_timeout (0.5 s), so the bound is generous and no clock is read.
STALL_BOUND_S = 4.0


def assert_anthropic_error(r: httpx.Response, status: int, type_: str | None = None) -> dict[str, Any]:
    """A response the proxy made itself: Anthropic's error envelope, nothing else."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json"), r.headers
    return assert_anthropic_body(r.json(), type_)


def assert_anthropic_body(body: Any, type_: str | None = None) -> dict[str, Any]:
    assert isinstance(body, dict) and body.get("type") == "error", body
    err = body["error"]
    assert isinstance(err, dict) and err["type"] in ANTHROPIC_TYPES, body
    assert isinstance(err["message"], str) and err["message"], body
    if type_ is not None:
        assert err["type"] == type_, body
    return err


def frames(raw: bytes) -> list[tuple[str, Any]]:
    """(event name, parsed data) of each frame of a Messages stream, strictly: `event:` then one `data:` line."""
    assert raw.endswith(b"\n\n"), raw[-300:]
    out = []
    for block in raw[:-2].split(b"\n\n"):
        lines = block.split(b"\n")
        assert len(lines) == 2 and lines[0].startswith(b"event: ") and lines[1].startswith(b"data:"), block
        data = json.loads(lines[1][5:])
        name = lines[0][7:].decode()
        assert isinstance(data, dict) and data.get("type") == name, block
        out.append((name, data))
    return out


def assert_one_error_event_at_the_end(raw: bytes, type_: str | None = None) -> dict[str, Any]:
    evs = frames(raw)
    errors = [data for name, data in evs if name == "error"]
    assert len(errors) == 1 and evs[-1] == ("error", errors[0]), evs
    assert "message_stop" not in [name for name, _ in evs], evs
    return assert_anthropic_body(errors[0], type_)


def text_of(raw: bytes) -> str:
    return "".join(d["delta"].get("text", "") for n, d in frames(raw) if n == "content_block_delta")


def post(p: Any, body: dict[str, Any], headers: dict[str, str] | None = None, *, path: str = "/v1/messages",
         timeout: float = 10) -> httpx.Response:
    return p.post(path, json=body, headers={**AUTH, **(headers or {})}, timeout=timeout)


def ask(stream: bool = False, messages: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 256, "messages": messages or HI, **extra}
    if stream:
        body["stream"] = True
    return body


def sdk(p: Any, path: str = "", **kw: Any) -> anthropic.Anthropic:
    return p.anthropic(path, api_key=KEY, max_retries=0, timeout=10, **kw)


def big_tool_turns(tag: str, lines: int = 400) -> list[dict[str, Any]]:
    """A conversation whose last tool result is big enough to be offloaded (OFFLOAD)."""
    text = "\n".join(f"{tag} line {i}: worker processed item {i * 7919 % 100003} ok" for i in range(lines))
    return [{"role": "user", "content": f"Read the log ({tag})."},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Reading it."},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"cmd": "cat log"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": text},
                                         {"type": "text", "text": "What failed?"}]}]


def keeps_serving(p: InProcessProxy, upstream: Any) -> None:
    assert p.get("/healthz", timeout=5).status_code == 200
    upstream.script("still here")
    r = post(p, ask())
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == "still here"


pytestmark = pytest.mark.proxy_config(defaults=OFFLOAD)


# --------------------------------------------------------------------------- a transform that fails

@pytest.mark.parametrize("transform", ["offload", "compress", "context_read", "status_bar", "cache_hints"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_transform_forwards_the_clients_bytes(proxy, upstream, transform, stream, monkeypatch):
    target = next(t for t in proxy.state.pipelines["default"] if t.name == transform)

    async def broken(conv, ctx):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug in a transform")

    monkeypatch.setattr(target, "restore" if hasattr(target, "restore") else "apply", broken)
    raw = orjson.dumps({**ask(stream, big_tool_turns("contained")), "tools": TOOLS,
                        "system": [{"type": "text", "text": "You are a coding agent."}]})
    r = proxy.post("/v1/messages", content=raw, headers={**AUTH, "content-type": "application/json"},
                   timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-degraded"] == transform
    assert "x-ctxproxy-offloaded" not in r.headers
    assert upstream.requests[-1].body == raw  # the client's bytes, exactly
    if stream:
        assert frames(r.content)[-1][0] == "message_stop" and text_of(r.content) == "ok"
    else:
        assert r.json()["content"] == [{"type": "text", "text": "ok"}]
    metrics = proxy.get("/metrics").text
    assert any(line.startswith("ctxproxy_degraded_requests_total{") and line.endswith(" 1.0")
               for line in metrics.splitlines()), metrics[:2000]


@pytest.mark.parametrize("transform", ["offload", "compress", "context_read", "cache_hints"])
def test_a_failing_transform_on_count_tokens_counts_the_clients_bytes(proxy, upstream, transform, monkeypatch):
    target = next(t for t in proxy.state.pipelines["default"] if t.name == transform)

    async def broken(conv, ctx):  # noqa: ANN001, ANN202
        raise RuntimeError("a bug in a transform")

    monkeypatch.setattr(target, "apply", broken)
    body = {"model": MODEL, "messages": big_tool_turns("counted"), "tools": TOOLS}
    raw = orjson.dumps(body)
    r = proxy.post("/v1/messages/count_tokens", content=raw,
                   headers={**AUTH, "content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text
    assert upstream.requests[-1].body == raw
    assert r.json()["input_tokens"] > 4000  # the whole tool result was counted, not a placeholder
    assert r.headers["x-ctxproxy-degraded"] == transform  # and the count says why it is the client's own


# --------------------------------------------------------------------------- provider errors

PROVIDER_ERRORS = [
    (500, "api_error", "Internal server error"),
    (503, "api_error", "Service unavailable"),
    (529, "overloaded_error", "Overloaded"),
]


@pytest.mark.parametrize("status,type_,message", PROVIDER_ERRORS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("with_tools", [False, True], ids=["plain", "with-read-tool"])
def test_provider_5xx_and_overloaded_reach_the_client_unchanged(upstream, tmp_path, status, type_, message,
                                                                 stream, with_tools):
    """With tools the proxy's read loop looks at the answer first; the error still passes as it came."""
    raw = json.dumps({"type": "error", "error": {"type": type_, "message": message},
                      "request_id": "req_011CXYZ"}).encode()
    body = ask(stream, **({"tools": TOOLS} if with_tools else {}))
    with InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db")) as p:
        upstream.fail_next(status, raw, {"request-id": "req_011CXYZ", "x-should-retry": "true"})
        r = post(p, body)
        assert r.status_code == status
        assert r.content == raw
        assert r.headers["request-id"] == "req_011CXYZ" and r.headers["x-should-retry"] == "true"
        assert len(upstream.requests) == 1  # no hidden round on an error
        # The SDK sees the provider's own error, of its own class.
        upstream.fail_next(status, raw)
        with pytest.raises(anthropic.APIStatusError) as exc:
            out = sdk(p).messages.create(**body)
            if stream:
                list(out)
        assert exc.value.status_code == status
        assert exc.value.body["error"] == {"type": type_, "message": message}
        if status == 529:
            assert isinstance(exc.value, anthropic.OverloadedError)
        keeps_serving(p, upstream)


def test_provider_rate_limit_keeps_its_retry_after(proxy, upstream):
    raw = json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}).encode()
    upstream.fail_next(429, raw, {"retry-after": "7", "anthropic-ratelimit-requests-remaining": "0"})
    r = post(proxy, ask(True))
    assert r.status_code == 429 and r.content == raw
    assert r.headers["retry-after"] == "7" and r.headers["anthropic-ratelimit-requests-remaining"] == "0"


def test_provider_error_event_in_a_stream_reaches_the_client_as_sent(faulty, upstream):
    """An `event: error` the provider sends mid-stream is the provider's: relayed, and the stream is over."""
    error = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n'
    p = faulty(lambda conn: sse_then(conn, START + BLOCK + delta_text("Hel") + error, "end"))
    for body in (ask(True), ask(True, tools=TOOLS)):
        r = post(p, body, {"x-ctx-route": "broken"})
        assert r.status_code == 200
        assert r.content == START + BLOCK + delta_text("Hel") + error, r.content
    keeps_serving(p, upstream)


# --------------------------------------------------------------------------- a provider that misbehaves

def sse_event(data: dict[str, Any]) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + \
        b"\n\n"


def delta_text(text: str, index: int = 0) -> bytes:
    return sse_event({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})


START = sse_event({"type": "message_start", "message": {
    "id": "msg_raw1", "type": "message", "role": "assistant", "model": MODEL, "content": [], "stop_reason": None,
    "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 1}}})
BLOCK = sse_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
TWO_WORDS = START + BLOCK + delta_text("Hello") + delta_text(" world")
END = (sse_event({"type": "content_block_stop", "index": 0})
       + sse_event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 2}})
       + sse_event({"type": "message_stop"}))


def sse_then(conn: socket.socket, body: bytes, how: str) -> None:
    """Send `body` as an event stream, in a few writes, then end it `how`: reset, eof (no framing) or end (chunked)."""
    read_request(conn)
    chunked = how in ("reset", "end")
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 + (b"transfer-encoding: chunked\r\n\r\n" if chunked else b"connection: close\r\n\r\n"))
    step = max(1, len(body) // 3)
    for i in range(0, len(body), step):
        piece = body[i:i + step]
        conn.sendall(_chunked(piece) if chunked else piece)
        time.sleep(0.03)
    if how == "reset":
        reset(conn)
    elif how == "end":
        conn.sendall(b"0\r\n\r\n")
    else:
        conn.shutdown(socket.SHUT_WR)


def truncated_message(conn: socket.socket) -> None:
    read_request(conn)
    part = b'{"model":"claude-sonnet-4-6","id":"msg_1","type":"message","role":"assistant","content":[{"type":"te'
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n" + part)
    time.sleep(0.05)
    conn.close()


@pytest.fixture
def faulty(upstream, tmp_path) -> Iterator[Callable[..., InProcessProxy]]:
    """`faulty(behave)` → a proxy whose route `broken` goes to a RawUpstream; `default` goes to the mock."""
    stack = contextlib.ExitStack()

    def make(behave: Callable[[socket.socket], None], **raw: Any) -> InProcessProxy:
        raw_up = stack.enter_context(RawUpstream(behave))
        settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db",
                                 routes=[{"name": "broken", "upstream": {"base_url": raw_up.base_url,
                                                                          "read_timeout": 30}}], **raw)
        p = stack.enter_context(InProcessProxy(settings))
        p.raw = raw_up  # type: ignore[attr-defined]
        return p

    with stack:
        yield make


@pytest.mark.parametrize("behave", [close_at_once, read_then_close, read_then_reset, truncated_message,
                                    truncated_json])
@pytest.mark.parametrize("stream", [False, True])
def test_provider_dropping_the_connection_is_a_clean_anthropic_502(faulty, upstream, behave, stream):
    p = faulty(behave)
    for body in (ask(stream), ask(stream, tools=TOOLS)):  # with tools, the read loop reads the answer
        for _ in range(2):  # not just the first time: pooled connections must not poison later requests
            r = post(p, body, {"x-ctx-route": "broken"})
            # answered within the client timeout (10 s), not after the read timeout (30 s)
            err = assert_anthropic_error(r, 502, "api_error")
            assert f"127.0.0.1:{p.raw.port}" in err["message"]
    with pytest.raises(anthropic.InternalServerError) as exc:
        sdk(p, "/r/broken").messages.create(**ask(stream))
    assert exc.value.status_code == 502 and exc.value.body["error"]["type"] == "api_error"
    r = post(p, {"model": MODEL, "messages": HI}, {"x-ctx-route": "broken"}, path="/v1/messages/count_tokens")
    assert_anthropic_error(r, 502, "api_error")
    keeps_serving(p, upstream)


@pytest.mark.parametrize("with_tools", [False, True], ids=["plain", "with-read-tool"])
def test_stream_cut_mid_way_ends_with_one_anthropic_error_event(faulty, upstream, with_tools):
    p = faulty(lambda conn: sse_then(conn, TWO_WORDS, "reset"))
    body = ask(True, **({"tools": TOOLS} if with_tools else {}))
    with p.stream("POST", "/r/broken/v1/messages", headers=AUTH, json=body, timeout=10) as r:
        assert r.status_code == 200
        raw = r.read()
    # answered within the client timeout (10 s), not after the read timeout (30 s)
    assert [n for n, _ in frames(raw)][:4] == ["message_start", "content_block_start", "content_block_delta",
                                              "content_block_delta"]
    assert text_of(raw) == "Hello world"
    assert_one_error_event_at_the_end(raw, "api_error")
    # With the SDK: the two words arrive, then an APIStatusError carrying the proxy's error.
    got: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as exc:
        with sdk(p, "/r/broken").messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as s:
            for text in s.text_stream:
                got.append(text)
    assert got == ["Hello", " world"]
    assert exc.value.body["error"]["type"] == "api_error"
    keeps_serving(p, upstream)


@pytest.mark.parametrize("how", ["eof", "end"])
@pytest.mark.parametrize("cut", ["between-events", "mid-event"])
@pytest.mark.parametrize("with_tools", [False, True], ids=["plain", "with-read-tool"])
def test_stream_ending_without_message_stop_is_reported(faulty, upstream, how, cut, with_tools):
    """The provider ends the body cleanly but the message never finished: the client is told, in a stream it
    can parse (a half-sent event is not glued to the error event)."""
    body_sent = TWO_WORDS if cut == "between-events" else TWO_WORDS + delta_text(" again")[:-12]
    p = faulty(lambda conn: sse_then(conn, body_sent, how))
    body = ask(True, **({"tools": TOOLS} if with_tools else {}))
    r = post(p, body, {"x-ctx-route": "broken"})
    assert r.status_code == 200
    assert text_of(r.content) == "Hello world"
    assert "message_stop" in assert_one_error_event_at_the_end(r.content, "api_error")["message"]
    keeps_serving(p, upstream)


# The same cut on the other two APIs (the fix is shared: proxy/engine/run.py stream_events).
CHAT_EVENT = (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
              b'[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n')
RESPONSES_EVENT = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
                   b'"item_id":"msg_1","output_index":0,"content_index":0,"delta":"%s"}\n\n')


@pytest.mark.parametrize("path,event", [("/v1/chat/completions", CHAT_EVENT), ("/v1/responses", RESPONSES_EVENT)],
                         ids=["chat", "responses"])
def test_other_apis_streams_cut_mid_event_end_with_an_error_event_that_parses(faulty, upstream, path, event):
    sent = event % b"Hello" + (event % b" again")[:-12]
    p = faulty(lambda conn: sse_then(conn, sent, "end"))
    body = ({"model": "m", "messages": HI, "stream": True} if "chat" in path
            else {"model": "m", "input": "hi", "stream": True})
    r = p.post(path, json=body, headers={"authorization": f"Bearer {KEY}", "x-ctx-route": "broken"},
                   timeout=10)
    assert r.status_code == 200
    assert r.content.startswith(event % b"Hello"), r.content
    rest = r.content[len(event % b"Hello"):]
    assert rest.endswith(b"\n\n") and rest.count(b"\n\n") == 1, rest  # one event after the whole one
    data = [line[5:] for line in rest[:-2].split(b"\n") if line.startswith(b"data:")]
    assert len(data) == 1, rest
    err = json.loads(data[0])
    if "chat" in path:
        assert err["error"]["message"], rest
    else:  # the Responses API's own error event, which its clients parse
        assert err["type"] == "error" and err["message"] and err["code"] == "upstream_stream_cut", rest


def test_stream_of_a_whole_message_from_a_raw_provider_passes_byte_for_byte(faulty, upstream):
    """The control for the tests above: the same provider, finishing its message, is relayed as it sent it."""
    p = faulty(lambda conn: sse_then(conn, TWO_WORDS + END, "end"))
    r = post(p, ask(True), {"x-ctx-route": "broken"})
    assert r.status_code == 200 and r.content == TWO_WORDS + END


# --------------------------------------------------------------------------- a dead or slow provider

def test_unreachable_provider_is_an_anthropic_502(tmp_path):
    with InProcessProxy(make_settings("http://127.0.0.1:1/v1", f"sqlite:///{tmp_path}/ctx.db")) as p:
        for stream in (False, True):
            with pytest.raises(anthropic.InternalServerError) as exc:
                out = sdk(p).messages.create(**ask(stream))
                if stream:
                    list(out)
            assert exc.value.status_code == 502
            assert exc.value.body["error"]["type"] == "api_error"
            assert "127.0.0.1:1" in exc.value.body["error"]["message"]
        r = post(p, {"model": MODEL, "messages": HI}, path="/v1/messages/count_tokens")
        assert_anthropic_error(r, 502, "api_error")


def test_slow_provider_is_an_anthropic_504_and_a_stalled_stream_ends_with_an_error_event(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db", upstream={"read_timeout": 0.3})
    with InProcessProxy(settings) as p:
        upstream.delay = 1.0
        assert_anthropic_error(post(p, ask()), 504, "api_error")
        upstream.delay, upstream.chunk_delay = 0.0, 1.0
        upstream.script("a b c d")
        r = post(p, ask(True))
        assert r.status_code == 200
        err = assert_one_error_event_at_the_end(r.content, "api_error")
        assert "timed out" in err["message"]
        upstream.chunk_delay = 0.0
        assert sdk(p).messages.create(**ask()).content[0].text == "ok"


# --------------------------------------------------------------------------- malformed requests

@pytest.mark.parametrize("body", [
    b'{"model": "m", "max_tokens": 5, "messages": [',
    b"\xff\xfe not utf-8",
    b"[1, 2, 3]",
    b'"a string"',
    b'{"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": 7, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "max_tokens": "5", "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "max_tokens": true, "messages": [{"role": "user", "content": "hi"}]}',
    b'{"model": "m", "max_tokens": 5}',
    b'{"model": "m", "max_tokens": 5, "messages": []}',
    b'{"model": "m", "max_tokens": 5, "messages": "hi"}',
    b'{"model": "m", "max_tokens": 5, "messages": [42]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": {"a": 1}}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "no type"}]}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": ["a string block"]}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result", '
    b'"tool_use_id": "toolu_x", "content": "stray"}]}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "go"}, {"role": "assistant", '
    b'"content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}, '
    b'{"role": "user", "content": "unanswered"}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": {}}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"x": 1}]}',
    b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "system": 5}',
])
def test_malformed_messages_bodies_get_an_anthropic_400_and_nothing_reaches_the_provider(proxy, upstream, body):
    r = proxy.post("/v1/messages", content=body, headers=AUTH)
    assert_anthropic_error(r, 400, "invalid_request_error")
    with contextlib.suppress(ValueError):
        parsed = json.loads(body)
        if isinstance(parsed, dict):  # the SDK takes it as a BadRequestError
            with pytest.raises(anthropic.BadRequestError):
                sdk(proxy).post("/v1/messages", body=parsed, cast_to=httpx.Response)
    assert upstream.requests == []
    assert proxy.get("/healthz").status_code == 200


def test_oversized_messages_body_is_an_anthropic_413(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db", server={"max_body_bytes": 4096})
    with InProcessProxy(settings) as p:
        big = orjson.dumps(ask(messages=[{"role": "user", "content": "x" * 5000}]))
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            assert_anthropic_error(p.post(path, content=big, headers=AUTH), 413, "request_too_large")
            chunked = p.post(path, content=iter([big[:2000], big[2000:]]), headers=AUTH)
            assert_anthropic_error(chunked, 413, "request_too_large")
    assert upstream.requests == []


def test_unknown_route_for_a_messages_client_is_anthropic_shaped(proxy, upstream):
    assert_anthropic_error(post(proxy, ask(), {"x-ctx-route": "nope"}), 404, "not_found_error")
    assert_anthropic_error(post(proxy, ask(), path="/r/nope/v1/messages"), 404, "not_found_error")
    assert upstream.requests == []


def test_a_route_whose_upstream_speaks_openai_refuses_a_messages_client_in_anthropics_shape(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db",
                             routes=[{"name": "oai", "upstream": {"base_url": upstream.base_url, "api": "openai"}}])
    with InProcessProxy(settings) as p:
        err = assert_anthropic_error(post(p, ask(), path="/r/oai/v1/messages"), 400, "invalid_request_error")
        assert "Anthropic Messages API" in err["message"]
    assert upstream.requests == []


def test_rejected_messages_requests_store_nothing(upstream, tmp_path):
    url = f"sqlite:///{tmp_path}/ctx.db"
    with InProcessProxy(make_settings(upstream.base_url, url, defaults=OFFLOAD)) as p:
        turns = big_tool_turns("rejected")  # would be offloaded, were it not refused
        for body in ({**ask(messages=turns), "stream": "yes"}, {**ask(messages=turns), "max_tokens": 0},
                     ask(messages=[turns[0], turns[2]]), ask(messages=[{"role": "system", "content": "x"}, *turns])):
            assert_anthropic_error(post(p, body), 400, "invalid_request_error")
        assert_anthropic_error(post(p, ask(messages=turns), {"x-ctx-route": "nope"}), 404)
        p.settle()  # let any (wrong) background write land before looking
    assert upstream.requests == []

    async def everything() -> tuple[list[str], dict]:
        store = open_store(url)
        try:
            return await store.keys(""), await store.counters("")
        finally:
            await store.close()
    keys, counters = asyncio.run(everything())
    assert keys == []  # nothing half-stored: no text, no decision, no session; only the refusals are counted
    assert counters and all(k.endswith(("|requests", "|errors")) for k in counters)
    assert sum(v for k, v in counters.items() if k.endswith("|all|errors")) == 5


def test_a_cut_stream_is_counted_as_a_failed_request(faulty, upstream):
    p = faulty(lambda conn: sse_then(conn, TWO_WORDS + delta_text(" again")[:-12], "end"))
    r = post(p, ask(True), {"x-ctx-route": "broken"})
    assert_one_error_event_at_the_end(r.content)
    metrics = p.get("/metrics", timeout=5).text
    assert re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="502"\} 1\.0', metrics), metrics
    assert not re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="200"\}', metrics)


# --------------------------------------------------------------------------- the store goes away

def test_store_outage_forwards_messages_unmodified_and_recovers(upstream, tmp_path, monkeypatch):
    monkeypatch.setattr(guarded, "MAX_BACKOFF_S", 1.0)
    redis = RedisProcess(free_port(), tmp_path)
    redis.start()
    try:
        settings = make_settings(upstream.base_url, f"redis://127.0.0.1:{redis.port}/0", defaults=OFFLOAD)
        with InProcessProxy(settings) as p, p.http_client(headers=AUTH, timeout=10) as c:
            n = iter(range(1000))

            def send(stream: bool = False) -> tuple[httpx.Response, bytes]:
                raw = orjson.dumps({**ask(stream, big_tool_turns(f"run{next(n)}")), "tools": TOOLS})
                r = c.post("/v1/messages", content=raw, headers={"content-type": "application/json"},
                           timeout=STALL_BOUND_S)
                return r, raw

            r, raw = send()
            assert r.status_code == 200 and r.headers.get("x-ctxproxy-offloaded") == "1", r.headers
            assert "x-ctxproxy-degraded" not in r.headers and upstream.requests[-1].body != raw

            redis.kill()
            for i in range(4):
                r, raw = send(stream=bool(i % 2))
                assert r.status_code == 200, r.text
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert "x-ctxproxy-offloaded" not in r.headers
                assert upstream.requests[-1].body == raw  # the client's request, byte for byte
                if i % 2:
                    assert frames(r.content)[-1][0] == "message_stop"

            redis.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.2)
                r, raw = send()
                assert r.status_code == 200
                if "x-ctxproxy-degraded" not in r.headers:
                    break
            assert "x-ctxproxy-degraded" not in r.headers, "still degraded 10 s after the store came back"
            assert r.headers.get("x-ctxproxy-offloaded") == "1" and upstream.requests[-1].body != raw
    finally:
        redis.kill()


def test_store_that_never_answers_forwards_messages_unmodified_in_milliseconds(upstream):
    with SilentServer() as silent:
        settings = make_settings(upstream.base_url, silent.url, defaults=OFFLOAD)
        with InProcessProxy(settings) as p, p.http_client(headers=AUTH, timeout=30) as c:
            for i in range(6):
                raw = orjson.dumps({**ask(bool(i % 2), big_tool_turns(f"silent{i}")), "tools": TOOLS})
                r = c.post("/v1/messages", content=raw, headers={"content-type": "application/json"},
                           timeout=STALL_BOUND_S)
                assert r.status_code == 200, r.text
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert upstream.requests[-1].body == raw
            count = orjson.dumps({"model": MODEL, "messages": big_tool_turns("silent-count")})
            r = c.post("/v1/messages/count_tokens", content=count, headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.json()["input_tokens"] > 4000
