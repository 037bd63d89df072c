"""`/v1/responses` over WebSocket: what Codex opens at its defaults, served turn by turn over the HTTP path.

One socket carries one agent session: text frames of `response.create`
(the Responses body plus `type`), answered by the response's events as text
frames. Each turn is run as the HTTP request it stands for
(proxy/http/ws_turn.py), its history expanded from what the socket holds
(proxy/http/ws_history.py). The socket is bounded like the HTTP server:
frame size (`server.max_body_bytes`, told to clients in the handshake header
`x-codex-websocket-max-message-bytes`), open sockets (`server.max_websockets`),
idle time (`server.websocket_idle_timeout`), history held
(`server.websocket_history_bytes`, for the whole socket); turns run one at a
time, in order.

Memory per socket is bounded whatever the client sends: frames waiting behind
the running turn are counted by bytes, and once they reach
`server.websocket_queue_bytes` (or _QUEUED frames) the socket is not read until
the turn ends, so the server stops reading it too (as HTTP/2 flow control
would). A socket holds at most its running turn's frame, the queue (its budget
plus the frame that filled it), one frame in the server's buffer, and its
history: 3 x max_body_bytes + websocket_queue_bytes + websocket_history_bytes
(bench/ws_bounds.py measures it); the running turn's work on its body costs on
top what an HTTP request of that body costs. A big frame is parsed and checked
off the event loop, as an HTTP body is (proxy/offloop.py).

A client that leaves cancels its queued turns and the one in flight: nothing
more goes upstream for it. While the socket is not read (its queue full) its
leaving is only seen when a write to it fails (the turn's first events, or the
server's ping every 20 s); the turn then in flight completes, and no queued one runs.

A warm-up (`generate: false`) is answered here, as the API answers it: a
response with no output whose id the next turn may chain from. The socket
is only a cache: a turn naming a response the socket does not hold (after a
reconnect, a restart) is forwarded as sent, and the provider answers it as
over HTTP; the session's stored records are the HTTP path's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Coroutine
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from proxy import offloop
from proxy.config import ServerSettings
from proxy.errors import BadRequest, PayloadTooLarge, ProxyError
from proxy.http.ws_history import SocketHistory
from proxy.http.ws_turn import SeenTurn, http_headers, proxy_error, run_turn, ws_error
from proxy.logs import event, log
from proxy.state import ProxyState
from proxy.wire import jsonio
from proxy.wire.body import loads_checked, too_deep_error

_IGNORED = frozenset({"response.processed"})  # Codex's acknowledgement of a response: nothing to answer
_QUEUED = 8  # frames waiting behind a running turn at most, however small; then the socket is not read
# The handshake header that tells a client (Codex reads it) the largest frame the socket takes.
MAX_MESSAGE_HEADER = "x-codex-websocket-max-message-bytes"
_GOING_AWAY, _TRY_AGAIN_LATER = 1001, 1013
_open: dict[int, int] = {}  # open sockets per app (one app per process in production; tests make many)


async def responses_websocket(ws: WebSocket) -> None:
    st: ProxyState = ws.app.state.proxy
    server = st.settings.server
    key = id(ws.app)
    await ws.accept(headers=[(MAX_MESSAGE_HEADER.encode(), str(server.max_body_bytes).encode())])
    if _open.get(key, 0) >= server.max_websockets:
        await _refuse(ws, server)
        return
    _open[key] = _open.get(key, 0) + 1
    try:
        await Socket(ws, st).serve()
    finally:
        _open[key] -= 1


async def _refuse(ws: WebSocket, server: ServerSettings) -> None:
    event("websocket limit reached: refusing a socket", limit=server.max_websockets)
    await ws.send_text(ws_error(429, {"type": "invalid_request_error", "code": "websocket_connection_limit_reached",
                                       "message": f"the proxy holds {server.max_websockets} WebSockets already "
                                                  "(server.max_websockets); retry shortly", "param": None}).decode())
    await ws.close(code=_TRY_AGAIN_LATER, reason="websocket connection limit reached")


class Socket:
    """One client socket: its frames read as they come (until the queue's budget is full), its turns run one at a
    time; the client leaving cancels what is left of them."""

    def __init__(self, ws: WebSocket, st: ProxyState) -> None:
        self.ws, self.st = ws, st
        self.server = st.settings.server
        self.history = SocketHistory(self.server.websocket_history_bytes)
        self.headers = http_headers(ws)
        self.inbox: asyncio.Queue[bytes | str | None] = asyncio.Queue()
        self.queued = 0  # bytes of the frames in the inbox
        self.room = asyncio.Event()  # set while the inbox is under its budget: the reader reads
        self.room.set()
        self.gone = asyncio.Event()

    async def serve(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            while True:
                try:
                    async with asyncio.timeout(self.server.websocket_idle_timeout):
                        frame = await self.inbox.get()
                except TimeoutError:
                    with contextlib.suppress(Exception):
                        await self.ws.close(code=1000, reason=f"idle for {self.server.websocket_idle_timeout:g} s "
                                                              "(server.websocket_idle_timeout)")
                    return
                if frame is None or self.gone.is_set():
                    return  # the client left: the turns it queued are not run
                self._taken(frame)
                await self._until_gone(self._one(frame))
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader

    async def _until_gone(self, turn: Coroutine[Any, Any, None]) -> None:
        """Run one frame's turn; the client leaving cancels it (no further round, nothing more upstream)."""
        task = asyncio.create_task(turn)
        gone = asyncio.create_task(self.gone.wait())
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _queue(self, data: bytes | str) -> None:
        self.inbox.put_nowait(data)
        self.queued += len(data)
        if self.queued >= self.server.websocket_queue_bytes or self.inbox.qsize() >= _QUEUED:
            self.room.clear()

    def _taken(self, data: bytes | str) -> None:
        self.queued -= len(data)
        if self.queued < self.server.websocket_queue_bytes and self.inbox.qsize() < _QUEUED:
            self.room.set()

    async def _read(self) -> None:
        """Frames into the inbox as they arrive, so a client that leaves mid-turn is seen at once; while the inbox
        is full the socket is not read (the server then stops reading it: one frame waits there at most)."""
        try:
            while True:
                await self.room.wait()
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("text")
                data = msg.get("bytes") if data is None else data
                if data is not None:
                    self._queue(data)
        except (WebSocketDisconnect, RuntimeError, OSError):
            pass
        finally:
            self.gone.set()
            self.inbox.put_nowait(None)

    async def _send(self, frame: bytes) -> None:
        """A text frame (Codex refuses binary ones); a socket the client closed takes nothing more."""
        if self.gone.is_set():
            return
        try:
            await self.ws.send_text(frame.decode("utf-8", "replace"))
        except (WebSocketDisconnect, RuntimeError, OSError):
            self.gone.set()

    async def _one(self, frame: bytes | str) -> None:
        """One client frame: a turn to run, a warm-up to answer, an acknowledgement to drop, or an error."""
        size = len(frame)
        try:
            if size > self.server.max_body_bytes:
                raise PayloadTooLarge(f"a frame of {size} bytes exceeds the limit of "
                                      f"{self.server.max_body_bytes} bytes (server.max_body_bytes)",
                                      code="websocket_message_too_large")
            body = _create(frame) if offloop.body_is_light(size) else await offloop.run(_create, frame)
        except ProxyError as err:
            await self._send(proxy_error(err))
            return
        if body is None:
            return
        stream_id = body.pop("stream_id", None)
        stream_id = stream_id if isinstance(stream_id, str) else None
        whole, _, history_size = self.history.expand(body, size)
        if whole.get("generate") is False:
            await self._warm_up(whole, history_size, stream_id)
            return
        whole.pop("generate", None)
        whole["stream"] = True
        whole.setdefault("store", False)
        await self._turn(whole, history_size, stream_id)

    async def _turn(self, body: dict[str, Any], history_size: int, stream_id: str | None) -> None:
        outcome = SeenTurn()
        frames = run_turn(self.st, self.ws, self.headers, body, history_size, stream_id, outcome)
        try:
            async for frame in frames:
                if self.gone.is_set():
                    break  # the client left: the upstream stream is closed with the turn
                await self._send(frame)
        except Exception as exc:  # a proxy bug: say so on the socket and keep it open
            log.error("unexpected error in a WebSocket turn", exc_info=exc)
            await self._send(proxy_error(ProxyError("internal proxy error; see the proxy log"), stream_id))
            return
        finally:
            await frames.aclose()
        if outcome.response_id is not None:
            out_size = len(jsonio.dumps(outcome.output)) if outcome.output else 0
            self.history.remember(outcome.response_id, body.get("input"), outcome.output, history_size + out_size)

    async def _warm_up(self, body: dict[str, Any], history_size: int, stream_id: str | None) -> None:
        """`generate: false`: the API prepares the request and answers a response with no output, whose id a
        later turn chains from. Nothing goes upstream; the input becomes the socket's history."""
        rid = "resp_" + secrets.token_hex(24)
        response: dict[str, Any] = {
            "id": rid, "object": "response", "created_at": int(time.time()), "status": "completed",
            "model": body.get("model"), "output": [], "usage": None, "error": None,
            "incomplete_details": None, "previous_response_id": None}
        for n, kind in enumerate(("response.created", "response.completed")):
            data: dict[str, Any] = {"type": kind, "response": {**response, "status": "in_progress"}
                                    if kind == "response.created" else response, "sequence_number": n}
            if stream_id is not None:
                data["stream_id"] = stream_id
            await self._send(jsonio.dumps(data))
        self.history.remember(rid, body.get("input"), [], history_size)


def _create(frame: bytes | str) -> dict[str, Any] | None:
    """The Responses body of a `response.create` frame (None for a frame with nothing to answer); a 400 for
    anything else. The older envelope `{"type": "response.create", "response": {...}}` is taken too."""
    data, too_deep = loads_checked(frame if isinstance(frame, bytes) else frame.encode())
    if not isinstance(data, dict):
        raise BadRequest("frame must be a JSON object")
    if too_deep:  # before anything writes it back (orjson cannot write such values safely)
        raise too_deep_error()
    kind = data.pop("type", None)
    if isinstance(kind, str) and kind in _IGNORED:
        return None
    if kind != "response.create":
        raise BadRequest(f"unsupported event type {kind!r}: this socket takes response.create", param="type",
                         code="invalid_event_type")
    inner = data.get("response")
    if isinstance(inner, dict) and "model" not in data and "input" not in data:
        data = inner
    return data
