"""The upstream send without an httpx.Request (proxy/upstream/direct.py) puts the same bytes on the wire."""

from __future__ import annotations

import asyncio

import aiohttp
import httpx
import pytest
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import map_aiohttp_exceptions

from proxy.upstream.direct import raise_httpx_error, send_direct, wire_headers

CASES: list[tuple[str, str, list[tuple[str, str]], bytes | None]] = [
    ("POST", "http://127.0.0.1:9/v1/chat/completions",
     [("Authorization", "Bearer k"), ("content-type", "application/json")], b'{"a":1}'),
    ("POST", "http://h:80/v1/x", [("X-A", "1"), ("x-a", "2"), ("B", "3")], b""),
    ("post", "https://h/v1/x?q=1", [("Host", "other"), ("Content-Length", "7")], b"1234567"),
    ("GET", "http://h:8080/v1/models", [("accept", "*/*")], None),
    ("GET", "http://h:8080/v1/models", [], b"body"),
    ("PUT", "http://h/v1/p", [("Transfer-Encoding", "chunked")], None),
    ("DELETE", "http://h/v1/p", [("X-Trace", "a"), ("x-trace", "b"), ("X-TRACE", "c")], None),
]


@pytest.mark.parametrize("method,url,headers,content", CASES)
def test_headers_are_those_httpx_hands_the_transport(method: str, url: str, headers: list[tuple[str, str]],
                                                     content: bytes | None) -> None:
    request = httpx.Request(method, url, headers=headers, content=content)
    assert wire_headers(method, httpx.URL(url), headers, content) == list(request.headers.items())


def test_a_header_not_ascii_is_left_to_httpx() -> None:
    assert wire_headers("POST", httpx.URL("http://h/"), [("x-name", "caf\u00e9")], b"x") is None


async def _captured(send: object) -> bytes:
    """The bytes of one request as a server receives them, and a 200 back."""
    got = bytearray()
    done = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        got.extend(head)
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        got.extend(await reader.readexactly(length))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok")
        await writer.drain()
        writer.close()
        done.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        resp = await send(f"http://127.0.0.1:{port}/v1/chat/completions")  # type: ignore[operator]
        assert resp.status_code == 200 and await resp.aread() == b"ok"
        await resp.aclose()
        await done.wait()
    finally:
        server.close()
    return bytes(got)


async def test_the_same_bytes_reach_the_provider() -> None:
    headers = [("Authorization", "Bearer k"), ("content-type", "application/json"), ("X-A", "1"), ("x-a", "2")]
    body = b'{"model":"m","messages":[]}'
    timeout = httpx.Timeout(5.0)
    transport = AiohttpTransport()
    try:
        async def via_httpx(url: str) -> httpx.Response:
            request = httpx.Request("POST", url, headers=headers, content=body,
                                    extensions={"timeout": timeout.as_dict()})
            return await transport.handle_async_request(request)

        async def direct(url: str) -> httpx.Response:
            where = httpx.URL(url)
            wire = wire_headers("POST", where, headers, body)
            assert wire is not None
            return await send_direct(transport, "POST", where, str(where), wire, body, timeout)

        old, new = await _captured(via_httpx), await _captured(direct)
    finally:
        await transport.aclose()
    port_free = [line for line in old.split(b"\r\n") if not line.lower().startswith(b"host:")]
    assert port_free == [line for line in new.split(b"\r\n") if not line.lower().startswith(b"host:")]
    assert old.lower().count(b"\r\nhost: 127.0.0.1:") == new.lower().count(b"\r\nhost: 127.0.0.1:") == 1


@pytest.mark.parametrize("exc", [
    aiohttp.ServerDisconnectedError(), aiohttp.ClientConnectionResetError("reset"),
    aiohttp.ClientPayloadError("cut"), aiohttp.ServerTimeoutError("slow"), TimeoutError(),
    aiohttp.ClientOSError(104, "reset by peer"), aiohttp.InvalidURL("x"), ValueError("not aiohttp's"),
])
def test_errors_are_mapped_as_the_transport_maps_them(exc: Exception) -> None:
    """raise_httpx_error stands for httpx_aiohttp's map_aiohttp_exceptions: the same type, message and cause."""
    def through(raiser: object) -> BaseException:
        try:
            try:
                raise exc
            except Exception as e:
                if raiser is None:
                    with map_aiohttp_exceptions():
                        raise
                raise_httpx_error(e)
        except BaseException as got:  # noqa: BLE001 - what each raised is compared
            return got
        raise AssertionError("nothing raised")

    theirs, ours = through(None), through(raise_httpx_error)
    assert (type(ours), str(ours), ours.__cause__) == (type(theirs), str(theirs), theirs.__cause__)
