"""How `ctxproxy serve` runs uvicorn: httptools, plus the connection guards uvicorn lacks for it.

uvicorn's httptools protocol closes a kept-alive connection idle after a
response (`timeout_keep_alive`), but nothing bounds a connection that never
finishes a request's headers: one that opens and sends nothing, or trickles a
header a byte at a time, is held forever, and so is one that trickles the rest
of a body its handler never read. GuardedProtocol adds, per connection:

- header deadline: a request's headers are complete within `header_timeout`
  seconds of the connection opening, or within `keep_alive_timeout +
  header_timeout` of the previous response; else the connection is closed
  (with a 408 if the client had started a request);
- header size: more than `max_header_bytes` received before the headers end, or
  complete headers (the URL, each name and value) over it, is answered 431 and
  the connection closed (llhttp itself has no limit). The second check is made
  before the app is given the request: a header block that ends in the read that
  brought it is parsed, and its request started, within that one read;
- connection limit: a connection opened while `max_connections` others are
  open (or a request arriving while as many are in flight) is answered 503,
  OpenAI-shaped, with `connection: close`, instead of joining the queue.

The body's own deadline (`body_timeout`) is kept where the body is read
(proxy/http/relay.py read_body → 408), so the handler logs and counts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, ClassVar

from starlette.requests import Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config import ServerSettings
from proxy.errors import BadRequest, error_body
from proxy.http.relay import client_codec
from proxy.logs import event

_LIMIT_LOG_EVERY = 10.0  # seconds between two "connection limit reached" log lines


def _response(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole OpenAI-shaped error response, written by the protocol itself (no request reached the app)."""
    body = error_body(message, "invalid_request_error", code)
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, reason.encode(), len(body), body))


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a header deadline, a header size cap and an OpenAI-shaped connection limit."""

    header_timeout: ClassVar[float]
    max_header_bytes: ClassVar[int]
    max_connections: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._header_bytes: int | None = None  # bytes received since a request began, until its headers end
        self._began = False  # the client has sent part of a request whose headers are not complete
        self._admitted = True  # within max_connections when it was opened
        self._too_large = False  # the last request's complete headers were over max_header_bytes

    # -- deadline ------------------------------------------------------------------------------------------
    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(seconds, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self._began and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_response(408, "Request Timeout", f"request headers not complete within "
                                           f"{self.header_timeout:g} s (server.header_timeout)", "request_timeout"))
        self.transport.close()

    # -- uvicorn's hooks -----------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # Admitted on arrival, first come first served: a burst of accepts beyond the limit is refused,
        # not every connection of it (as counting open connections at each request would do).
        self._admitted = len(self.connections) <= self.max_connections
        self._header_bytes = 0
        self._arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_bytes is not None:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._header_bytes is not None and self._header_bytes > self.max_header_bytes \
                and not self.transport.is_closing():  # headers still coming, already too many
            self._refuse_headers()

    def _refuse_headers(self) -> None:
        self._disarm()
        self.transport.write(_response(431, "Request Header Fields Too Large", self._too_large_message(),
                                       "request_headers_too_large"))
        self.transport.close()

    def _too_large_message(self) -> str:
        return f"request headers exceed {self.max_header_bytes} bytes (server.max_header_bytes)"

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._began = True
        if self._header_bytes is None:
            self._header_bytes = 0
        if self._header_timer is None:
            self._arm(self.header_timeout)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._header_bytes = None
        self._began = False
        size = len(self.url)  # the headers as parsed (whole, however many reads brought them)
        for name, value in self.headers:
            size += len(name) + len(value)
        self._too_large = size > self.max_header_bytes
        if self._too_large:  # through a request cycle: the parser reads on into this request's body
            self._run(self._headers_too_large)
        elif not self._admitted or len(self.tasks) >= self.max_connections:
            _refusals.note(len(self.connections), len(self.tasks), self.max_connections)
            self._run(_over_limit)
        else:
            super().on_headers_complete()

    def _run(self, app: Any) -> None:
        """The request just parsed, answered by `app` instead of the proxy."""
        proxy, self.app = self.app, app
        try:
            super().on_headers_complete()
        finally:
            self.app = proxy

    def handle_websocket_upgrade(self) -> None:
        if self._too_large:  # on_headers_complete started no request for an upgrade: refused here
            self._refuse_headers()
            return
        super().handle_websocket_upgrade()

    async def _headers_too_large(self, scope: Any, receive: Any, send: Any) -> None:
        """The 431 in the shape of the API the client speaks (Anthropic's on /v1/messages, as relay answers)."""
        err = BadRequest(self._too_large_message(), code="request_headers_too_large")
        err.status = 431
        await _send_error(send, 431, client_codec(Request(scope)).error_body(err))

    def on_response_complete(self) -> None:
        idle = not self.pipeline  # else the next pipelined request starts now, its headers long complete
        super().on_response_complete()
        if idle and not self.transport.is_closing():
            # the rest of a body the handler did not read, trickled, must not hold the connection either
            self._arm(self.timeout_keep_alive + self.header_timeout)


class _Refusals:
    """Requests refused at the connection limit, logged at most once per _LIMIT_LOG_EVERY seconds."""

    def __init__(self) -> None:
        self.count = 0
        self.logged_at = float("-inf")

    def note(self, connections: int, in_flight: int, limit: int) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.logged_at >= _LIMIT_LOG_EVERY:
            event("connection limit reached: answering 503", logging.WARNING, refused=self.count,
                  connections=connections, in_flight=in_flight, limit=limit)
            self.logged_at, self.count = now, 0


_refusals = _Refusals()  # one per process (one event loop)


async def _over_limit(scope: Any, receive: Any, send: Any) -> None:
    await _send_error(send, 503, error_body("the proxy is at its connection limit (server.max_connections); "
                                            "retry shortly", "proxy_error", "overloaded"), (b"retry-after", b"1"))


async def _send_error(send: Any, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    """An error answered by the protocol's own ASGI app, the connection closed after it."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra, (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def guarded_protocol(server: ServerSettings) -> type[GuardedProtocol]:
    """The protocol class for uvicorn's `http=`, with this server's limits."""
    return type("GuardedProtocol", (GuardedProtocol,), {
        "header_timeout": server.header_timeout, "max_header_bytes": server.max_header_bytes,
        "max_connections": server.max_connections})


def uvicorn_options(server: ServerSettings) -> dict[str, Any]:
    """Keyword arguments for uvicorn.Config / uvicorn.run: how `ctxproxy serve` serves."""
    return {"http": guarded_protocol(server), "timeout_keep_alive": server.keep_alive_timeout,
            "limit_concurrency": None,  # GuardedProtocol applies max_connections, answering in OpenAI shape
            # the Responses WebSocket: one frame is one request body, bounded alike; permessage-deflate, which
            # Codex asks for; pings keep a socket idle between turns alive through NATs and load balancers
            "ws": "websockets-sansio", "ws_max_size": server.max_body_bytes, "ws_per_message_deflate": True,
            "ws_ping_interval": 20.0, "ws_ping_timeout": 20.0}
