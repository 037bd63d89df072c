"""The provider connection (proxy/upstream/http1.py), against scripted servers on loopback.

Each test's server is an asyncio one in the test's own loop, answering bytes written by hand, so framing,
keep-alive, timeouts and failures are the server's exact doing. Through the proxy the same paths are run by
tests/test_faults.py and tests/test_upstream_retry.py; here each rule is pinned where it is made.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import httpx
import pytest

from proxy.config import UpstreamSettings
from proxy.errors import ProxyError, UpstreamTimeout, UpstreamUnreachable
from proxy.upstream.client import Upstream, iter_raw, read_body
from proxy.upstream.http1 import Body, Http1, header_block

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
JSON = b'{"ok":true}'


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return head + (await reader.readexactly(int(m.group(1))) if m else b"")


def ok(body: bytes = JSON, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(body), extra, body)


class Server:
    """A loopback server running `serve` per connection; counts connections and keeps what it read."""

    def __init__(self, serve: Serve) -> None:
        self.serve, self.connections, self.requests = serve, 0, []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.serve(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"

    async def read(self, reader: asyncio.StreamReader) -> bytes:
        data = await read_request(reader)
        self.requests.append(data)
        return data


def answering(body: bytes = JSON) -> Server:
    """A server answering every request on each connection with `body`, as long as the connection lasts."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server.read(reader)
            writer.write(ok(body))

    server = Server(serve)
    return server


def http1(max_connections: int = 10, **limits: float) -> Http1:
    return Http1(httpx.create_ssl_context(), httpx.Limits(max_connections=max_connections,
                                                          max_keepalive_connections=max_connections, **limits))


def settings(read: float = 5.0) -> UpstreamSettings:
    return UpstreamSettings(base_url="http://127.0.0.1:1/v1", connect_timeout=2.0, read_timeout=read)


async def post(up: Upstream, url: str, body: bytes = b'{"model":"m"}', read: float = 5.0,
               headers: list[tuple[str, str]] | None = None) -> tuple[httpx.Response, bytes]:
    resp = await up.send("POST", url, headers or [("content-type", "application/json")], body, settings(read))
    return resp, await read_body(resp, url)


@pytest.fixture
async def up():
    u = Upstream()
    yield u
    await u.aclose()


async def test_the_request_goes_as_given_and_the_answer_comes_back_byte_for_byte(up):
    answer = b"HTTP/1.1 201 Made\r\nX-Odd-Case: A\r\nx-odd-case: b\r\nx-latin: caf\xe9\r\ncontent-length: 2\r\n\r\nhi"

    async def serve(reader, writer):
        await server.read(reader)
        writer.write(answer)

    async with Server(serve) as server:
        resp, body = await post(up, server.url + "?q=1", headers=[("Authorization", "Bearer k"), ("X-A", "1"),
                                                                  ("x-a", "2"), ("content-type", "text/plain")])
    assert (resp.status_code, resp.reason_phrase, body) == (201, "Made", b"hi")
    assert resp.headers.raw == [(b"X-Odd-Case", b"A"), (b"x-odd-case", b"b"), (b"x-latin", b"caf\xe9"),
                                (b"content-length", b"2")]
    assert server.requests == [b"POST /v1/chat/completions?q=1 HTTP/1.1\r\nhost: 127.0.0.1:%d" % server.port +
                               b"\r\nauthorization: Bearer k\r\nx-a: 1, 2\r\ncontent-type: text/plain\r\n"
                               b"content-length: 13\r\n\r\n{\"model\":\"m\"}"]


async def test_a_kept_alive_connection_carries_the_next_request(up):
    async def serve(reader, writer):
        for _ in range(3):
            await server.read(reader)
            writer.write(ok())

    async with Server(serve) as server:
        for _ in range(3):
            assert (await post(up, server.url))[1] == JSON
    assert server.connections == 1 and len(server.requests) == 3


