"""Provider calls over HTTP/1.1 on the event loop's own transports, parsed by httptools.

Why: with 16 agents at once, one worker's event loop is the bottleneck, and aiohttp's client under httpx (its
request and response objects, a task to write each body, its stream readers and timers, httpx's wrapping)
was about a fifth of the proxy's CPU per small request (bench/overhead: 1.30 -> 1.04 ms of loop time per
request with this module in its place). A provider call needs little of that: one request to a known origin on a
kept-alive connection, the answer's headers as soon as they arrive, its body as it streams. httptools (llhttp,
which uvicorn already parses the client's requests with) parses the answer.

Kept as before: the status line and headers byte for byte (an httpx.Response over the raw list), the body as
the provider sent it (a Content-Encoding is not undone here), TLS with the client's context, the timeouts
(connect; read: between two bytes of the answer; write: while the body cannot be sent; pool: waiting for a
connection), keep-alive connections reused newest first and dropped once idle past `keepalive_expiry`, at
most `max_connections` per origin. A connection that dies with the request on it before one byte of the
answer arrived raises `Unanswered`: the provider never answered, and proxy/upstream/client.py sends the
request once more on a fresh connection.

Not here (proxy/upstream/client.py sends these through httpx and aiohttp as before): HEAD and CONNECT (an
answer without a body the parser cannot know of, a tunnel), and a header that is not plain ASCII text.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, cast

import httptools
import httpx

_HIGH_WATER = 1 << 20  # bytes of answer buffered before the socket stops being read (the client is slower)
_LOW_WATER = 1 << 18  # ... and read again below this
_REQUEST_LINE = b"%s %s HTTP/1.1\r\n"


def header_block(method: str, headers: list[tuple[str, str]]) -> bytes | None:
    """The request's `name: value` lines (as proxy/upstream/direct.py wire_headers gives them: ASCII, Host and
    Content-Length included), or None when it cannot go this way: HEAD or CONNECT, or a line break or NUL in
    a header (httpx and aiohttp refuse those, each in its own words: they are left to say it)."""
    if method in ("HEAD", "CONNECT"):
        return None
    text = "".join([f"{k}: {v}\r\n" for k, v in headers])
    n = len(headers)
    if text.count("\n") != n or text.count("\r") != n or "\0" in text:
        return None
    return text.encode("ascii")


class Unanswered(httpx.RemoteProtocolError):
    """The connection closed or failed under a request before a single byte of its answer arrived."""


class _Connection(asyncio.Protocol):
    """One connection to an origin and the one request on it at a time."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.loop = origin.loop
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.counted = True  # in origin.open
        self.keep = True  # False: a fresh connection, closed after its one request
        self.idle_since = 0.0
        self.read_paused = False  # the answer is buffered past _HIGH_WATER: the socket is not read
        self.write_paused = False  # the transport's buffer is full: the provider is not reading the request
        self._clear()

    def _clear(self) -> None:
        self.status = 0
        self.reason = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head: asyncio.Future[None] | None = None  # resolved when the answer's headers are complete
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.reader: asyncio.Future[None] | None = None  # the body's reader, waiting for more
        self.done = False  # the answer is complete
        self.keep_alive = False
        self.error: BaseException | None = None
        self.answered = False  # a byte of the answer arrived
        self.interim = False  # the message being parsed is a 1xx before the answer
        self.progress = 0.0
        self.limits = (0.0, 0.0)  # (read, write) timeouts of the request in flight
        self.timer: asyncio.TimerHandle | None = None

    # -- the request ------------------------------------------------------------------------------------------
    async def exchange(self, head: bytes, body: bytes | None, read: float, write: float) -> None:
        """Write the request, wait for the answer's headers (the body follows on `chunks`)."""
        self._clear()
        assert self.transport is not None
        self.head = self.loop.create_future()
        self.limits = (read, write)
        self.progress = self.loop.time()
        self.transport.writelines((head, body) if body else (head,))
        self._arm(self.progress + (write if self.write_paused else read))
        try:
            await self.head
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Close at once: the connection is in no state to carry another request."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def reusable(self) -> bool:
        """Able to carry the next request: the answer read to its end, kept alive, and the request itself sent
        whole (a provider may answer early, a 413 say, while the body is still going out: what is left of it
        would be read as the start of the next request)."""
        return self.keep and self.done and self.keep_alive and self.error is None and not self.closed \
            and not self.chunks and self.transport is not None and self.transport.get_write_buffer_size() == 0

    def _arm(self, when: float) -> None:
        self.timer = self.loop.call_at(when, self._deadline)

    def _deadline(self) -> None:
        self.timer = None
        if self.done or self.error is not None:
            return
        read, write = self.limits
        limit = write if self.write_paused else read
        if self.read_paused:  # our reader is the slow one, not the provider
            self._arm(self.loop.time() + limit)
            return
        due = self.progress + limit
        if self.loop.time() < due:
            self._arm(due)
            return
        kind = httpx.WriteTimeout if self.write_paused else httpx.ReadTimeout
        self._fail(kind(f"no {'progress sending the request' if self.write_paused else 'answer'} "
                        f"within {limit:g} s"))
        self.abort()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        if self.head is not None and not self.head.done():
            self.head.set_exception(self.error)
            self.head.exception()  # retrieved: the waiter may be gone
        self._wake()

    def _wake(self) -> None:
        reader, self.reader = self.reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    # -- asyncio.Protocol -------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        if self.head is None or self.done or self.error is not None:  # nothing asked: the connection is unusable
            self.closed = True
            self.abort()
            return
        self.answered = True
        self.progress = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(httpx.RemoteProtocolError(f"malformed answer: {exc}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost says what that means for the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.origin.lost(self)
        if self.head is None or self.done or self.error is not None:
            return
        if self.head.done() and self._ends_at_close():
            self.done, self.keep_alive = True, False
            self._wake()
            return
        reason = str(exc) if exc else "the provider closed the connection"
        error: httpx.TransportError = Unanswered(reason) if not self.answered else \
            httpx.RemoteProtocolError(f"connection closed before the answer was complete ({reason})")
        error.__cause__ = exc
        self._fail(error)

    def _ends_at_close(self) -> bool:
        """The answer has neither Content-Length nor chunked framing: its body is what came before the close."""
        names = {k.lower() for k, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.progress = self.loop.time()

    # -- httptools callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.headers = []
        self.reason = b""

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        self.interim = 100 <= status < 200 and status != 101
        if self.interim:
            return
        self.status = status
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.done = True
        self.keep_alive = self.parser.should_keep_alive()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self._wake()

    # -- the body ---------------------------------------------------------------------------------------------
    def take(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        if self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = False
            self.progress = self.loop.time()
            self.transport.resume_reading()
        return data

    async def more(self) -> None:
        self.reader = self.loop.create_future()
        await self.reader


class Body(httpx.AsyncByteStream):
    """The answer's body as it arrives; closing it gives the connection back (reused when the answer was read
    to its end and the provider keeps the connection alive)."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.released = False

    async def _next(self) -> bytes | None:
        """What arrived since the last call, waiting for it; None once the answer is whole."""
        conn = self.conn
        while True:
            if conn.chunks:
                return conn.take()
            if conn.error is not None:
                raise conn.error
            if conn.done:
                return None
            await conn.more()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            while (chunk := await self._next()) is not None:
                yield chunk
        finally:
            await self.aclose()

    async def read(self) -> bytes:
        """The whole body."""
        try:
            parts: list[bytes] = []
            while (chunk := await self._next()) is not None:
                parts.append(chunk)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if not self.released:
            self.released = True
            self.conn.origin.release(self.conn)


class Origin:
    """The connections to one scheme://host:port."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, limits: httpx.Limits) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port, self.tls = host, port, tls
        self.max_open = limits.max_connections or 1 << 30
        self.max_idle = limits.max_keepalive_connections or 0
        self.expiry = limits.keepalive_expiry or 0.0
        self.idle: list[_Connection] = []
        self.closing = False  # the process is shutting down: nothing is kept alive any more
        self.open = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    async def connection(self, fresh: bool, connect: float | None, pool: float | None) -> _Connection:
        """A kept-alive connection (newest first), or a new one; `fresh`: always a new one, not kept after."""
        while True:
            now = self.loop.time()
            while self.idle and not fresh:
                conn = self.idle.pop()
                if not conn.closed and conn.transport is not None and not conn.transport.is_closing() \
                        and now - conn.idle_since <= self.expiry:
                    return conn
                self._close(conn)  # stale
            if self.open < self.max_open:
                break
            if self.idle:  # fresh, and every slot taken: the oldest kept-alive one makes room
                self._close(self.idle.pop(0))
                continue
            await self._wait(pool)
        self.open += 1
        try:
            async with asyncio.timeout(connect):
                _, conn = await self.loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None)
        except TimeoutError:
            self._freed()
            raise httpx.ConnectTimeout(f"could not connect within {connect:g} s") from None
        except OSError as exc:
            self._freed()
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc
        except BaseException:
            self._freed()
            raise
        conn.keep = not fresh
        return conn

    async def _wait(self, pool: float | None) -> None:
        """Until a connection is given back or closed (every one is in use)."""
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout(pool):
                await waiter
        except TimeoutError:
            raise httpx.PoolTimeout(f"no free connection within {pool:g} s") from None
        finally:
            if waiter in self.waiters:
                self.waiters.remove(waiter)

    def release(self, conn: _Connection) -> None:
        """The connection's request is over: kept for the next one, or closed."""
        if conn.reusable() and len(self.idle) < self.max_idle and not self.closing:
            conn.idle_since = self.loop.time()
            self.idle.append(conn)
            self._wake_one()
        else:
            self._close(conn)

    def lost(self, conn: _Connection) -> None:
        """The connection closed (either side): no longer counted, no longer offered."""
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.counted:
            conn.counted = False
            self._freed()

    def _close(self, conn: _Connection) -> None:
        if conn.done and conn.transport is not None and conn.transport.get_write_buffer_size() == 0:
            conn.transport.close()  # the answer is whole and the request all sent: a graceful close
        else:
            conn.abort()
        self.lost(conn)

    def _freed(self) -> None:
        self.open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def close_all(self) -> None:
        self.closing = True
        for conn in list(self.idle):
            self._close(conn)


class Http1:
    """The origins this process calls, and the one call: `send`."""

    def __init__(self, tls: ssl.SSLContext, limits: httpx.Limits) -> None:
        self.tls, self.limits = tls, limits
        self.origins: dict[tuple[str, str, int], Origin] = {}

    async def send(self, method: str, url: httpx.URL, block: bytes, content: bytes | None,
                   timeout: httpx.Timeout, fresh: bool = False) -> httpx.Response:
        """The answer as soon as its headers are in (its body streams on). `block`: the header lines as
        `header_block` gives them. `fresh`: on a new connection, closed after the answer."""
        tls = url.scheme == "https"
        key = (url.scheme, url.host, url.port or (443 if tls else 80))
        origin = self.origins.get(key)
        if origin is None or origin.loop is not asyncio.get_running_loop():  # connections belong to their loop
            origin = self.origins[key] = Origin(key[1], key[2], self.tls if tls else None, self.limits)
        conn = await origin.connection(fresh, timeout.connect, timeout.pool)
        head = _REQUEST_LINE % (method.encode(), url.raw_path) + block + b"\r\n"
        try:
            await conn.exchange(head, content, timeout.read or 1e9, timeout.write or 1e9)
        except BaseException:
            origin.release(conn)
            raise
        extensions: dict[str, Any] = {"http_version": b"HTTP/1.1"}
        if conn.reason:
            extensions["reason_phrase"] = conn.reason
        return httpx.Response(status_code=conn.status, headers=conn.headers, stream=Body(conn),
                              extensions=extensions)

    def close(self) -> None:
        for origin in self.origins.values():
            origin.close_all()
