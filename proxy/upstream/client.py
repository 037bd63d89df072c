"""The one shared HTTP client to providers, streaming passthrough and error mapping.

httpx's API (its Response, its errors) over the proxy's own HTTP/1.1 connections (proxy/upstream/http1.py):
httpx's default transport is most of a bare proxy's overhead (DESIGN.md, performance notes), and aiohttp
under it, which came next, still cost about a fifth of the proxy's CPU per small request. The few requests
http1 does not carry (HEAD, CONNECT, a header no HTTP/1.1 line can hold) go through httpx and aiohttp as
before. Responses stream chunk by chunk as they arrive; nothing is buffered whole unless the caller reads it.

A pooled keep-alive connection can die just as a request goes out on it: the
provider closed it while idle, and the request meets a reset or a close before
any answer. The provider never saw that request, so it is sent once more on a
fresh connection - what browsers and httpx do for stale keep-alive connections,
and safe for a POST only because not one byte of a response came back (http1
raises `Unanswered` for exactly that; on the aiohttp path the connection's
protocol notes it, see `_Handler`). Never twice, never after a timeout.
aiohttp already does this itself for idempotent methods.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import AsyncIterator, Coroutine, Iterable
from contextvars import ContextVar
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any
from urllib.parse import quote

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import AiohttpResponseStream

from proxy.config import UpstreamSettings
from proxy.errors import BadRequest, ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.logs import event
from proxy.upstream.direct import raise_httpx_error, send_direct, wire_headers
from proxy.upstream.http1 import Body, Http1, Unanswered, header_block

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus ones
# the transport recomputes.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "host", "content-length",
})
# Proxy-only request headers never sent on.
_PROXY_HEADERS = frozenset({"x-ctx-route"})
# Connection pool: one proxy worker serves many concurrent agent streams.
MAX_CONNECTIONS = 1000
MAX_KEEPALIVE = 200
_WRITE_TIMEOUT = 60.0  # seconds to send a request body
# Retried by aiohttp itself on a dropped persistent connection (RFC 9110 §9.2.2); the proxy retries the rest.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# A connection that died under a request: reset, closed, or closing when written to.
_DROPPED = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectionResetError)


def _dropped(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    extra: set[str] = set()
    for k, v in headers:
        if k.lower() == "connection":
            extra.update(t.strip().lower() for t in v.split(","))
    return HOP_BY_HOP | extra


def request_headers(client_headers: Iterable[tuple[str, str]], upstream: UpstreamSettings,
                    *, identity_encoding: bool = False) -> list[tuple[str, str]]:
    """The client's headers for the provider: hop-by-hop removed, key injected if configured.

    `identity_encoding`: the proxy sends a body of its own (the client's, decoded, rewritten and serialized
    again) and reads the answer, so neither is compressed: the client's Content-Encoding is dropped (the
    transport sets Content-Length for the new body) and the answer is asked for as identity.
    """
    items = list(client_headers)
    drop = _dropped(items) | _PROXY_HEADERS
    key = upstream.api_key()
    if key:
        drop = drop | {"authorization", "api-key", "x-api-key"}
    if identity_encoding:
        drop = drop | {"accept-encoding", "content-encoding"}
    out = [(k, v) for k, v in items if k.lower() not in drop]
    for k, v in out:
        if not v.isascii():
            raise BadRequest(f"header {k!r} has non-ASCII characters; HTTP header values must be ASCII",
                             param=k, code="invalid_header")
    if key:  # in the header the provider reads it from: Anthropic's x-api-key, everyone else's Authorization
        out.append(("x-api-key", key) if upstream.speaks() == "anthropic" else ("authorization", f"Bearer {key}"))
    if identity_encoding:
        out.append(("accept-encoding", "identity"))
    return out


_HOP_BY_HOP_RAW = frozenset(h.encode() for h in HOP_BY_HOP)
_CONTENT_ENCODING = b"content-encoding"


def response_headers(upstream_headers: httpx.Headers, *, decoded: bool = False) -> list[tuple[bytes, bytes]]:
    """The provider's response headers for the client, as it sent them (names lower-cased, values byte for
    byte), less hop-by-hop ones: never decoded and encoded again (a value that is not Latin-1 text passes too).

    `decoded`: the body is passed on decompressed, so its encoding header goes too.
    """
    raw = [(k.lower(), v) for k, v in upstream_headers.raw]
    drop = _HOP_BY_HOP_RAW
    if any(k == b"connection" for k, _ in raw):
        drop = drop | {t.strip().lower() for k, v in raw if k == b"connection" for t in v.split(b",")}
    if decoded:
        drop = drop | {_CONTENT_ENCODING}
    return [(k, v) for k, v in raw if k not in drop]


# Characters a path segment may carry as they are (RFC 3986 pchar less "%"): everything else is re-encoded.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


@functools.lru_cache(maxsize=1024)  # a handful of paths per route; a refused one raises and is not kept
def _path_tail(tail: str) -> str:
    """The client's (decoded) path after `/v1`, safe to append to a route's base URL.

    A dot segment, however it was encoded, would let a client climb out of the
    route's base path and reach another endpoint with the key the proxy injects
    for that route: refused. Control characters are refused too (no provider
    path has them, and httpx cannot send them). The rest is percent-encoded
    again, so what the provider decodes is exactly what the client meant.
    """
    if any(c < " " or c == "\x7f" for c in tail):
        raise BadRequest("the request path contains control characters", code="invalid_path")
    segments = tail.split("/")
    if any(seg in (".", "..") for seg in segments):
        raise BadRequest("the request path may not contain '.' or '..' segments", code="invalid_path")
    return quote(tail.lstrip("/"), safe=_PATH_SAFE)


def upstream_url(upstream: UpstreamSettings, tail: str, query: str) -> str:
    """Base URL + the part of the client's path after `/v1`, with its query string."""
    url = upstream.base_url + "/" + _path_tail(tail)
    if query and any(c < " " or c == "\x7f" for c in query):
        raise BadRequest("the query string contains control characters", code="invalid_path")
    return f"{url}?{query}" if query else url


