"""`ctxproxy serve` bounds every client connection: slow headers, slow bodies, too many connections.

Run as users run it (a real `ctxproxy serve` process, raw sockets as hostile
clients), with short test timeouts from the config file.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
import test_serve

TIMEOUT = 0.5  # header_timeout, body_timeout and keep_alive_timeout in these tests
MAX_HEADER_BYTES = 4096  # server.max_header_bytes of the module's server (the other tests send far less)
SLACK = 8.0  # a loaded 2-core machine: closed well after TIMEOUT, but long before "never"


def start(tmp_path: Path, upstream, **server) -> test_serve.Served:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"server": server}))  # JSON is YAML
    return test_serve.serve(tmp_path, {"CTXPROXY_UPSTREAM": upstream.base_url}, "--config", str(cfg))


@pytest.fixture(scope="module")
def quick(tmp_path_factory, mock_upstream):
    s = start(tmp_path_factory.mktemp("quick"), mock_upstream, header_timeout=TIMEOUT, body_timeout=TIMEOUT,
              keep_alive_timeout=TIMEOUT, max_header_bytes=MAX_HEADER_BYTES)
    yield s
    test_serve.stop(s)


def connect(s: test_serve.Served) -> socket.socket:
    host, port = s.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=SLACK + TIMEOUT)
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection.

    The socket's timeout (SLACK + TIMEOUT, from `connect`) is the client's cap: a server that
    keeps the connection open past it fails the test. No clock is read.
    """
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except TimeoutError:
        raise AssertionError(f"still open past the client cap ({SLACK + TIMEOUT:g}s); got {got!r}") from None
    except ConnectionResetError:
        pass
    return got


def error_of(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head.split(b" ", 2)[1]), json.loads(body)["error"]


def trickle(sock: socket.socket, byte: bytes, seconds: float) -> None:
    """Send `byte` every 0.1 s for at least `seconds`; the server must close the connection meanwhile.

    A server whose deadline restarts with every byte never closes while bytes keep coming: the
    loop runs out and the test fails. (time.sleep only ever sleeps longer, so a loaded machine
    makes the trickle longer, never shorter.)
    """
    sent = 0
    try:
        for _ in range(int(seconds / 0.1)):
            sock.sendall(byte)
            sent += 1
            time.sleep(0.1)
    except OSError:  # closed by the server while we were still sending
        return
    raise AssertionError(f"still open after {sent} bytes trickled over at least {seconds:g} s: "
                         "the deadline restarted with each byte")


HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer sk-slow\r\n"
        b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n")


def test_a_body_that_stalls_is_answered_408_and_closed(quick):
    with connect(quick) as sock:
        sock.sendall(HEAD + b'{"model": "gpt-4o", "mess')
        got = until_closed(sock)
    status, error = error_of(got)
    assert status == 408 and error["code"] == "request_timeout" and "server.body_timeout" in error["message"]
    assert httpx.get(quick.url + "/healthz").status_code == 200


def test_a_body_trickled_a_byte_at_a_time_has_one_deadline(quick):
    with connect(quick) as sock:
        sock.sendall(HEAD)
        trickle(sock, b" ", TIMEOUT + SLACK)
        got = until_closed(sock)
    assert error_of(got)[0] == 408


def test_a_connection_that_sends_nothing_is_closed(quick):
    with connect(quick) as sock:
        got = until_closed(sock)
    assert got == b""


@pytest.mark.parametrize("trickled", [False, True], ids=["stalled", "trickled"])
def test_headers_that_never_finish_are_answered_408_and_closed(quick, trickled):
    with connect(quick) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\n")
        if trickled:
            trickle(sock, b"x", TIMEOUT + SLACK)
        got = until_closed(sock)
    status, error = error_of(got)
    assert status == 408 and "server.header_timeout" in error["message"]


def test_the_unread_rest_of_a_body_cannot_hold_the_connection(quick):
    """/healthz answers without reading the body; trickling the rest of it keeps nothing open."""
    with connect(quick) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: proxy\r\ncontent-length: 100000\r\n\r\nxx")
        trickle(sock, b"x", 2 * TIMEOUT + SLACK)
        got = until_closed(sock)
    assert got.startswith(b"HTTP/1.1 200")


def test_oversized_headers_are_answered_431(quick):
    with connect(quick) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: proxy\r\nx-big: " + b"a" * 2 * MAX_HEADER_BYTES)
        got = until_closed(sock)
    status, error = error_of(got)
    assert status == 431 and error["code"] == "request_headers_too_large"
    ok = httpx.get(quick.url + "/healthz", headers={"x-fine": "a" * (MAX_HEADER_BYTES // 2)})
    assert ok.status_code == 200


@pytest.mark.parametrize("shape", ["one-big-header", "many-headers", "after-a-request", "websocket"])
def test_oversized_headers_in_one_read_are_answered_431_before_the_app_runs(quick, mock_upstream, shape):
    """A whole header block over the limit in one sendall (parsed, complete, in one read) is refused alike,
    and so is one pipelined behind a request on the same connection, and a WebSocket handshake."""
    big = 3 * MAX_HEADER_BYTES
    headers = (b"x-big: " + b"a" * big + b"\r\n" if shape != "many-headers" else
               b"".join(b"x-h%d: %s\r\n" % (i, b"b" * 90) for i in range(big // 100)))
    body = b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer sk-big\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), headers, body))
    if shape == "websocket":
        request = (b"GET /v1/responses HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer sk-big\r\n"
                   b"upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-version: 13\r\n"
                   b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n%s\r\n" % headers)
    first = b"GET /healthz HTTP/1.1\r\nhost: proxy\r\n\r\n" if shape == "after-a-request" else b""
    calls = len(mock_upstream.requests)
    with connect(quick) as sock:
        sock.sendall(first + request)
        got = until_closed(sock)
    if first:
        assert got.startswith(b"HTTP/1.1 200"), got[:200]
        got = got[got.index(b"HTTP/1.1 ", 1):]
    status, error = error_of(got)
    assert status == 431 and error["code"] == "request_headers_too_large", got[:300]
    assert len(mock_upstream.requests) == calls, "the request reached the app and went upstream"


def test_past_the_connection_limit_new_connections_get_503_at_once(tmp_path, upstream):
    s = start(tmp_path, upstream, max_connections=3, header_timeout=60)
    idle = [connect(s) for _ in range(3)]  # held open, sending nothing
    try:
        time.sleep(0.3)  # accepted by the server
        # "At once": the 503 comes within the client's timeout, which a queued connection would not.
        r = httpx.get(s.url + "/healthz", timeout=SLACK / 2)
        assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
        assert r.headers["connection"] == "close"
        for sock in idle:
            sock.close()
        deadline = time.monotonic() + SLACK
        while httpx.get(s.url + "/healthz").status_code != 200:  # the server notices the closes
            assert time.monotonic() < deadline, f"still answering 503 {SLACK:g} s after the idle connections closed"
            time.sleep(0.05)
    finally:
        for sock in idle:
            sock.close()
        test_serve.stop(s)
    lines = [line for line in s.log_lines() if line.get("msg") == "connection limit reached: answering 503"]
    assert lines and lines[0]["limit"] == 3
