"""What a client sees when something breaks: provider errors, dropped sockets, truncated bodies, a dead store, SIGTERM.

Each test is one fault, named for what the user sees. Misbehaving providers that
the mock cannot imitate (a socket closed mid-response, a short body) are a few
lines of raw TCP on 127.0.0.1 (`RawUpstream`). Everything is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings
from silent_server import SilentServer

import proxy.store.guarded as guarded
from proxy.accounting.counters import timeline_key
from proxy.engine.routing import tenant_id
from proxy.store import open_store

KEY = "sk-faults"
AUTH = {"authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "hi"}]


# A request that waited on the dead store (the Redis client's own 5-10 s stalls) fails as a ReadTimeout:
# the client's timeout bounds the answer, in process as over a socket. A store call costs at most
# store_timeout (0.5 s), so the bound is generous and no clock is read.
STALL_BOUND_S = 4.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    if code:
        assert err["code"] == code, err
    return err


def chat(p: Any, body: dict[str, Any], headers: dict[str, str] | None = None, timeout: float = 10) -> httpx.Response:
    return p.post("/v1/chat/completions", json=body, headers={**AUTH, **(headers or {})}, timeout=timeout)


# --------------------------------------------------------------------------- a provider that misbehaves on purpose

def read_request(conn: socket.socket) -> bytes:
    """One HTTP/1.1 request (headers + Content-Length body), bounded in size and by the socket timeout."""
    data = b""
    while b"\r\n\r\n" not in data and len(data) < 1 << 20:
        got = conn.recv(65536)
        if not got:
            return data
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    want = int(m.group(1)) if m else 0
    while len(body) < want and len(body) < 64 << 20:
        got = conn.recv(65536)
        if not got:
            break
        body += got
    return head + b"\r\n\r\n" + body


def reset(conn: socket.socket) -> None:
    """Close with an RST instead of a FIN."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class RawUpstream:
    """Bare TCP on 127.0.0.1: every connection is handed to `behave(conn)`, then closed."""

    def __init__(self, behave: Callable[[socket.socket], None]) -> None:
        self.behave = behave
        self.connections = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(32)
        self._sock.settimeout(0.05)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"raw-upstream-{self.port}", daemon=True)

    def _serve(self) -> None:
        deadline = time.monotonic() + 120  # never outlives a test run by much
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            self.behave(conn)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def __enter__(self) -> RawUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept at once (Linux), not at its next poll
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._sock.close()


def close_at_once(conn: socket.socket) -> None:
    pass  # accept, then close without reading a byte


def read_then_close(conn: socket.socket) -> None:
    read_request(conn)


def read_then_reset(conn: socket.socket) -> None:
    read_request(conn)
    reset(conn)


SSE_CHUNK = (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
             b'[{"index":0,"delta":{"content":"%s"},"finish_reason":null}]}\n\n')


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse_two_chunks_then_close(conn: socket.socket) -> None:
    read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for word in (b"Hello", b" world"):
        conn.sendall(_chunked(SSE_CHUNK % word))
        time.sleep(0.05)
    reset(conn)  # no terminating 0-chunk, no [DONE]


def sse_two_chunks_then_eof(conn: socket.socket) -> None:
    """Same, but the body is delimited by the connection close (no chunked framing): EOF looks "clean"."""
    read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
    for word in (b"Hello", b" world"):
        conn.sendall(SSE_CHUNK % word)
        time.sleep(0.05)
    conn.shutdown(socket.SHUT_WR)


def truncated_json(conn: socket.socket) -> None:
    read_request(conn)
    part = b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assist'
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n" + part)
    time.sleep(0.05)
    conn.close()


@pytest.fixture
def faulty(upstream, tmp_path) -> Iterator[Callable[[Callable[[socket.socket], None]], InProcessProxy]]:
    """`faulty(behave)` → a proxy whose route `broken` goes to a RawUpstream; `default` goes to the mock."""
    stack = contextlib.ExitStack()

    def make(behave: Callable[[socket.socket], None], **raw: Any) -> InProcessProxy:
        raw_up = stack.enter_context(RawUpstream(behave))
        settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db",
                                 routes=[{"name": "broken", "upstream": {"base_url": raw_up.base_url,
                                                                          "read_timeout": 30}}], **raw)
        p = stack.enter_context(InProcessProxy(settings))
        p.raw = raw_up  # type: ignore[attr-defined]
        return p

    with stack:
        yield make


