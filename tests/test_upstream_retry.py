"""A connection the provider closes before answering a byte is retried once.

A pooled keep-alive connection can die just as a request goes out on it (the
provider closed it while idle); the provider never saw the request, so one
retry is safe even for a POST - as browsers do. Never a second retry, never
after a timeout, never once any byte of a response has arrived. A reset (RST)
is not retried: the client library (aiohttp) cannot tell one before any byte
from one after part of an answer, and a provider that got the request may have
run it; the client gets a clean 502 (which the provider SDKs retry themselves).
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable

import httpx
import pytest
from proxy_server import InProcessProxy, make_settings
from test_faults import RawUpstream, read_request, reset

AUTH = {"authorization": "Bearer sk-retry"}
BODY = b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,' \
       b'"message":{"role":"assistant","content":"fine"},"finish_reason":"stop"}]}'


def answer(conn: socket.socket, keep_alive: bool = False) -> None:
    close = b"" if keep_alive else b"connection: close\r\n"
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
                 % (len(BODY), close, BODY))


def close_after_reading(conn: socket.socket) -> None:
    read_request(conn)


def reset_after_reading(conn: socket.socket) -> None:
    read_request(conn)
    reset(conn)


def first_connection_dies(die: Callable[[socket.socket], None]) -> Callable[[socket.socket], None]:
    n = itertools.count()
    lock = threading.Lock()

    def behave(conn: socket.socket) -> None:
        with lock:
            first = next(n) == 0
        if first:
            die(conn)
        else:
            read_request(conn)
            answer(conn)
    return behave


def proxy_to(raw: RawUpstream, tmp_path, **upstream: object) -> InProcessProxy:
    return InProcessProxy(make_settings(raw.base_url, f"sqlite:///{tmp_path}/ctx.db",
                                     upstream={"read_timeout": 5, **upstream}))


def chat(p: InProcessProxy, stream: bool = False) -> httpx.Response:
    return p.post("/v1/chat/completions", headers=AUTH, timeout=20,
                      json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream})


@pytest.mark.parametrize("stream", [False, True])
def test_connection_closed_before_any_answer_is_retried_once(tmp_path, stream):
    with RawUpstream(first_connection_dies(close_after_reading)) as raw, proxy_to(raw, tmp_path) as p:
        r = chat(p, stream)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "fine"
        assert raw.connections == 2


def test_a_reset_is_a_clean_502_not_retried(tmp_path):
    """(A provider that closes without reading the request is left out: the client sees a close or a reset by
    whether the request's bytes had arrived, a race either answer of which is right.)"""
    with RawUpstream(first_connection_dies(reset_after_reading)) as raw, proxy_to(raw, tmp_path) as p:
        r = chat(p)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "upstream_unreachable"
        assert raw.connections == 1
        assert chat(p).status_code == 200  # the next request is served


def test_stale_pooled_connection_is_retried_on_a_fresh_one(tmp_path):
    """The case that happens in production: the provider closes a keep-alive connection the proxy reuses."""
    def behave(conn: socket.socket) -> None:
        read_request(conn)
        answer(conn, keep_alive=True)
        if read_request(conn):  # the second request on this connection: the server has "timed it out"
            conn.close()

    with RawUpstream(behave) as raw, proxy_to(raw, tmp_path) as p:
        for _ in range(3):
            r = chat(p)
            assert r.status_code == 200, r.text
        assert raw.connections == 3  # each reuse died and was retried on a new connection


@pytest.mark.parametrize("stream", [False, True])
def test_provider_that_always_drops_is_a_clean_502_after_two_attempts(tmp_path, stream):
    with RawUpstream(close_after_reading) as raw, proxy_to(raw, tmp_path) as p:
        r = chat(p, stream)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "upstream_unreachable"
        assert raw.connections == 2


def test_a_timeout_is_not_retried(tmp_path):
    def silent(conn: socket.socket) -> None:
        read_request(conn)
        time.sleep(3)

    with RawUpstream(silent) as raw, proxy_to(raw, tmp_path, read_timeout=0.5) as p:
        r = chat(p)
        assert r.status_code == 504, r.text
        assert raw.connections == 1


@pytest.mark.parametrize("sent", [b"H", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 200 OK\r\ncontent-type: appl"])
def test_a_connection_dropped_after_part_of_an_answer_is_not_retried(tmp_path, sent):
    """Once the provider started answering it has the request: sending it again could run it twice."""
    def partial(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(sent)
        time.sleep(0.1)
        reset(conn)

    with RawUpstream(partial) as raw, proxy_to(raw, tmp_path) as p:
        r = chat(p)
        assert r.status_code == 502, r.text
        assert raw.connections == 1
