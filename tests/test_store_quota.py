"""Each tenant's stored text has a byte quota: past it, that tenant's oldest is evicted, nothing else changes."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import httpx
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings

from proxy.engine.routing import tenant_id
from proxy.store import open_store
from proxy.store.archive import Archive

HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
SALT = "ctxproxy-tenant-v1"
LINES = 400
TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]


def tool_log(tag: str) -> str:
    return "\n".join(f"{tag} line {i:04d}: worker processed item {i * 7919 % 100003:06d} ok" for i in range(LINES))


ONE = len(tool_log("a-0").encode())  # every log is this many bytes
QUOTA = ONE * 3 + ONE // 2  # room for three


def body(tag: str) -> bytes:
    return orjson.dumps({"model": "m", "tools": TOOLS, "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": f"Read the log ({tag})."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": tool_log(tag)}]})


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> str:
    return f"sqlite:///{tmp_path}/quota.db" if request.param == "sqlite" else "redis://127.0.0.1:6379/14"


def offload(p: InProcessProxy, upstream, key: str, tag: str) -> tuple[str, bytes]:
    """Send one request whose tool result is offloaded; its handle and the bytes that went upstream."""
    r = p.post("/v1/chat/completions", content=body(tag), timeout=30,
                   headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    assert r.status_code == 200 and r.headers.get("x-ctxproxy-offloaded") == "1", (r.status_code, r.text[:200])
    sent = upstream.requests[-1].body
    return HANDLE.search(json.loads(sent)["messages"][3]["content"]).group(1), sent


def blob(p: InProcessProxy, key: str, handle: str) -> httpx.Response:
    return p.get(f"/ctx/v1/blobs/{handle}", headers={"authorization": f"Bearer {key}"}, timeout=10)


def stored_bytes(store_url: str, key: str) -> int:
    async def read() -> int:
        store = open_store(store_url)
        try:
            return await Archive(store, tenant_id(key, SALT)).stored_bytes()
        finally:
            await store.close()
    return asyncio.run(read())


def test_tenant_over_its_quota_loses_its_oldest_stored_text_first(upstream, store_url):
    a, b = f"sk-a-{uuid.uuid4()}", f"sk-b-{uuid.uuid4()}"  # fresh tenants: nothing stored before
    settings = make_settings(upstream.base_url, store_url, store_quota_bytes=QUOTA,
                             # no status bar: its clock lines would make the re-sent request differ by the second
                             defaults={"offload": {"tool_result_tokens": 300}, "status_bar": {"enabled": False}})
    with InProcessProxy(settings) as p:
        theirs = [offload(p, upstream, b, f"b-{i}")[0] for i in range(2)]
        ours = [offload(p, upstream, a, f"a-{i}") for i in range(6)]
        assert stored_bytes(store_url, a) <= QUOTA

        for handle, _ in ours[:3]:  # the oldest: evicted, and answered cleanly
            gone = blob(p, a, handle)
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "handle_not_found"
        for i, (handle, _) in enumerate(ours[3:], start=3):
            kept = blob(p, a, handle)
            assert kept.status_code == 200 and kept.text == tool_log(f"a-{i}")
        for i, handle in enumerate(theirs):  # another tenant's text is untouched
            assert blob(p, b, handle).text == tool_log(f"b-{i}")
        assert stored_bytes(store_url, b) == 2 * ONE

        # A placeholder already sent keeps its bytes: the evicted request is rewritten as before.
        upstream.reset()
        assert offload(p, upstream, a, "a-0") == ours[0]
        # The model asking for evicted text gets "no stored content", not an error.
        upstream.reset()
        upstream.script({"tool_calls": [{"name": "context_read", "arguments": {"handle": ours[1][0]}}]}, "done")
        r = p.post("/v1/chat/completions", content=body("a-1"), timeout=30,
                       headers={"authorization": f"Bearer {a}", "content-type": "application/json"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "done"
        answer = json.loads(upstream.requests[-1].body)["messages"][-1]["content"]
        assert answer.startswith("error: no stored content")
        assert stored_bytes(store_url, a) <= QUOTA


def test_zero_quota_means_unlimited(upstream, tmp_path):
    url = f"sqlite:///{tmp_path}/unlimited.db"
    key = f"sk-{uuid.uuid4()}"
    settings = make_settings(upstream.base_url, url, store_quota_bytes=0,
                             defaults={"offload": {"tool_result_tokens": 300}})
    with InProcessProxy(settings) as p:
        handles = [offload(p, upstream, key, f"u-{i}")[0] for i in range(6)]
        assert all(blob(p, key, h).status_code == 200 for h in handles)
