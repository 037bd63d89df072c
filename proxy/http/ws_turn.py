"""One `response.create` of a Responses WebSocket, run by the turn engine and framed as WebSocket frames.

The turn is the HTTP request it stands for: the socket's headers, the
body (its history expanded, `stream: true`) as a POST to the same path, so
route, session, pipeline, hidden read-back rounds and accounting are the
HTTP turn's own (proxy/engine/turn.py). What comes back is relayed as
text frames: each event's JSON as the provider (or the read-back loop)
wrote it; an HTTP error as the WebSocket `error` event, whose `status`
clients such as Codex read to decide what the error means.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.websockets import WebSocket

from proxy import errors, offloop
from proxy.engine.run import Answer, Inbound
from proxy.engine.turn import turn
from proxy.state import ProxyState
from proxy.wire import jsonio
from proxy.wire.responses.codec import RESPONSES
from proxy.wire.sse import event_payload, split_events

# Handshake headers that describe the socket, not the request it carries.
_SOCKET_HEADERS = frozenset({b"upgrade", b"connection", b"sec-websocket-key", b"sec-websocket-version",
                             b"sec-websocket-extensions", b"sec-websocket-protocol", b"content-length",
                             b"content-type", b"content-encoding", b"transfer-encoding"})
_WS_BETA = b"responses_websockets"


def _status_by_code() -> dict[str, int]:
    """The HTTP status of each error code the proxy writes itself, and of the provider's common ones."""
    out = {"context_length_exceeded": 400, "rate_limit_exceeded": 429, "server_error": 500}
    todo: list[type[errors.ProxyError]] = [errors.ProxyError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.code:
            out.setdefault(cls.code, cls.status)
    return out


_STATUS = _status_by_code()


def http_headers(ws: WebSocket) -> list[tuple[str, str]]:
    """The socket's headers as those of one JSON POST: the client's credentials and identity kept, the
    socket's own dropped, and the WebSocket beta flag taken out of `openai-beta` (the provider gets HTTP)."""
    out = []
    for k, v in ws.scope["headers"]:
        if k in _SOCKET_HEADERS:
            continue
        if k == b"openai-beta":
            v = b",".join(p for p in (x.strip() for x in v.split(b",")) if p and not p.startswith(_WS_BETA))
            if not v:
                continue
        out.append((k.decode("latin-1"), v.decode("latin-1")))
    return [*out, ("content-type", "application/json")]


@dataclass
class SeenTurn:
    """What the client saw of the turn: the response it completed (its id and output), if it completed."""

    response_id: str | None = None
    output: list[Any] = field(default_factory=list)
    frames: int = 0


def ws_error(status: int, error: dict[str, Any], sequence_number: int | None = None,
             stream_id: str | None = None) -> bytes:
    """The WebSocket `error` event (`type`, `status`, `error{type, code, message, param}`)."""
    data: dict[str, Any] = {"type": "error", "status": status, "error": error}
    if sequence_number is not None:
        data["sequence_number"] = sequence_number
    if stream_id is not None:
        data["stream_id"] = stream_id
    return jsonio.dumps(data)


def proxy_error(err: errors.ProxyError, stream_id: str | None = None) -> bytes:
    return ws_error(err.status, {"type": err.type, "code": err.code, "message": err.message, "param": err.param},
                    stream_id=stream_id)


async def run_turn(st: ProxyState, ws: WebSocket, headers: list[tuple[str, str]], body: dict[str, Any], size: int,
                   stream_id: str | None, outcome: SeenTurn) -> AsyncGenerator[bytes, None]:
    """The turn's frames, in order; `outcome` says how it ended. `size`: the bytes of JSON `body` stands for (a big
    body is written off the event loop, as the HTTP path writes one)."""
    raw = jsonio.dumps(body) if offloop.body_is_light(size) else await offloop.run(jsonio.dumps, body)

    async def read() -> bytes:
        return raw

    raw_query: bytes = ws.scope.get("query_string", b"")
    answer = await turn(st, Inbound("POST", ws.scope["path"], raw_query.decode("latin-1"), headers,
                                    ws.path_params.get("route"), read, transport="websocket"), RESPONSES)
    if answer.chunks is not None:
        async for frame in _stream_frames(answer.chunks, stream_id, outcome):
            yield frame
        return
    try:
        yield _whole_frame(answer, stream_id, outcome)
    finally:
        if answer.then is not None:
            answer.then()


async def _stream_frames(chunks: AsyncIterator[bytes], stream_id: str | None,
                         outcome: SeenTurn) -> AsyncIterator[bytes]:
    buffer = bytearray()
    try:
        async for chunk in chunks:
            buffer += chunk
            for ev in split_events(buffer):
                payload = event_payload(ev)
                if payload:
                    outcome.frames += 1
                    yield _frame(payload, stream_id, outcome)
        if buffer.strip():
            payload = event_payload(bytes(buffer) + b"\n\n")
            if payload:
                yield _frame(payload, stream_id, outcome)
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]  # the engine's relay: its ledger closed now


def _frame(payload: bytes, stream_id: str | None, outcome: SeenTurn) -> bytes:
    """One event's JSON as its frame: the provider's bytes, unless it is an error (the WebSocket shape), it
    completes the response (its id and output are kept), or the turn has a lane (`stream_id` echoed)."""
    head = payload[:160]
    if stream_id is None and b"response.completed" not in head and b'"error"' not in head:
        return payload
    try:
        data = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload
    if not isinstance(data, dict) or jsonio.deeper_than(data):  # too deep to write back: passed as it came
        return payload
    kind = data.get("type")
    if kind == "response.completed" and isinstance(data.get("response"), dict):
        response = data["response"]
        if isinstance(response.get("id"), str) and isinstance(response.get("output"), list):
            outcome.response_id, outcome.output = response["id"], response["output"]
    elif kind == "error" and not isinstance(data.get("error"), dict):  # the HTTP stream's error event
        code = data.get("code") if isinstance(data.get("code"), str) else None
        seq = data.get("sequence_number") if isinstance(data.get("sequence_number"), int) else None
        error = {"type": "server_error" if _STATUS.get(code or "", 500) >= 500 else "invalid_request_error",
                 "code": code, "message": data.get("message"), "param": data.get("param")}
        return ws_error(_STATUS.get(code or "", 500), error, seq, stream_id)
    if stream_id is None:
        return payload
    data["stream_id"] = stream_id
    return jsonio.dumps(data)


def _whole_frame(answer: Answer, stream_id: str | None, outcome: SeenTurn) -> bytes:
    """A turn answered whole: an error status as the `error` event; a whole response as `response.completed`."""
    body = answer.content
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if answer.status >= 400 or not isinstance(data, dict):
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            error = {"type": "upstream_error", "code": None, "message": body.decode("utf-8", "replace")[:2000],
                     "param": None}
        return ws_error(answer.status if answer.status >= 400 else 502, error, stream_id=stream_id)
    event = jsonio.dumps({"type": "response.completed", "response": data, "sequence_number": 0})
    return _frame(event, stream_id, outcome)
