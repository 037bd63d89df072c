"""Cache accounting: what the provider cached, what could have been, and why a prefix broke."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from agent_runs import TOOLS, conversation
from proxy_server import InProcessProxy, make_settings

pytestmark = pytest.mark.proxy_config(defaults={"status_bar": {"enabled": False}})


def post(p, msgs, key="sk-acct", tools=TOOLS, session=None, **kw) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **({"x-session-id": session} if session else {})}
    r = p.post("/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": "gpt-4o", "messages": msgs, "tools": tools, **kw})
    assert r.status_code == 200, r.text
    return r


def get(p, path, key="sk-acct", **headers) -> dict:
    """No waiting: what a completed response did is visible at once (the proxy writes its pending batch first)."""
    r = p.get(path, headers={"authorization": f"Bearer {key}", **headers} if key else headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_hit_rate_equals_what_the_provider_counted(proxy, upstream):
    full = conversation(12)
    for end in range(4, len(full) + 1, 2):
        post(proxy, full[:end])
    prompt = sum(r.usage["prompt_tokens"] for r in upstream.requests)
    cached = sum(r.usage["prompt_tokens_details"]["cached_tokens"] for r in upstream.requests)
    totals = get(proxy, "/ctx/v1/stats")["totals"]["all"]
    assert totals["prompt"] == prompt and totals["cached"] == cached
    assert abs(totals["hit_rate"] - cached / prompt) < 0.01
    assert totals["requests"] == len(upstream.requests)
    # what was cached of what could have been, both in the provider's units (the mock renders each message with
    # its own markers: its tokens outnumber the proxy's count, and the cacheable prefix is scaled to them)
    assert totals["efficiency"] == round(cached / totals["cacheable_billed"], 4) and 0.9 < totals["efficiency"] <= 1


def test_stream_usage_is_counted_but_not_shown_to_a_client_that_did_not_ask(proxy, upstream):
    client = proxy.openai("/v1", api_key="sk-acct", max_retries=0)
    chunks = list(client.chat.completions.create(model="gpt-4o", stream=True, messages=conversation(2)))
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)
    assert json.loads(upstream.requests[-1].body)["stream_options"] == {"include_usage": True}
    totals = get(proxy, "/ctx/v1/stats")["totals"]["all"]
    assert totals["prompt"] == upstream.requests[-1].usage["prompt_tokens"] > 0
    asked = list(client.chat.completions.create(model="gpt-4o", stream=True, messages=conversation(2),
                                                stream_options={"include_usage": True}))
    assert asked[-1].usage is not None and asked[-1].usage.prompt_tokens > 0


@pytest.mark.parametrize("edit,cause", [
    (lambda m, t: ([{**m[0], "content": m[0]["content"] + " NEW RULE."}] + m[1:], t), "system prompt changed"),
    (lambda m, t: (m, list(reversed(t))), "tools reordered"),
    (lambda m, t: (m, t + [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]),
     "tools added"),
    (lambda m, t: (m[:3] + [{**m[3], "content": "edited"}] + m[4:], t), "earlier message edited by the client"),
    (lambda m, t: (m[:4], t), "history truncated by the client"),
])
def test_break_cause_is_reported_on_that_request(proxy, upstream, edit, cause):
    # A derived session id covers the system prompt, so a client that changes it
    # names its session to keep one timeline.
    tag = uuid.uuid4().hex[:8]
    msgs, run = conversation(8), {"key": f"sk-{tag}", "session": f"run-{tag}"}
    first = post(proxy, msgs, **run)
    assert "x-ctxproxy-cache-break" not in first.headers
    same = post(proxy, msgs, **run)
    assert int(same.headers["x-ctxproxy-cacheable-tokens"]) > 1000 and "x-ctxproxy-cache-break" not in same.headers
    m2, t2 = edit(msgs, TOOLS)
    r = post(proxy, m2, tools=t2, **run)
    assert r.headers["x-ctxproxy-cache-break"] == cause
    session = r.headers["x-ctxproxy-session"]
    timeline = get(proxy, f"/ctx/v1/sessions/{session}", key=run["key"])["requests"]
    assert timeline[-1]["break"] == cause and timeline[-1]["request_id"] == r.headers["x-ctxproxy-request-id"]


def test_cache_expiry_is_told_apart_from_a_broken_prefix(proxy, upstream):
    msgs = conversation(8)
    post(proxy, msgs)
    upstream.cache.clear()  # the provider forgot: the prefix is intact, nothing is cached
    r = post(proxy, msgs)
    timeline = get(proxy, f"/ctx/v1/sessions/{r.headers['x-ctxproxy-session']}")["requests"]
    assert timeline[-1]["break"].startswith("cache expired") and timeline[-1]["cached"] == 0


def test_reported_zero_is_not_unknown(proxy, upstream):
    upstream.report_cached = False
    post(proxy, conversation(2), key="sk-silent")
    totals = get(proxy, "/ctx/v1/stats", key="sk-silent")["totals"]["all"]
    assert totals["prompt"] > 0 and totals["hit_rate"] is None  # not 0%: the provider did not say


def test_metrics_are_labelled_by_route_and_model(proxy, upstream):
    post(proxy, conversation(3))
    text = proxy.get("/metrics").text
    assert 'ctxproxy_prompt_tokens_total{model="gpt-4o",route="default"}' in text
    assert "ctxproxy_overhead_seconds_bucket" in text and "ctxproxy_cacheable_tokens_total" in text


def test_a_figure_of_zero_is_a_series_at_zero(proxy, upstream):
    """A session's first request: nothing cached, nothing cacheable; both series are there, at 0."""
    post(proxy, conversation(1), key="sk-zero")
    lines = proxy.get("/metrics").text.splitlines()
    for name in ("ctxproxy_cached_tokens_total", "ctxproxy_cacheable_tokens_total"):
        assert f'{name}{{model="gpt-4o",route="default"}} 0.0' in lines, name


