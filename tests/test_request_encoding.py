"""Compressed request bodies: decoded as they stream in, held to max_body_bytes decoded, sent on uncompressed.

Codex CLI sends its bodies zstd-compressed; any client may gzip its own. The
SDKs here compress through a transport that does what Codex does (the body
compressed, `Content-Encoding` saying how); the provider is the tests' mock,
which records exactly what it received.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import re
import tracemalloc
import zlib
from collections.abc import Iterator
from typing import Any

import brotli
import httpx
import httpx2
import orjson
import pytest
from backports import zstd
from starlette.requests import Request

from proxy.config import ServerSettings
from proxy.http.content_coding import PIECE, decoder_for
from proxy.http.relay import read_body

KEY = "sk-compressed"
HANDLE = re.compile(r'context_read\(handle=\\?"(ctx_[0-9a-f]+)')
CODINGS = ["zstd", "gzip", "deflate", "br", "gzip, br"]
MiB = 1 << 20

pytestmark = pytest.mark.proxy_config(defaults={"offload": {"tool_result_tokens": 2000}})


def compress(coding: str, raw: bytes) -> bytes:
    """`raw` with each coding of the header applied in turn (`gzip, br`: gzip first)."""
    encode = {"zstd": zstd.compress, "gzip": gzip.compress, "deflate": zlib.compress,
              "br": lambda b: brotli.compress(b, quality=5)}
    for c in coding.split(","):
        raw = encode[c.strip()](raw)
    return raw


class Compressing:
    """A client transport that sends every request body compressed, as Codex does with its zstd flag on."""

    def __init__(self, inner: Any, coding: str, lib: Any = httpx) -> None:
        self._inner, self._coding, self._lib = inner, coding, lib
        self.sent: list[bytes] = []  # the bodies before compression

    def handle_request(self, request: Any) -> Any:
        body = request.read()
        if body:
            self.sent.append(body)
            headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"content-length"]
            request = self._lib.Request(request.method, request.url, extensions=request.extensions,
                                        headers=[*headers, (b"content-encoding", self._coding.encode())],
                                        content=compress(self._coding, body))
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def big_log(lines: int = 3000) -> str:
    return "\n".join(f"2026-11-29T12:{i % 60:02d}:00 worker[{i}] processed item {i * 7919 % 100003} ok"
                     for i in range(lines))


def assert_decoded_and_sent_plain(upstream, original: bytes | None = None) -> dict:
    """The provider got JSON with no Content-Encoding, its length right; byte for byte the client's, if given."""
    rec = upstream.requests[-1]
    assert "content-encoding" not in rec.headers, rec.headers
    assert int(rec.headers["content-length"]) == len(rec.body) and isinstance(rec.json, dict)
    if original is not None:
        assert rec.body == original
    return rec.json


# ---- each coding on each API, through the official SDKs

@pytest.fixture
def compressing(proxy) -> Iterator[Any]:
    """`compressing(coding, lib=httpx)` → (its Compressing transport, a client of `lib` on it, closed after)."""
    clients: list[Any] = []

    def make(coding: str, lib: Any = httpx) -> tuple[Compressing, Any]:
        t = Compressing(proxy.sync_transport(lib), coding, lib)
        clients.append(lib.Client(transport=t, base_url=proxy.url, timeout=30))
        return t, clients[-1]

    yield make
    for c in clients:
        c.close()


def _chat(proxy, compressing, coding: str, prefix: str) -> tuple[Compressing, Any]:
    t, http = compressing(coding)
    c = proxy.openai(prefix, api_key=KEY, http_client=http)
    return t, c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Say hi."}])


def _responses(proxy, compressing, coding: str, prefix: str) -> tuple[Compressing, Any]:
    t, http = compressing(coding)
    c = proxy.openai(prefix, api_key=KEY, http_client=http)
    return t, c.responses.create(model="gpt-5", input="Say hi.", store=False)


def _messages(proxy, compressing, coding: str, prefix: str) -> tuple[Compressing, Any]:
    t, http = compressing(coding, httpx2)
    c = proxy.anthropic(prefix.removesuffix("/v1"), api_key=KEY, http_client=http)
    return t, c.messages.create(model="claude-sonnet-4-6", max_tokens=64, messages=[{"role": "user", "content": "Hi"}])


APIS = {"chat": _chat, "responses": _responses, "messages": _messages}


@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize("api", APIS)
def test_each_coding_reaches_the_provider_as_the_json_the_client_sent(proxy, upstream, compressing, api, coding):
    transport, answer = APIS[api](proxy, compressing, coding, "/v1")
    assert answer.id
    assert upstream.requests[-1].path == {"chat": "/v1/chat/completions", "responses": "/v1/responses",
                                          "messages": "/v1/messages"}[api]
    assert_decoded_and_sent_plain(upstream, transport.sent[-1])