def keeps_serving(p: InProcessProxy, upstream) -> None:
    assert p.get("/healthz", timeout=5).status_code == 200
    upstream.script("still here")
    r = chat(p, {"model": "m", "messages": HI})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "still here"


# --------------------------------------------------------------------------- provider errors

@pytest.mark.parametrize("status", [500, 503])
@pytest.mark.parametrize("stream", [False, True])
def test_provider_5xx_reaches_the_client_unchanged(upstream, tmp_path, status, stream):
    body = {"error": {"message": f"The server had an error ({status})", "type": "server_error",
                      "param": None, "code": None}}
    raw = json.dumps(body).encode()
    with InProcessProxy(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db")) as p:
        upstream.fail_next(status, raw, {"x-upstream-marker": "m1"})
        r = chat(p, {"model": "m", "messages": HI, "stream": stream})
        assert r.status_code == status
        assert r.content == raw
        assert r.headers["x-upstream-marker"] == "m1"
        # The SDK sees the provider's own error, not a proxy-made one.
        upstream.fail_next(status, raw)
        sdk = p.openai("/v1", api_key=KEY, max_retries=0, timeout=10)
        with pytest.raises(openai.APIStatusError) as exc:
            out = sdk.chat.completions.create(model="m", messages=HI, stream=stream)
            if stream:
                list(out)
        assert exc.value.status_code == status and exc.value.body["message"] == body["error"]["message"]
        keeps_serving(p, upstream)


# --------------------------------------------------------------------------- dropped connections

@pytest.mark.parametrize("behave", [close_at_once, read_then_close, read_then_reset])
@pytest.mark.parametrize("stream", [False, True])
def test_provider_dropping_the_connection_is_a_clean_502(faulty, upstream, behave, stream):
    p = faulty(behave)
    for _ in range(3):  # not just the first time: pooled connections must not poison later requests
        r = chat(p, {"model": "m", "messages": HI, "stream": stream}, {"x-ctx-route": "broken"})
        # answered within the client timeout (10 s), not after the read timeout (30 s)
        err = assert_openai_error(r, 502, "upstream_unreachable")
        assert err["type"] == "upstream_error" and f"127.0.0.1:{p.raw.port}" in err["message"]
    # Passthrough endpoints too.
    assert_openai_error(p.get("/r/broken/v1/models", headers=AUTH, timeout=10), 502, "upstream_unreachable")
    keeps_serving(p, upstream)


def _sse_data(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def test_stream_cut_mid_way_ends_with_an_sse_error_event(faulty, upstream):
    p = faulty(sse_two_chunks_then_close)
    with p.stream("POST", "/r/broken/v1/chat/completions", headers=AUTH, timeout=10,
                      json={"model": "m", "messages": HI, "stream": True}) as r:
        assert r.status_code == 200
        text = r.read().decode()
    # answered within the client timeout (10 s), not after the read timeout (30 s)
    events = _sse_data(text)
    assert [e["choices"][0]["delta"]["content"] for e in events[:2]] == ["Hello", " world"]
    assert "[DONE]" not in events
    last = events[-1]
    assert isinstance(last, dict) and set(last["error"]) >= {"message", "type", "code"}
    assert last["error"]["code"] == "upstream_unreachable"
    # With the SDK: the two chunks arrive, then an APIError.
    sdk = p.openai("/r/broken/v1", api_key=KEY, max_retries=0, timeout=10)
    got = []
    with pytest.raises(openai.APIError):
        for chunk in sdk.chat.completions.create(model="m", messages=HI, stream=True):
            got.append(chunk.choices[0].delta.content)
    assert got == ["Hello", " world"]
    keeps_serving(p, upstream)


def test_stream_ending_without_done_is_reported_to_the_client(faulty, upstream):
    p = faulty(sse_two_chunks_then_eof)
    with p.stream("POST", "/r/broken/v1/chat/completions", headers=AUTH, timeout=10,
                      json={"model": "m", "messages": HI, "stream": True}) as r:
        text = r.read().decode()
    events = _sse_data(text)
    assert [e["choices"][0]["delta"]["content"] for e in events[:2]] == ["Hello", " world"]
    assert isinstance(events[-1], dict) and "error" in events[-1], text


def test_truncated_provider_body_is_a_502_not_a_hang(faulty, upstream):
    p = faulty(truncated_json)
    for stream in (False, True):  # the client's stream flag does not matter: the provider sent JSON
        r = chat(p, {"model": "m", "messages": HI, "stream": stream}, {"x-ctx-route": "broken"})
        # answered within the client timeout (10 s), not after the read timeout (30 s)
        assert_openai_error(r, 502, "upstream_unreachable")
    keeps_serving(p, upstream)


# --------------------------------------------------------------------------- nothing half-written

def _store_call(url: str, fn: Callable[[Any], Any]) -> Any:
    async def go() -> Any:
        store = open_store(url)
        try:
            return await fn(store)
        finally:
            await store.close()
    return asyncio.run(go())


def _timeline(url: str, session: str) -> list[dict]:
    async def read(store: Any) -> list[dict]:
        return [orjson.loads(x) for x in await store.read_log(timeline_key(tenant_id(KEY, "ctxproxy-tenant-v1"),
                                                                           session))]
    return _store_call(url, read)


def _wait_for(fn: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def big_tool_history(tag: str, lines: int = 400) -> list[dict]:
    text = "\n".join(f"{tag} line {i}: worker processed item {i * 7919 % 100003} ok" for i in range(lines))
    return [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Read the log ({tag})."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat log"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": text}]


OFFLOAD = {"offload": {"tool_result_tokens": 300}}


def test_request_rejected_after_parsing_writes_nothing(upstream, tmp_path):
    """Extends test_rejected_requests_store_nothing: valid JSON that would be offloaded, rejected for other reasons."""
    url = f"sqlite:///{tmp_path}/ctx.db"
    with InProcessProxy(make_settings(upstream.base_url, url, defaults=OFFLOAD)) as p:
        msgs = big_tool_history("rejected")
        assert chat(p, {"model": "m", "messages": msgs, "stream": "yes"}).status_code == 400
        assert chat(p, {"model": "m", "messages": msgs}, {"x-session-id": "x" * 500}).status_code == 400
        assert chat(p, {"model": "m", "messages": msgs}, {"x-ctx-route": "nope"}).status_code == 404
        assert chat(p, {"model": "m", "messages": msgs + [{"role": "wizard"}]}).status_code == 400
        p.settle()  # let any (wrong) background write land before looking
    assert upstream.requests == []

    async def everything(store: Any) -> tuple[list[str], dict]:
        return await store.keys(""), await store.counters("")
    keys, counters = _store_call(url, everything)
    # nothing half-stored: no text, no decision; only the refusals themselves are counted (the one whose
    # session was known by then in that session's records)
    assert all(re.fullmatch(r"t:\w+:session:s-\w+(:first)?", k) for k in keys), keys
    assert counters and all(k.endswith(("|requests", "|errors")) or k.startswith("sessions:") for k in counters)
    assert sum(v for k, v in counters.items() if k.endswith("|all|errors")) == 4


def test_provider_failure_after_the_pipeline_is_recorded_as_that_failure(faulty, upstream, tmp_path):
    p = faulty(truncated_json, defaults=OFFLOAD)
    url = f"sqlite:///{tmp_path}/ctx.db"
    session = "sess-truncated"
    r = chat(p, {"model": "m", "messages": big_tool_history("t1")},
             {"x-ctx-route": "broken", "x-session-id": session})
    assert_openai_error(r, 502, "upstream_unreachable")
    timeline = _wait_for(lambda: _timeline(url, session))
    assert len(timeline) == 1, timeline
    entry = timeline[0]
    assert entry["status"] == 502 and entry["error"] == "upstream_unreachable"
    assert entry["prompt"] is None and entry["completion"] is None  # no usage invented
    assert entry["offloaded"] == 1  # the pipeline did run
    # The metrics say the same.
    metrics = p.get("/metrics", timeout=5).text
    assert re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="502"\} 1\.0', metrics), metrics
    assert not re.search(r'ctxproxy_requests_total\{[^}]*route="broken"[^}]*status="200"\}', metrics)

    # A provider that cannot be reached at all: whatever is stored must not claim success.
    with InProcessProxy(make_settings("http://127.0.0.1:1/v1", url, defaults=OFFLOAD)) as dead:
        r = chat(dead, {"model": "m", "messages": big_tool_history("t2")}, {"x-session-id": "sess-gone"})
        assert_openai_error(r, 502, "upstream_unreachable")
        dead.settle()  # its accounting written
        assert all(e["status"] == 502 for e in _timeline(url, "sess-gone"))
        assert 'status="200"' not in dead.get("/metrics", timeout=5).text


def test_unreachable_provider_is_counted_as_a_failed_request(tmp_path):
    url = f"sqlite:///{tmp_path}/ctx.db"
    with InProcessProxy(make_settings("http://127.0.0.1:1/v1", url)) as dead:
        r = chat(dead, {"model": "m", "messages": HI}, {"x-session-id": "sess-down"})
        assert_openai_error(r, 502, "upstream_unreachable")
        metrics = dead.get("/metrics", timeout=5).text
        timeline = _wait_for(lambda: _timeline(url, "sess-down"), timeout=1.0)
    assert re.search(r'ctxproxy_requests_total\{[^}]*status="502"\} 1\.0', metrics), metrics
    assert [e["status"] for e in timeline] == [502]


# --------------------------------------------------------------------------- the store goes away and comes back

class RedisProcess:
    def __init__(self, port: int, workdir: Path) -> None:
        self.port, self.workdir = port, workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not on PATH; this test needs the binary to kill and restart a store")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited with {self.proc.returncode} on port {self.port}")
            time.sleep(0.05)
        pytest.fail("redis-server did not answer PING within 10 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"(?m)^{name}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text))


def test_store_outage_forwards_unmodified_fast_and_recovers(upstream, tmp_path, monkeypatch):
    monkeypatch.setattr(guarded, "MAX_BACKOFF_S", 1.0)  # a probe at least every second: recovery shows quickly
    redis = RedisProcess(free_port(), tmp_path)
    redis.start()
    try:
        settings = make_settings(upstream.base_url, f"redis://127.0.0.1:{redis.port}/0", defaults=OFFLOAD)
        with InProcessProxy(settings) as p, p.http_client(headers=AUTH, timeout=10) as c:
            n = iter(range(1000))

            def ask() -> tuple[httpx.Response, bytes]:
                # new text: needs the store
                raw = orjson.dumps({"model": "m", "messages": big_tool_history(f"run{next(n)}")})
                r = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"},
                           timeout=STALL_BOUND_S)
                return r, raw

            r, raw = ask()
            assert r.status_code == 200 and r.headers.get("x-ctxproxy-offloaded") == "1"
            assert "x-ctxproxy-degraded" not in r.headers and upstream.requests[-1].body != raw
            assert c.get("/readyz").status_code == 200

            redis.kill()
            for _ in range(5):
                r, raw = ask()
                assert r.status_code == 200, r.text
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert "x-ctxproxy-offloaded" not in r.headers
                assert upstream.requests[-1].body == raw  # the client's request, byte for byte
            ready = c.get("/readyz", timeout=STALL_BOUND_S)
            assert ready.status_code == 503 and ready.json()["store"] is False
            assert _metric(c.get("/metrics").text, "ctxproxy_degraded_requests_total") >= 5

            redis.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.2)
                r, raw = ask()
                assert r.status_code == 200
                if "x-ctxproxy-degraded" not in r.headers:
                    break
            assert "x-ctxproxy-degraded" not in r.headers, "still degraded 10 s after the store came back"
            assert r.headers.get("x-ctxproxy-offloaded") == "1" and upstream.requests[-1].body != raw
            assert c.get("/readyz").status_code == 200
    finally:
        redis.kill()