def _host(url: str) -> str:
    where = httpx.URL(url)
    return f"{where.scheme}://{where.host}" + (f":{where.port}" if where.port else "")


def _transport_error(exc: Exception, url: str) -> ProxyError:
    host = _host(url)
    cause = exc.__cause__
    if isinstance(exc, httpx.TimeoutException) and not isinstance(
            cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientConnectorError)):
        return UpstreamTimeout(f"upstream {host} timed out ({type(cause or exc).__name__})")
    reason = str(cause or exc) or type(cause or exc).__name__
    return UpstreamUnreachable(f"upstream {host} unreachable: {reason}")


class _Attempt:
    """One send of one request: whether a connection carried it, and whether any response byte came back."""

    __slots__ = ("sent", "answered")

    def __init__(self) -> None:
        self.sent = False
        self.answered = False


_ATTEMPT: ContextVar[_Attempt | None] = ContextVar("ctxproxy_upstream_attempt", default=None)


class _Handler(ResponseHandler):
    """aiohttp's connection protocol, telling the request in flight whether the provider sent it anything.

    aiohttp prepares the protocol for each request from inside that request's
    task, so the attempt is picked up there; bytes arrive in loop callbacks,
    outside any task, so they are noted on the attempt picked up.
    """

    _attempt: _Attempt | None = None

    def set_response_params(self, **kwargs: Any) -> None:
        self._attempt = _ATTEMPT.get()
        if self._attempt is not None:
            self._attempt.sent = True
        super().set_response_params(**kwargs)

    def data_received(self, data: bytes) -> None:
        if data and self._attempt is not None:
            self._attempt.answered = True
        super().data_received(data)


