"""Provider calls leave as users' networks need: through the forward proxy the environment names.

The upstream client is httpx's own (proxy/upstream/client.py), so HTTP_PROXY,
HTTPS_PROXY, NO_PROXY and SSL_CERT_FILE mean what they mean to httpx and the
provider SDKs. A local forward proxy stands in for a corporate egress proxy: it
serves absolute-form requests (HTTP_PROXY) and CONNECT tunnels (HTTPS_PROXY), and
is the only one that can reach the provider, whose name resolves nowhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
import threading
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest
from proxy_server import InProcessProxy, make_settings

PROVIDER = "provider.invalid"  # RFC 2606: never resolves
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
AUTH = {"authorization": "Bearer sk-egress"}


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.contextmanager
def serving(handler: Handler, context: ssl.SSLContext | None = None) -> Iterator[int]:
    """`handler` served on a loopback port (yielded) by an event loop of its own, in a thread."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handler, "127.0.0.1", 0, ssl=context))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


class ForwardProxy:
    """An HTTP forward proxy on loopback that maps PROVIDER to `target` (host, port): absolute-form requests are
    relayed on a connection of their own, CONNECT is a byte tunnel. `seen` lists each request line."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.seen: list[str] = []

    async def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode()
        self.seen.append(line)
        method, target, _ = line.split(" ")
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        if method == "CONNECT":
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:  # absolute-form: the origin-form line to the provider, the rest as it came
            path = "/" + target.split("://", 1)[1].split("/", 1)[1]
            up_writer.write(head.replace(target.encode(), path.encode(), 1))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@contextlib.contextmanager
def forward_proxy(target: tuple[str, int]) -> Iterator[tuple[str, ForwardProxy]]:
    fwd = ForwardProxy(target)
    with serving(fwd) as port:
        yield f"http://127.0.0.1:{port}", fwd


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate for PROVIDER (openssl's CLI), and its key."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the egress test's certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = str(d / "cert.pem"), str(d / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", f"/CN={PROVIDER}", "-addext", f"subjectAltName=DNS:{PROVIDER}"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
def tls_provider(mock_upstream, certificate) -> Iterator[tuple[str, int]]:
    """The mock provider behind TLS: a terminating relay on loopback with PROVIDER's certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    mock = _mock_address(mock_upstream)

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*mock)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    with serving(relay, context) as port:
        yield "127.0.0.1", port


def _mock_address(mock_upstream) -> tuple[str, int]:
    host, port = mock_upstream.base_url.split("://", 1)[1].split("/", 1)[0].split(":")
    return host, int(port)


def _proxy(base_url: str, tmp_path) -> InProcessProxy:
    return InProcessProxy(make_settings(base_url, f"sqlite:///{tmp_path}/e.db"))


@pytest.fixture
def clean_env(monkeypatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    httpx.create_ssl_context.cache_clear()  # tests/conftest.py keeps one per set of arguments: SSL_CERT_FILE is not one
    yield monkeypatch
    httpx.create_ssl_context.cache_clear()


def test_a_provider_reachable_only_through_http_proxy_answers(upstream, tmp_path, clean_env):
    host, port = _mock_address(upstream)
    with forward_proxy((host, port)) as (url, fwd):
        clean_env.setenv("HTTP_PROXY", url)
        with _proxy(f"http://{PROVIDER}:{port}/v1", tmp_path) as p:
            r = p.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 200, r.text
    assert fwd.seen == [f"POST http://{PROVIDER}:{port}/v1/chat/completions HTTP/1.1"]
    assert upstream.requests[-1].headers["authorization"] == AUTH["authorization"]


def test_no_proxy_reaches_the_provider_directly(upstream, tmp_path, clean_env):
    host, port = _mock_address(upstream)
    with forward_proxy((host, port)) as (url, fwd):
        clean_env.setenv("http_proxy", url)
        clean_env.setenv("no_proxy", "127.0.0.1")
        with _proxy(upstream.base_url, tmp_path) as p:
            r = p.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 200, r.text
    assert fwd.seen == []


def test_https_through_a_connect_tunnel_with_a_custom_ca(upstream, tls_provider, certificate, tmp_path, clean_env):
    with forward_proxy(tls_provider) as (url, fwd):
        clean_env.setenv("HTTPS_PROXY", url)
        clean_env.setenv("SSL_CERT_FILE", certificate[0])
        with _proxy(f"https://{PROVIDER}:{tls_provider[1]}/v1", tmp_path) as p:
            r = p.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 200, r.text
    assert fwd.seen == [f"CONNECT {PROVIDER}:{tls_provider[1]} HTTP/1.1"]


def test_a_provider_certificate_no_authority_vouches_for_is_refused(upstream, tls_provider, tmp_path, clean_env):
    with forward_proxy(tls_provider) as (url, fwd):
        clean_env.setenv("HTTPS_PROXY", url)
        with _proxy(f"https://{PROVIDER}:{tls_provider[1]}/v1", tmp_path) as p:
            r = p.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_unreachable"
    assert "CERTIFICATE_VERIFY_FAILED" in r.json()["error"]["message"]