def test_tenants_see_only_their_own_sessions_and_admin_sees_all(upstream, tmp_path):
    cfg = make_settings(upstream.base_url, f"sqlite:///{tmp_path}/c.db", env={"CTXPROXY_ADMIN_TOKEN": "s3cret"},
                        defaults={"status_bar": {"enabled": False}})
    with InProcessProxy(cfg) as p:
        a = post(p, conversation(1), key="sk-a").headers["x-ctxproxy-session"]
        b = post(p, conversation(2), key="sk-b").headers["x-ctxproxy-session"]
        assert [s["session"] for s in get(p, "/ctx/v1/sessions", key="sk-a")["sessions"]] == [a]
        assert p.get(f"/ctx/v1/sessions/{b}", headers={"authorization": "Bearer sk-a"}).status_code == 404
        assert p.get("/ctx/v1/stats").status_code == 401
        assert p.get("/ctx/v1/stats", headers={"x-ctx-admin-token": "wrong"}).status_code == 401
        admin = get(p, "/ctx/v1/sessions", key=None, **{"x-ctx-admin-token": "s3cret"})
        assert {s["session"] for s in admin["sessions"]} == {a, b}


def test_figures_survive_restart_and_add_up_across_replicas(upstream, tmp_path):
    store = "redis://127.0.0.1:6379/13"
    key = f"sk-{uuid.uuid4()}"
    cfg = make_settings(upstream.base_url, store, defaults={"status_bar": {"enabled": False}})
    with InProcessProxy(cfg) as p1, InProcessProxy(cfg) as p2:
        for i, p in enumerate((p1, p2, p1, p2)):
            post(p, conversation(i + 1), key=key)
        p1.settle()
        p2.settle()
    with InProcessProxy(cfg) as p3:
        totals = get(p3, "/ctx/v1/stats", key=key)["totals"]["all"]
    assert totals["requests"] == 4 and totals["prompt"] == sum(r.usage["prompt_tokens"] for r in upstream.requests)


def test_session_summary_counts_every_concurrent_request(proxy, upstream):
    import asyncio

    async def burst() -> None:
        async with proxy.async_http_client() as c:
            await asyncio.gather(*[c.post("/v1/chat/completions",
                                          headers={"authorization": "Bearer sk-burst", "x-session-id": "burst"},
                                          json={"model": "gpt-4o", "messages": conversation(1)}) for _ in range(40)])

    asyncio.run(burst())
    summary = get(proxy, "/ctx/v1/sessions/burst", key="sk-burst")["summary"]
    assert summary["requests"] == 40
    assert summary["prompt"] == sum(r.usage["prompt_tokens"] for r in upstream.requests)


async def test_writes_no_replica_acknowledged_are_counted_in_metrics() -> None:
    """A Redis store's writes no replica had in time (proxy/store/redis.py `unreplicated`) reach /metrics."""
    from proxy.config import build_settings
    from proxy.state import ProxyState
    from proxy.store.guarded import GuardedStore
    from proxy.store.redis import RedisStore

    backend = RedisStore("redis+sentinel://127.0.0.1:1/mymaster?wait=1")  # never connected to here
    state = ProxyState.create(build_settings({}, {}), upstream=None, store=GuardedStore(backend))  # type: ignore[arg-type]
    try:
        assert backend.on_unreplicated is not None
        backend.on_unreplicated()
        assert b"ctxproxy_store_unreplicated_writes_total 1.0" in state.metrics.render()
    finally:
        await backend.close()