def _unanswered_drop(exc: BaseException, attempt: _Attempt) -> bool:
    """The connection died under the request before a single response byte: safe to send it again."""
    cause = exc.__cause__ if isinstance(exc, httpx.TransportError) and exc.__cause__ is not None else exc
    if isinstance(cause, (aiohttp.ClientConnectorError, TimeoutError)) or not isinstance(cause, _DROPPED):
        return False  # never connected (not a drop), or a timeout: not retried
    if isinstance(cause, OSError) and cause.errno == errno.ETIMEDOUT:
        return False
    return attempt.sent and not attempt.answered


class Upstream:
    """Owns the shared client; one per process, closed at shutdown."""

    def __init__(self) -> None:
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_KEEPALIVE)
        ssl_context = httpx.create_ssl_context(trust_env=True)

        def client(fresh: bool) -> tuple[httpx.AsyncClient, AiohttpTransport]:
            def session() -> aiohttp.ClientSession:
                # No cookie jar at either layer: one client serves every tenant, so a
                # provider's Set-Cookie must never ride along on someone else's request.
                pooling: dict[str, Any] = {"force_close": True} if fresh else {
                    "keepalive_timeout": limits.keepalive_expiry}
                connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=ssl_context, **pooling)
                # aiohttp has no public way to choose its protocol class (version pinned; tests/test_upstream_retry.py)
                handler: type[ResponseHandler] = _Handler  # aiohttp types _factory as partial[ResponseHandler]
                connector._factory = functools.partial(handler, loop=connector._loop)
                return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())

            transport = AiohttpTransport(limits=limits, client=session)
            return httpx.AsyncClient(transport=transport, timeout=None,
                                     cookies=CookieJar(DefaultCookiePolicy(allowed_domains=[]))), transport

        # The clients own their transports' lifetime (aclose); requests go to the transports directly (_send).
        self.client, self._transport = client(fresh=False)
        self.fresh, self._fresh_transport = client(fresh=True)  # a new connection per request: the one retry
        self.http1 = Http1(ssl_context, limits)  # every request it can carry (proxy/upstream/http1.py)

    async def send(self, method: str, url: str, headers: list[tuple[str, str]], content: bytes | None,
                   settings: UpstreamSettings) -> httpx.Response:
        """Send and return as soon as the status line and headers arrive (body still streaming).

        A connection dropped before any response byte is retried once on a fresh one (module docstring).
        """
        timeout = _timeout(settings.connect_timeout, settings.read_timeout)
        where, text = _url(url)
        wire = wire_headers(method, where, headers, content)
        block = header_block(method, wire) if wire is not None else None
        if block is not None:
            try:
                return await self.http1.send(method, where, block, content, timeout)
            except Unanswered as e:
                dropped: Exception = e
            except httpx.TransportError as e:
                raise _transport_error(e, url) from e
            return await self._once_more(url, dropped, self.http1.send(method, where, block, content, timeout,
                                                                         fresh=True))
        attempt = _Attempt()
        token = _ATTEMPT.set(attempt)
        try:
            return await _send(self._transport, method, where, text, headers, wire, content, timeout)
        except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
            if method.upper() in _IDEMPOTENT or not _unanswered_drop(e, attempt):
                raise _transport_error(e, url) from e
            dropped = e
        finally:
            _ATTEMPT.reset(token)
        return await self._once_more(url, dropped,
                                     _send(self._fresh_transport, method, where, text, headers, wire, content,
                                           timeout))

    @staticmethod
    async def _once_more(url: str, dropped: Exception, again: Coroutine[Any, Any, httpx.Response]) -> httpx.Response:
        """The one retry, on a fresh connection, of a request whose connection died before any answer byte."""
        event("upstream connection dropped before answering; retrying once on a fresh connection",
              upstream=_host(url), reason=_transport_error(dropped, url).message)
        try:
            return await again
        except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
            raise _transport_error(e, url) from e

    async def aclose(self) -> None:
        self.http1.close()
        await self.client.aclose()
        await self.fresh.aclose()


