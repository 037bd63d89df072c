"""A store that stalls, or dies, must not turn a request over the window into a certain rejection.

While the store is down the proxy forwards requests unmodified (proxy/rewrite/degrade.py). For a request
the proxy has counted over its window that is a rejection for length, sure to come: such a request waits
for the store (up to degrade.STORE_WAIT_S) and is rewritten once it answers. A request under its window
still goes at once. One over it while the store stays down is rewritten from the process's own store
(`x-ctxproxy-degraded: store-fallback`), and so is the next, without a wait: a Redis killed mid-session
costs the agent nothing but a compaction of the fallback's own.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_compress import MODEL, WINDOW, agent_run, config, post, responder

from proxy.rewrite import degrade

pytestmark = pytest.mark.proxy_config(**config())


class Stalling:
    """The proxy's real store, every call of which hangs while `until` (a monotonic time) is ahead."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.until, self.stalled_calls = inner, 0.0, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            left = self.until - time.monotonic()
            if left > 0:
                self.stalled_calls += 1
                await asyncio.sleep(left)
            return await attr(*args, **kwargs)

        return call


@pytest.fixture
def stalling(proxy: Any, upstream: Any) -> Stalling:
    upstream.windows[MODEL] = WINDOW
    guarded = proxy.state.store
    store = guarded.inner = Stalling(guarded.inner)
    return store


def over_the_window(proxy: Any, upstream: Any) -> list[dict]:
    """A history whose last request is over WINDOW, its earlier turns sent (and compacted) first."""
    run = agent_run(30)
    upstream.script(*[responder] * 200)
    for i in range(4, 40, 2):
        assert post(proxy, run[:i]).status_code == 200
    return run


def test_a_request_over_the_window_waits_out_a_stall_and_is_compacted(proxy, upstream, stalling, monkeypatch):
    run = over_the_window(proxy, upstream)
    stalling.until = time.monotonic() + 1.5  # past the 0.5 s deadline: the breaker opens
    r = post(proxy, run)
    assert stalling.stalled_calls, "the store was never asked while it stalled"
    assert r.status_code == 200, r.text[:300]
    assert "x-ctxproxy-degraded" not in r.headers, r.headers.get("x-ctxproxy-degraded")
    last = upstream.requests[-1].json
    assert len(last["messages"]) < len(run)  # rewritten: not the client's whole history
    assert int(r.headers["x-ctxproxy-store-wait-ms"]) > 0  # the wait said as the store's, not the provider's


def test_under_the_window_a_stall_still_forwards_at_once(proxy, upstream, stalling):
    run = agent_run(3)
    upstream.script(*[responder] * 10)
    stalling.until = time.monotonic() + 1.5
    started = time.monotonic()
    r = post(proxy, run)
    assert r.status_code == 200
    assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
    assert time.monotonic() - started < degrade.STORE_WAIT_S  # no wait for a request that fits


def test_a_store_that_stays_down_costs_the_wait_once_then_the_fallback_rewrites(proxy, upstream, stalling,
                                                                                monkeypatch):
    monkeypatch.setattr(degrade, "STORE_WAIT_S", 1.0)
    run = over_the_window(proxy, upstream)
    stalling.until = time.monotonic() + 30
    r = post(proxy, run)
    assert r.status_code == 200 and r.headers.get("x-ctxproxy-degraded") == "store-fallback"
    assert len(upstream.requests[-1].json["messages"]) < len(run)  # rewritten, not sent to its rejection
    assert int(r.headers["x-ctxproxy-store-wait-ms"]) >= 900  # it waited for the store, and says so
    r = post(proxy, run + [{"role": "user", "content": "and now?"}])
    assert r.status_code == 200 and r.headers.get("x-ctxproxy-degraded") == "store-fallback"
    assert "x-ctxproxy-store-wait-ms" not in r.headers  # the store known down: no second wait


def test_redis_killed_mid_session_the_next_over_window_turns_are_answered(upstream, tmp_path, monkeypatch):
    """Redis killed mid-session: the next turn over the window is answered 200 (rewritten from the fallback),
    and the next; an under-window request still goes as sent; when the store is back, what the fallback stored
    (its compaction records) is handed back to it."""
    from proxy_server import InProcessProxy
    from test_compress import settings as compress_settings
    from test_faults import RedisProcess, free_port

    monkeypatch.setattr(degrade, "STORE_WAIT_S", 0.5)
    redis = RedisProcess(free_port(), tmp_path)
    redis.start()
    try:
        with InProcessProxy(compress_settings(upstream, f"redis://127.0.0.1:{redis.port}/0")) as p:
            run = over_the_window(p, upstream)
            redis.kill()
            for extra in ([], [{"role": "user", "content": "and now?"}]):
                r = post(p, run + extra)
                assert r.status_code == 200, r.text[:300]
                assert r.headers.get("x-ctxproxy-degraded") == "store-fallback"
                assert len(upstream.requests[-1].json["messages"]) < len(run)
            small = post(p, run[:3], key="sk-other")
            assert small.status_code == 200 and small.headers.get("x-ctxproxy-degraded") == "store-unavailable"
            def held() -> int:  # what the fallback holds (its compaction records)
                return len(asyncio.run(p.state.fallback.live_blobs()))

            assert held()
            redis.start()  # back (empty: an outage that lost nothing would keep its keys; here none were there)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and (post(p, run[:3], key="sk-other").headers.get("x-ctxproxy-degraded")
                                                   or held()):
                time.sleep(0.3)
            assert not held(), "nothing handed back 15 s after the store came back"
            import redis as redis_client

            keys = redis_client.Redis(port=redis.port).keys("*compaction*")
            assert keys, "the fallback's compaction records were not handed back to the store"
    finally:
        redis.kill()
