"""The one shared HTTP client to providers: httpx's interface over aiohttp (httpx-aiohttp); errors mapped.

Provider calls go through one `httpx.AsyncBaseTransport`, httpx-aiohttp's, whose
connection pool is aiohttp's: against a local provider at 16 concurrent requests
httpx's own transport (httpcore) answered about 820 requests/s where aiohttp
answered 12,000 (the proxy's whole budget per request is about a millisecond).
The environment's egress settings are honoured as httpx and the provider SDKs
honour them: HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY (either case,
read with the standard library's getproxies/proxy_bypass) choose a proxy per
provider origin, once, not per request (aiohttp's own trust_env looks them and
~/.netrc up on every request: 4.6x slower); SSL_CERT_FILE and SSL_CERT_DIR
choose the authorities (httpx.create_ssl_context). No cookie is ever kept:
one client serves every tenant. Responses stream chunk by chunk as they arrive.

A pooled keep-alive connection can die just as a request goes out on it: the
provider closed it while idle, and the request meets a close before any
answer. The provider never saw that request, so it is sent once more - what
browsers do for stale keep-alive connections, and safe for a POST only
because not one byte of a response came back (aiohttp's ServerDisconnectedError
says exactly that). Never twice, never after a timeout or a reset.
"""

from __future__ import annotations

import functools
import urllib.request
from collections.abc import AsyncIterator, Iterable
from urllib.parse import quote

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from proxy.config import UpstreamSettings
from proxy.errors import BadRequest, ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.logs import event

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
KEEPALIVE_EXPIRY = 5.0  # seconds an idle provider connection is kept (httpx's default)
_WRITE_TIMEOUT = 60.0  # seconds to send a request body


def _dropped(headers: Iterable[tuple[str, str]]) -> frozenset[str]:
    extra: set[str] = set()
    for k, v in headers:
        if k.lower() == "connection":
            extra.update(t.strip().lower() for t in v.split(","))
    return HOP_BY_HOP | extra


def request_headers(client_headers: Iterable[tuple[str, str]], key: tuple[str, str] | None,
                    *, identity_encoding: bool = False) -> list[tuple[str, str]]:
    """The client's headers for the provider: hop-by-hop removed, `key` (the operator's, in the header the
    provider's dialect reads it from) in place of the client's credentials.

    `identity_encoding`: the proxy sends a body of its own (the client's, decoded, rewritten and serialized
    again) and reads the answer, so neither is compressed: the client's Content-Encoding is dropped (the
    transport sets Content-Length for the new body) and the answer is asked for as identity.
    """
    items = list(client_headers)
    drop = _dropped(items) | _PROXY_HEADERS
    if key:
        drop = drop | {"authorization", "api-key", "x-api-key"}
    if identity_encoding:
        drop = drop | {"accept-encoding", "content-encoding"}
    out = [(k, v) for k, v in items if k.lower() not in drop]
    for k, v in out:
        if not v.isascii():
            raise BadRequest(f"header {k!r} has non-ASCII characters; HTTP header values must be ASCII",
                             param=k, code="invalid_header")
    if key:
        out.append(key)
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
    cause = exc.__cause__ or exc  # httpx-aiohttp raises httpx's errors from aiohttp's
    if isinstance(cause, (TimeoutError, aiohttp.ServerTimeoutError)) or (
            isinstance(exc, httpx.TimeoutException) and cause is exc):
        return UpstreamTimeout(f"upstream {host} timed out ({type(cause).__name__})")
    reason = str(cause) or type(cause).__name__
    return UpstreamUnreachable(f"upstream {host} unreachable: {reason}")


def _unanswered(exc: Exception) -> bool:
    """The connection was closed under the request before a single response byte: safe to send it again."""
    return isinstance(exc.__cause__, aiohttp.ServerDisconnectedError)


def _env_proxy(url: httpx.URL) -> httpx.Proxy | None:
    """The forward proxy the environment names for this origin (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY)."""
    proxies = urllib.request.getproxies()
    chosen = proxies.get(url.scheme) or proxies.get("all")
    if not chosen or urllib.request.proxy_bypass(url.host if url.port is None else f"{url.host}:{url.port}"):
        return None
    return httpx.Proxy(chosen if "://" in chosen else f"http://{chosen}")


class Upstream:
    """Owns the shared connection pool; one per process, closed at shutdown."""

    def __init__(self, trust_env: bool = True) -> None:
        self.trust_env = trust_env
        self.ssl_context = httpx.create_ssl_context(trust_env=trust_env)
        self._session: aiohttp.ClientSession | None = None
        self._transports: dict[tuple[str, str, int | None], AiohttpTransport] = {}  # per provider origin

    def _session_of(self) -> aiohttp.ClientSession:
        """One aiohttp session (made on the running loop) for every origin and proxy: one pool, no cookie jar."""
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ssl=self.ssl_context,
                                             keepalive_timeout=KEEPALIVE_EXPIRY)
            self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    def _transport(self, url: httpx.URL) -> AiohttpTransport:
        origin = (url.scheme, url.host, url.port)
        transport = self._transports.get(origin)
        if transport is None:
            proxy = _env_proxy(url) if self.trust_env else None
            # the pool, its limits and TLS are the session's: the transport carries its origin's proxy (its own
            # context, which it would build from the CA bundle otherwise, is the session's one)
            transport = self._transports[origin] = AiohttpTransport(verify=self.ssl_context, proxy=proxy,
                                                                    client=self._session_of())
        return transport

    async def send(self, method: str, url: str, headers: list[tuple[str, str]], content: bytes | None,
                   settings: UpstreamSettings) -> httpx.Response:
        """Send and return as soon as the status line and headers arrive (body still streaming).

        A connection closed before any response byte is retried once (module docstring).
        """
        timeout = _timeout(settings.connect_timeout, settings.read_timeout)
        request = httpx.Request(method, _parsed(url), headers=headers, content=content, extensions={"timeout": timeout})
        transport = self._transport(request.url)
        try:
            return await transport.handle_async_request(request)
        except httpx.TransportError as e:
            if not _unanswered(e):
                raise _transport_error(e, url) from e
            event("upstream connection dropped before answering; retrying once", upstream=_host(url))
        try:
            return await transport.handle_async_request(request)
        except httpx.TransportError as e:
            raise _transport_error(e, url) from e

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


@functools.lru_cache(maxsize=1024)  # a route's few URLs, each parsed once rather than on every request
def _parsed(url: str) -> httpx.URL:
    return httpx.URL(url)


@functools.lru_cache(maxsize=64)  # a route's two settings: one object per route, not one per request
def _timeout(connect: float, read: float) -> dict[str, float | None]:
    return httpx.Timeout(connect=connect, read=read, write=_WRITE_TIMEOUT, pool=connect).as_dict()


async def iter_raw(resp: httpx.Response, url: str) -> AsyncIterator[bytes]:
    """The body as it arrives; a transport failure mid-body raises a ProxyError, and the response is closed."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.TransportError as e:
        raise _transport_error(e, url) from e
    finally:
        await resp.aclose()


async def read_answer(resp: httpx.Response, url: str) -> bytes:
    """The whole (decoded) body, for responses the proxy must look into."""
    try:
        return await resp.aread()
    except httpx.TransportError as e:
        raise _transport_error(e, url) from e
    finally:
        await resp.aclose()