@functools.lru_cache(maxsize=64)  # a route's two settings: one object per route, not one per request
def _timeout(connect: float, read: float) -> httpx.Timeout:
    return httpx.Timeout(connect=connect, read=read, write=_WRITE_TIMEOUT, pool=connect)


_URLS: dict[str, tuple[httpx.URL, str]] = {}  # upstream URL strings parsed once: a handful per route (paths, queries)
_URLS_KEPT = 1024


def _url(url: str) -> tuple[httpx.URL, str]:
    """The URL parsed, and as httpx spells it (what the transport hands aiohttp)."""
    parsed = _URLS.get(url)
    if parsed is None:
        if len(_URLS) >= _URLS_KEPT:
            _URLS.clear()
        where = httpx.URL(url)
        parsed = _URLS[url] = (where, str(where))
    return parsed


async def _send(transport: AiohttpTransport, method: str, where: httpx.URL, text: str,
                headers: list[tuple[str, str]], wire: list[tuple[str, str]] | None, content: bytes | None,
                timeout: httpx.Timeout) -> httpx.Response:
    """The request straight to the client's transport: nothing of Client.send is needed here (no auth, no
    redirects followed, no cookies kept, no event hooks), and skipping it halves httpx's cost per request.
    `where`, `text` as _url gives them, `wire` as wire_headers does. Straight to aiohttp, as the transport
    would send it, unless a header is not ASCII (`wire` None: proxy/upstream/direct.py)."""
    if wire is not None and transport.proxy is None:
        return await send_direct(transport, method, where, text, wire, content, timeout)
    request = httpx.Request(method, where, headers=headers, content=content,
                            extensions={"timeout": timeout.as_dict()})
    response = await transport.handle_async_request(request)
    response.request = request
    return response


async def iter_raw(resp: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The body as it arrives; a transport failure mid-body raises a ProxyError, and the response is closed."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
        raise _transport_error(e, url) from e
    finally:
        await resp.aclose()


async def read_body(resp: httpx.Response, url: str) -> bytes:
    """The whole (decoded) body, for responses the proxy must look into."""
    try:
        return await _read_whole(resp)
    except (httpx.TransportError, aiohttp.ClientError, OSError) as e:
        raise _transport_error(e, url) from e
    finally:
        await _close(resp)


async def _read_whole(resp: httpx.Response) -> bytes:
    """`resp.aread()`, read straight from aiohttp when the body is not content-coded: httpx's decoder and
    chunker layers are a pass-through then, and cost more than the read itself for a small answer. The
    bytes, `resp.content` and the errors (mapped to httpx's, as the transport maps them) are the same."""
    stream = resp.stream
    identity = resp.headers.get("content-encoding", "identity") == "identity"
    if isinstance(stream, Body) and identity:
        content = await stream.read()
        resp._content = content
        return content
    if not isinstance(stream, AiohttpResponseStream) or not identity:
        return await resp.aread()
    try:
        content = await stream._aiohttp_response.read()
    except Exception as exc:
        raise_httpx_error(exc)
    resp._content = content  # what aread leaves: resp.content is the body
    return content


async def _close(resp: httpx.Response) -> None:
    """`resp.aclose()`: for aiohttp's stream, what it does (closed once, the connection released, errors mapped)
    without its two context managers (httpx's request context, the transport's mapping)."""
    stream = resp.stream
    if isinstance(stream, Body):
        resp.is_closed = True
        await stream.aclose()
        return
    if not isinstance(stream, AiohttpResponseStream):
        await resp.aclose()
        return
    if resp.is_closed:
        return
    resp.is_closed = True
    try:
        await stream._aiohttp_response.__aexit__(None, None, None)
    except Exception as exc:
        raise_httpx_error(exc)
