"""One request handed to aiohttp the way httpx_aiohttp's transport hands it, without building an httpx.Request.

The transport only reads the method, URL, headers and body of the httpx.Request it is given, and passes the
headers to aiohttp as httpx's `Headers.items()` spells them (lower-case names, a repeated name's values joined
with ", ", the Host and Content-Length httpx adds). Building that Request (its Headers twice, its URL, its byte
stream) cost more than all the rest of the send on a small request; `wire_headers` produces the same list
directly, checked against httpx's own (tests/test_upstream_direct.py). A header that is not ASCII (httpx
decides how those go, or refuses them) takes httpx's way.

The response is the httpx.Response the transport would return, read the same way; it carries no `request`
(nothing reads it: the proxy answers from the response alone).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import NoReturn

import httpx
from aiohttp import ClientSession, ClientTimeout
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import AIOHTTP_EXC_MAP, AiohttpResponseStream

_SIZED_METHODS = ("POST", "PUT", "PATCH")  # httpx says Content-Length: 0 for these when there is no body


def wire_headers(method: str, url: httpx.URL, headers: Iterable[tuple[str, str]],
                 content: bytes | None) -> list[tuple[str, str]] | None:
    """What aiohttp gets as headers from `httpx.Request(method, url, headers=headers, content=content)` via
    httpx_aiohttp; None if a name or value is not ASCII."""
    merged: dict[str, str] = {}
    for key, value in headers:
        if not (key.isascii() and value.isascii()):
            return None
        low = key.lower()
        if low in merged:
            merged[low] += f", {value}"
        else:
            merged[low] = value
    if content and "content-length" not in merged:  # httpx's default header, set after the client's
        merged["content-length"] = str(len(content))
    auto: list[tuple[str, str]] = []  # httpx puts these before all others
    if "host" not in merged and url.host:
        auto.append(("host", url.netloc.decode("ascii")))
    if "content-length" not in merged and "transfer-encoding" not in merged and method.upper() in _SIZED_METHODS:
        auto.append(("content-length", "0"))
    return auto + list(merged.items())


def raise_httpx_error(exc: Exception) -> NoReturn:
    """Raise what httpx_aiohttp's `map_aiohttp_exceptions` raises for `exc` (the most specific httpx error it
    maps to, from `exc`; `exc` itself when none maps), without a context manager per call: three per request
    cost more than the mapping ever does. Call it in an `except` block."""
    mapped: type[Exception] | None = None
    for from_exc, to_exc in AIOHTTP_EXC_MAP.items():
        if isinstance(exc, from_exc) and (mapped is None or issubclass(to_exc, mapped)):
            mapped = to_exc
    if mapped is None:
        raise exc
    raise mapped(str(exc)) from exc


@functools.lru_cache(maxsize=64)  # ClientTimeout is frozen: one per route's settings, not one per request
def _client_timeout(connect: float | None, read: float | None, pool: float | None) -> ClientTimeout:
    return ClientTimeout(sock_connect=connect, sock_read=read, connect=pool)


async def send_direct(transport: AiohttpTransport, method: str, url: httpx.URL, url_text: str,
                      headers: list[tuple[str, str]], content: bytes | None,
                      timeout: httpx.Timeout) -> httpx.Response:
    """AiohttpTransport.handle_async_request for these parts of a request, `headers` as `wire_headers` gave
    them and `url_text` as str(url); the same aiohttp call, the same errors (mapped as the transport maps them)."""
    if not isinstance(transport.client, ClientSession):
        transport.client = transport.get_client()
    try:
        response = await transport.client.request(
            method=method.upper(), url=url_text, headers=headers, data=content or None, allow_redirects=False,
            auto_decompress=False, compress=False,
            timeout=_client_timeout(timeout.connect, timeout.read, timeout.pool),
            server_hostname=None, proxy=None, proxy_auth=None, proxy_headers=None,
        ).__aenter__()
    except Exception as exc:
        raise_httpx_error(exc)
    extensions = {"http_version": b"HTTP/1.1"}
    if response.reason:
        extensions["reason_phrase"] = response.reason.encode()
    return httpx.Response(status_code=response.status, headers=response.raw_headers,
                          stream=AiohttpResponseStream(response), extensions=extensions)