@pytest.mark.parametrize("api", APIS)
def test_the_route_prefix_decodes_too(proxy, upstream, compressing, api):
    transport, answer = APIS[api](proxy, compressing, "zstd", "/r/default/v1")
    assert answer.id
    assert_decoded_and_sent_plain(upstream, transport.sent[-1])


def test_count_tokens_decodes_too(proxy, upstream, compressing):
    for prefix in ("", "/r/default"):
        t, http = compressing("zstd", httpx2)
        c = proxy.anthropic(prefix, api_key=KEY, http_client=http)
        count = c.messages.count_tokens(model="claude-sonnet-4-6", messages=[{"role": "user", "content": "Hi"}])
        assert count.input_tokens > 0 and upstream.requests[-1].path == "/v1/messages/count_tokens"
        assert_decoded_and_sent_plain(upstream, t.sent[-1])


# ---- the proxy still rewrites a compressed body

def _offload_bodies(output: str) -> dict[str, tuple[str, dict, dict[str, str]]]:
    call = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat app.log"}'}}
    chat = {"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Find the failing item."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output}]}
    responses = {"model": "gpt-5", "store": False, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Find the bad item."}]},
        {"type": "function_call", "name": "shell", "arguments": '{"command":"cat app.log"}', "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": output}]}
    messages = {"model": "claude-sonnet-4-6", "max_tokens": 256, "messages": [
        {"role": "user", "content": "Find the bad item in app.log."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "Bash",
                                           "input": {"command": "cat app.log"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": output}]}]}
    bearer = {"authorization": f"Bearer {KEY}"}
    return {"chat": ("/v1/chat/completions", chat, bearer), "responses": ("/v1/responses", responses, bearer),
            "messages": ("/v1/messages", messages, {"x-api-key": KEY, "anthropic-version": "2023-06-01"})}


@pytest.mark.parametrize("api", APIS)
def test_a_compressed_body_is_offloaded_like_a_plain_one(proxy, upstream, api):
    text = big_log()
    path, body, headers = _offload_bodies(text)[api]
    r = proxy.post(path, content=compress("zstd", orjson.dumps(body)),
                   headers={**headers, "content-type": "application/json", "content-encoding": "zstd"})
    assert r.status_code == 200, r.text
    assert r.headers["x-ctxproxy-offloaded-new"] == "1"
    sent = json.dumps(assert_decoded_and_sent_plain(upstream))
    assert HANDLE.search(sent) and text not in sent and len(sent) < len(text) / 5


# ---- refusals

def test_an_unknown_coding_is_415_in_the_apis_own_shape(proxy, upstream):
    path, body, headers = _offload_bodies("ok")["responses"]
    r = proxy.post(path, content=orjson.dumps(body), headers={**headers, "content-encoding": "compress"})
    assert r.status_code == 415, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "unsupported_content_encoding"
    assert "'compress'" in err["message"] and "zstd, gzip, deflate, br" in err["message"]
    path, body, headers = _offload_bodies("ok")["messages"]
    r = proxy.post(path, content=orjson.dumps(body), headers={**headers, "content-encoding": "gzip, lz4"})
    assert r.status_code == 415, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert "'lz4'" in r.json()["error"]["message"]
    assert upstream.requests == []
    r = proxy.post(path, content=orjson.dumps(body), headers={**headers, "content-encoding": "identity"})
    assert r.status_code == 200, r.text  # identity is no coding at all


@functools.cache
def _zstd_bomb(gigabytes: int = 1) -> bytes:
    """zstd of `gigabytes` GB of zeros, compressed a megabyte at a time: about 32 KB per GB."""
    comp, zeros = zstd.ZstdCompressor(), bytes(MiB)
    return b"".join(comp.compress(zeros) for _ in range(1024 * gigabytes)) + comp.flush()


def test_a_zstd_bomb_is_413_and_the_proxy_never_holds_more_than_the_limit(make_proxy, upstream):
    bomb = _zstd_bomb()
    assert len(bomb) < 64 * 1024
    limit = 2 * MiB
    proxy = make_proxy(server={"max_body_bytes": limit})
    proxy.get("/healthz")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        r = proxy.post("/v1/chat/completions", content=bomb,
                       headers={"authorization": f"Bearer {KEY}", "content-encoding": "zstd"})
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large" and "once decoded" in r.json()["error"]["message"]
    assert peak < 3 * limit, f"{peak:,} bytes allocated at the peak while refusing a 1 GB bomb"
    assert upstream.requests == []


@pytest.mark.parametrize("coding", CODINGS)
def test_a_decoder_hands_out_small_pieces_whatever_the_ratio(coding):
    """The whole bomb in one chunk still comes out piece by piece: the reader can stop at its limit."""
    bomb = _zstd_bomb() if coding == "zstd" else compress(coding, bytes(16 * MiB))
    pieces = decoder_for(coding).feed(bomb)
    taken = [next(pieces) for _ in range(32)]  # 2 MiB of it; the rest is never decompressed
    assert all(0 < len(p) <= 2 * PIECE for p in taken) and not any(any(p) for p in taken)


def test_corrupt_or_truncated_gzip_is_400(proxy, upstream):
    path, body, headers = _offload_bodies("ok")["chat"]
    raw = gzip.compress(orjson.dumps(body))
    for bad in (raw[:10] + b"\x00garbage" * 8 + raw[10:], raw[:-12], b"not gzip at all"):
        r = proxy.post(path, content=bad, headers={**headers, "content-encoding": "gzip"})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_content_encoding" and "not valid gzip" in err["message"], err
    path, body, headers = _offload_bodies("ok")["messages"]
    r = proxy.post(path, content=b"\x28\xb5\x2f\xfd broken", headers={**headers, "content-encoding": "zstd"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert "not valid zstd" in r.json()["error"]["message"]
    assert upstream.requests == []


def test_gzip_under_the_limit_that_decodes_past_it_is_413(make_proxy, upstream):
    path, body, headers = _offload_bodies(big_log(40_000))["chat"]
    raw = orjson.dumps(body)
    packed = gzip.compress(raw)
    limit = 2 * MiB
    assert len(packed) < limit < len(raw)
    r = make_proxy(server={"max_body_bytes": limit}).post(path, content=packed,
                                                          headers={**headers, "content-encoding": "gzip"})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large" and "once decoded" in r.json()["error"]["message"]
    assert upstream.requests == []
    r = make_proxy(server={"max_body_bytes": 2 * len(raw)}).post(path, content=packed,
                                                                 headers={**headers, "content-encoding": "gzip"})
    assert r.status_code == 200, r.text  # under a limit its decoded size fits, the same bytes go through


def test_a_passthrough_forwards_the_compressed_bytes_with_their_header(proxy, upstream):
    """Only a body the proxy parses is decoded; any other is relayed as sent, encoding and all."""
    raw = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "Say hi."}]})
    packed, headers = gzip.compress(raw), {"authorization": f"Bearer {KEY}"}
    r = proxy.post("/v1/echo", content=packed, headers={**headers, "content-encoding": "gzip"})
    assert r.status_code == 200 and upstream.requests[-1].body == packed
    assert upstream.requests[-1].headers["content-encoding"] == "gzip"
    r = proxy.post("/v1/chat/completions", content=packed, headers={**headers, "content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert_decoded_and_sent_plain(upstream, raw)


# ---- the event loop

def _request(content: bytes, coding: str) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": content, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"",
             "headers": [(b"content-encoding", coding.encode())]}
    return Request(scope, receive)


def test_decoding_a_big_body_gives_the_loop_turns():
    """A 16 MiB body that arrives as one 100 KB chunk is decoded in steps, other tasks running between them."""
    raw = json.dumps({"messages": [{"role": "user", "content": "x" * (16 * MiB)}]}).encode()
    packed = gzip.compress(raw)

    async def run() -> tuple[bytes, int]:
        turns, done = 0, False

        async def other() -> None:
            nonlocal turns
            while not done:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        await asyncio.sleep(0)
        start = turns
        got = await read_body(_request(packed, "gzip"), ServerSettings(max_body_bytes=32 * MiB))
        done = True
        await task
        return got, turns - start

    got, turns = asyncio.run(run())
    assert got == raw
    assert turns >= 15, f"the loop ran other tasks {turns} times while 16 MiB were decoded"


def _chunks(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


@pytest.mark.parametrize("coding", CODINGS)
def test_a_body_decodes_the_same_however_it_is_chunked(coding):
    """Concatenated gzip members and zstd frames are one body; a byte at a time gives the same bytes."""
    raw = big_log(2000).encode()
    packed = compress(coding, raw[:30_000]) + compress(coding, raw[30_000:]) if coding in ("gzip", "zstd") \
        else compress(coding, raw)
    for size in (1, 7, 4096, len(packed)):
        d = decoder_for(coding)
        got = b"".join(p for c in _chunks(packed, size) for p in d.feed(c))
        d.close()
        assert got == raw, (coding, size)