async def test_a_connection_the_provider_closes_is_not_reused(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(ok(extra=b"connection: close\r\n"))

    async with Server(serve) as server:
        for _ in range(2):
            assert (await post(up, server.url))[1] == JSON
    assert server.connections == 2


async def test_chunked_and_close_delimited_bodies_are_read_whole(up):
    chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n3\r\nefg\r\n0\r\n\r\n"
    until_close = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it"

    async def serve(reader, writer):
        data = await server.read(reader)
        writer.write(chunked if b"chunked" in data else until_close)

    async with Server(serve) as server:
        assert (await post(up, server.url, b"chunked"))[1] == b"abcdefg"
        assert (await post(up, server.url, b"close"))[1] == b"all of it"


async def test_an_interim_100_continue_is_passed_over(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok())

    async with Server(serve) as server:
        resp, body = await post(up, server.url)
    assert (resp.status_code, body) == (200, JSON)


async def test_a_stream_arrives_chunk_by_chunk(up):
    release = asyncio.Event()

    async def serve(reader, writer):
        await server.read(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                     b"7\r\ndata: 1\r\n")
        await writer.drain()
        await release.wait()
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")

    async with Server(serve) as server:
        resp = await up.send("POST", server.url, [], b"{}", settings())
        chunks = iter_raw(resp, server.url)
        assert await chunks.__anext__() == b"data: 1"  # before the rest was even written
        release.set()
        assert [c async for c in chunks] == [b"data: 2"]


async def test_a_body_larger_than_the_buffer_streams_whole_to_a_slow_reader(up):
    big = bytes(range(256)) * 40_000  # 10 MB: the socket is paused and resumed many times

    async def serve(reader, writer):
        await server.read(reader)
        writer.write(ok(big))
        await writer.drain()

    async with Server(serve) as server:
        resp = await up.send("POST", server.url, [], b"{}", settings())
        got = bytearray()
        async for chunk in iter_raw(resp, server.url):
            got += chunk
            await asyncio.sleep(0)
    assert bytes(got) == big


async def test_silence_past_the_read_timeout_is_a_timeout_and_not_retried(up):
    async def serve(reader, writer):
        await server.read(reader)
        await asyncio.sleep(5)

    async with Server(serve) as server:
        with pytest.raises(UpstreamTimeout, match="timed out"):
            await post(up, server.url, read=0.2)
    assert server.connections == 1


async def test_silence_mid_body_is_a_timeout_too(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await asyncio.sleep(5)

    async with Server(serve) as server:
        with pytest.raises(UpstreamTimeout):
            await post(up, server.url, read=0.2)


async def test_a_drop_before_any_answer_is_sent_once_more_on_a_fresh_connection(up):
    async def serve(reader, writer):
        await server.read(reader)
        if server.connections == 1:
            writer.transport.abort()
            return
        writer.write(ok())

    async with Server(serve) as server:
        assert (await post(up, server.url))[1] == JSON
    assert server.connections == 2 and len(server.requests) == 2


async def test_a_drop_after_part_of_the_answer_is_an_error_not_a_retry(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        await writer.drain()

    async with Server(serve) as server:
        with pytest.raises(UpstreamUnreachable, match="before the answer was complete"):
            await post(up, server.url)
    assert server.connections == 1


async def test_a_provider_nobody_listens_for_is_unreachable(up):
    async with Server(lambda r, w: asyncio.sleep(0)) as server:
        url = server.url
    with pytest.raises(UpstreamUnreachable, match="unreachable"):
        await post(up, url)


async def test_a_body_left_unread_does_not_leave_its_connection_in_the_pool(up):
    async with answering(b"x" * 100_000) as server:
        resp = await up.send("POST", server.url, [], b"{}", settings())
        await resp.aclose()  # closed before its body was read
        assert (await post(up, server.url))[1] == b"x" * 100_000
    assert server.connections == 2


async def test_a_malformed_answer_is_an_error(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")

    async with Server(serve) as server:
        with pytest.raises(ProxyError, match="malformed"):
            await post(up, server.url)


def test_what_cannot_go_this_way_is_left_to_httpx() -> None:
    assert header_block("POST", [("a", "b")]) == b"a: b\r\n"
    assert header_block("HEAD", [("a", "b")]) is None
    assert header_block("POST", [("a", "b\r\nx-injected: 1")]) is None
    assert header_block("POST", [("a", "b\nc")]) is None
    assert header_block("POST", [("a", "b\0")]) is None


async def test_a_header_with_a_line_break_never_reaches_the_provider(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(ok())

    async with Server(serve) as server:
        with pytest.raises(ValueError):  # aiohttp's refusal, as before this transport
            await up.send("POST", server.url, [("x-a", "b\r\nx-injected: 1")], b"{}", settings())
    assert server.requests == []


async def test_the_answer_is_the_transport_s_own_body(up):
    async def serve(reader, writer):
        await server.read(reader)
        writer.write(ok())

    async with Server(serve) as server:
        resp = await up.send("POST", server.url, [], b"{}", settings())
        assert isinstance(resp.stream, Body)
        assert await read_body(resp, server.url) == JSON and resp.content == JSON


async def test_at_the_connection_limit_a_request_waits_for_one_given_back():
    h = http1(max_connections=1)
    timeout = httpx.Timeout(2.0, pool=0.3)
    async with answering() as server:
        url = httpx.URL(server.url)
        first = await h.send("POST", url, b"content-length: 0\r\n", None, timeout)
        with pytest.raises(httpx.PoolTimeout):  # the one connection is still held by `first`
            await h.send("POST", url, b"content-length: 0\r\n", None, timeout)
        second = asyncio.ensure_future(h.send("POST", url, b"content-length: 0\r\n", None, timeout))
        await asyncio.sleep(0.05)
        assert not second.done()
        assert await first.stream.read() == JSON  # given back: the waiting request takes it
        assert await (await second).stream.read() == JSON
    h.close()
    assert server.connections == 1 and len(server.requests) == 2


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (openssl's CLI), and its key."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the TLS test's certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


async def test_https_is_verified_against_the_context_s_authorities(certificate):
    import ssl

    cert, key = certificate
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)

    async def handle(reader, writer):
        try:
            await read_request(reader)
            writer.write(ok())
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=served)
    url = httpx.URL(f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions")
    trusting = ssl.create_default_context(cafile=cert)
    limits = httpx.Limits(max_connections=10, max_keepalive_connections=10)
    timeout = httpx.Timeout(5.0)
    try:
        h = Http1(trusting, limits)
        resp = await h.send("POST", url, b"content-length: 0\r\n", None, timeout)
        assert (resp.status_code, await resp.stream.read()) == (200, JSON)
        h.close()
        stranger = Http1(ssl.create_default_context(), limits)  # the system's authorities: not this one
        with pytest.raises(httpx.ConnectError, match="certificate verify failed"):
            await stranger.send("POST", url, b"content-length: 0\r\n", None, timeout)
    finally:
        server.close()


async def test_a_connection_idle_past_the_keepalive_expiry_is_not_reused():
    h = http1(keepalive_expiry=0.1)
    async with answering() as server:
        url = httpx.URL(server.url)
        for pause in (0, 0, 0.3):  # reused at once, then idle past 0.1 s: a new connection
            await asyncio.sleep(pause)
            resp = await h.send("POST", url, b"content-length: 0\r\n", None, httpx.Timeout(2.0))
            assert await resp.stream.read() == JSON
        h.close()
    assert server.connections == 2 and len(server.requests) == 3


async def test_after_close_no_connection_is_kept_alive():
    h = http1()
    async with answering() as server:
        url = httpx.URL(server.url)
        in_flight = await h.send("POST", url, b"content-length: 0\r\n", None, httpx.Timeout(2.0))
        h.close()  # shutting down while an answer is still being read
        assert await in_flight.stream.read() == JSON
        origin = next(iter(h.origins.values()))
        assert origin.idle == [] and origin.open == 0


async def test_an_answer_before_the_whole_body_went_out_does_not_reuse_the_connection():
    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        server.requests.append(head)
        writer.write(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 0\r\n\r\n")  # keep-alive, body unread
        await writer.drain()
        await asyncio.sleep(1)  # the rest of the body stays unread for a while

    h = http1()
    async with Server(serve) as server:
        url = httpx.URL(server.url)
        big = b"x" * (32 << 20)  # more than the sockets' buffers hold
        resp = await h.send("POST", url, b"content-length: %d\r\n" % len(big), big, httpx.Timeout(5.0))
        assert resp.status_code == 413 and await resp.stream.read() == b""
        origin = next(iter(h.origins.values()))
        assert origin.idle == []  # not kept: the body's tail would be read as the next request
        h.close()