def test_store_that_accepts_connections_but_never_answers_costs_milliseconds(upstream, monkeypatch):
    """Redis behind a relay that swallows every command: no 5-10 s stalls, every request says it is degraded."""
    monkeypatch.setattr(guarded, "BACKOFF_S", 0.25)  # backoffs of 0.25, 0.5 and 1 s (0.5 s up to 10 s in a server):
    monkeypatch.setattr(guarded, "MAX_BACKOFF_S", 1.0)  # the 12 requests below still span several of them
    with SilentServer() as silent:
        settings = make_settings(upstream.base_url, silent.url, defaults=OFFLOAD)
        with InProcessProxy(settings) as p, p.http_client(headers=AUTH, timeout=30) as c:

            def ask(body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
                raw = orjson.dumps(body)
                r = c.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"},
                           timeout=STALL_BOUND_S)
                return r, raw

            for i in range(12):  # plain chat, spread over several backoffs: some of them carry the probe
                r, raw = ask({"model": "m", "messages": [{"role": "user", "content": f"question {i}"}]})
                assert r.status_code == 200, r.text
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert upstream.requests[-1].body == raw
                time.sleep(0.1)

            store = p.state.store
            deadline = time.monotonic() + 30
            while store.degraded:  # the backoff runs out: the next calls race for the one probe
                assert time.monotonic() < deadline, "the store's backoff never ran out"
                time.sleep(0.02)
            bodies = [{"model": "m", "messages": big_tool_history(f"burst{i}")} for i in range(8)]
            with ThreadPoolExecutor(len(bodies)) as pool:
                burst = list(pool.map(ask, bodies))
            for r, _raw in burst:
                assert r.status_code == 200 and r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert "x-ctxproxy-offloaded" not in r.headers
            assert {raw for _, raw in burst} == {req.body for req in upstream.requests[-len(bodies):]}

            ready = c.get("/readyz", timeout=STALL_BOUND_S)
            assert ready.status_code == 503 and ready.json()["store"] is False
            assert _metric(c.get("/metrics").text, "ctxproxy_degraded_requests_total") >= 20


