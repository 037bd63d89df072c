"""Bad input gets an OpenAI-shaped 4xx; a dead or slow provider gets a clean 502/504; the proxy keeps serving."""

from __future__ import annotations

import httpx
import openai
import pytest
from proxy_server import InProcessProxy, make_settings

from proxy.store import open_store

AUTH = {"authorization": "Bearer sk-test"}


pytestmark = pytest.mark.proxy_config(server={"max_body_bytes": 4096})


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    if code:
        assert err["code"] == code
    return err


@pytest.mark.parametrize("body,param", [
    (b'{"model": "m", "messages": [', None),
    (b"\xff\xfe not utf-8", None),
    (b"[1, 2, 3]", None),
    (b'{"model": "m"}', "messages"),
    (b'{"model": "m", "messages": "hello"}', "messages"),
    (b'{"model": 7, "messages": []}', "model"),
    (b'{"model": "m", "messages": [42]}', "messages[0]"),
    (b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}', "messages[0].role"),
    (b'{"model": "m", "messages": [{"role": "user", "content": {"a": 1}}]}', "messages[0].content"),
    (b'{"model": "m", "messages": [], "stream": "yes"}', "stream"),
    (b'{"model": "m", "messages": [], "tools": {}}', "tools"),
])
def test_malformed_chat_bodies_get_400_and_nothing_reaches_provider(proxy, upstream, body, param):
    r = proxy.post("/v1/chat/completions", content=body, headers=AUTH)
    err = assert_openai_error(r, 400)
    assert err["type"] == "invalid_request_error"
    if param:
        assert err["param"] == param
    assert upstream.requests == []
    assert proxy.get("/healthz").status_code == 200


def test_oversized_body_gets_413_declared_or_streamed(proxy, upstream):
    big = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}'
    assert_openai_error(proxy.post("/v1/chat/completions", content=big, headers=AUTH),
                        413, "request_too_large")
    chunked = proxy.post("/v1/chat/completions", content=iter([big[:2000], big[2000:]]), headers=AUTH)
    assert_openai_error(chunked, 413, "request_too_large")
    assert_openai_error(proxy.post("/v1/embeddings", content=big, headers=AUTH), 413)
    assert upstream.requests == []


async def test_rejected_requests_store_nothing(proxy, upstream, tmp_path):
    for body in (b"{", b'{"messages": 1}', b"x" * 5000):
        proxy.post("/v1/chat/completions", content=body, headers=AUTH)
    store = open_store(f"sqlite:///{tmp_path}/ctx.db")
    try:
        assert await store.keys("") == []
    finally:
        await store.close()


def test_unknown_endpoint_and_method_are_openai_shaped(proxy):
    assert_openai_error(proxy.get("/nope"), 404, "not_found")
    assert_openai_error(proxy.post("/healthz"), 405, "method_not_allowed")


def test_unreachable_upstream_is_502(upstream, tmp_path):
    settings = make_settings("http://127.0.0.1:1/v1", f"sqlite:///{tmp_path}/ctx.db")
    with InProcessProxy(settings) as p:
        client = p.openai("/v1", api_key="sk-test", max_retries=0)
        with pytest.raises(openai.APIStatusError) as exc:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert exc.value.status_code == 502
        assert exc.value.body["code"] == "upstream_unreachable"
        assert "127.0.0.1:1" in exc.value.body["message"]
        assert_openai_error(p.get("/v1/models"), 502, "upstream_unreachable")


def test_slow_upstream_is_504_and_stream_stall_ends_cleanly(upstream, tmp_path):
    settings = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db", upstream={"read_timeout": 0.3})
    with InProcessProxy(settings) as p:
        upstream.delay = 1.0
        r = p.post("/v1/chat/completions", headers=AUTH,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
        assert_openai_error(r, 504, "upstream_timeout")
        # A stream that starts, then stalls past the read timeout, ends with an SSE error event.
        upstream.delay, upstream.chunk_delay = 0.0, 1.0
        upstream.script("a b c d")
        client = p.openai("/v1", api_key="sk-test", max_retries=0, timeout=10)
        with pytest.raises(openai.APIError) as exc:
            for _ in client.chat.completions.create(model="m", stream=True,
                                                    messages=[{"role": "user", "content": "hi"}]):
                pass
        assert "timed out" in str(exc.value.message)
        upstream.chunk_delay = 0.0
        ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])
        assert ok.choices[0].message.content == "ok"