# --------------------------------------------------------------------------- SIGTERM drains in-flight streams

def test_sigterm_lets_an_in_flight_stream_finish(tmp_path, upstream):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env.update(CTXPROXY_UPSTREAM=upstream.base_url, CTXPROXY_STORE=f"sqlite:///{tmp_path}/x.db")
    log = tmp_path / "proxy.log"
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "ctxproxy serve did not become healthy"
            time.sleep(0.05)

        words = "one two three four five six"
        upstream.script(words)
        upstream.chunk_delay = 0.1  # the SIGTERM lands after the first chunk: the rest is still in flight
        events: list[Any] = []
        signalled = False
        with httpx.stream("POST", url + "/v1/chat/completions", headers=AUTH, timeout=10,
                          json={"model": "m", "messages": HI, "stream": True}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
                if not signalled:
                    proc.send_signal(signal.SIGTERM)
                    signalled = True
        assert signalled
        text = "".join(e["choices"][0]["delta"].get("content") or ""
                       for e in events if isinstance(e, dict) and e["choices"])
        assert text.split() == words.split() and events[-1] == "[DONE]"
        assert not any(isinstance(e, dict) and "error" in e for e in events)
        try:
            code = proc.wait(timeout=30)  # the CLI's graceful-shutdown timeout
        except subprocess.TimeoutExpired:
            pytest.fail(f"ctxproxy serve still running 30 s after SIGTERM, its stream done: {log.read_text()}")
        assert code in (0, -signal.SIGTERM), log.read_text()
        assert "shutdown complete" in log.read_text().lower()
        # New connections are refused once it has gone.
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/healthz", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
