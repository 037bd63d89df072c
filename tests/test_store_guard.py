"""The guarded store in front of a backend that never answers: a deadline per call, fail-fast, one probe at a time.

The backend is a real Redis client talking to a TCP server that accepts and
swallows everything (tests/silent_server.py), so what reaches the "store" is
counted in connections: after a timeout the client drops its socket, so every
call that reaches the backend opens a new one.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from silent_server import SilentServer

from proxy.store import RedisStore, StoreError
from proxy.store.guarded import GuardedStore

DEADLINE = 0.2
BACKOFF = 0.1
FAST = 0.1  # a fail-fast call takes microseconds; this is generous on a loaded machine


@pytest.fixture
async def silent() -> AsyncIterator[SilentServer]:
    with SilentServer() as server:
        yield server


def guard(server: SilentServer, max_backoff: float = 10.0) -> GuardedStore:
    # The client's own socket timeout is left long: the guard's deadline must hold by itself.
    inner = RedisStore(server.url, prefix=f"ctxproxy-test:{uuid.uuid4().hex}:", connect_timeout=5, socket_timeout=5)
    return GuardedStore(inner, timeout=DEADLINE, backoff=BACKOFF, max_backoff=max_backoff)


async def timed_failure(call) -> float:
    started = time.monotonic()
    with pytest.raises(StoreError):
        await call
    return time.monotonic() - started


async def test_a_call_to_a_silent_store_fails_at_the_deadline(silent: SilentServer) -> None:
    g = guard(silent)
    took = await timed_failure(g.get("t:a:k"))
    assert DEADLINE * 0.9 < took < DEADLINE + 1.0
    assert g.degraded
    await g.close()


async def test_while_backing_off_calls_fail_fast_without_reaching_the_store(silent: SilentServer) -> None:
    g = guard(silent)
    await timed_failure(g.get("t:a:k"))
    reached = silent.connections
    for call in (g.get("t:a:k"), g.put("t:a:k", b"v"), g.incr("t:a:n"), g.acquire_lock("t:a:l", 5),
                 g.put_counted("t:a:b", b"v", "t:a:archive", 100)):
        assert await timed_failure(call) < FAST
    assert silent.connections == reached
    await g.close()


async def test_after_the_backoff_only_one_call_probes_and_the_others_fail_fast(silent: SilentServer) -> None:
    g = guard(silent)
    await timed_failure(g.get("t:a:k"))
    await asyncio.sleep(BACKOFF * 1.5)
    reached = silent.connections
    finished: list[float] = []
    started = time.monotonic()

    async def one(i: int) -> None:
        with pytest.raises(StoreError):
            await g.get(f"t:a:{i}")
        finished.append(time.monotonic() - started)

    await asyncio.gather(*(one(i) for i in range(10)))
    assert silent.connections == reached + 1  # one probe reached the store, nine never asked it
    finished.sort()
    assert all(t < FAST for t in finished[:9]), finished
    assert finished[9] >= DEADLINE * 0.9  # the probe paid the deadline
    await g.close()


async def test_backoff_doubles_with_each_failed_probe_up_to_its_cap(silent: SilentServer) -> None:
    g = guard(silent, max_backoff=BACKOFF * 4)
    waits = []
    for _ in range(5):
        await timed_failure(g.get("t:a:k"))
        waits.append(g.open_until - time.monotonic())
        await asyncio.sleep(max(0.0, g.open_until - time.monotonic()) + 0.01)
    expected = [BACKOFF, BACKOFF * 2, BACKOFF * 4, BACKOFF * 4, BACKOFF * 4]
    assert all(e - 0.05 < w <= e for w, e in zip(waits, expected)), waits
    await g.close()


async def test_ping_of_a_silent_store_answers_false_within_the_deadline(silent: SilentServer) -> None:
    g = guard(silent)
    started = time.monotonic()
    assert await g.ping() is False
    assert time.monotonic() - started < DEADLINE + 1.0
    await g.close()


async def test_a_probe_that_succeeds_closes_the_breaker() -> None:
    real = RedisStore("redis://127.0.0.1:6379/15", prefix=f"ctxproxy-test:{uuid.uuid4().hex}:")
    g = GuardedStore(real, timeout=DEADLINE, backoff=BACKOFF)
    g.failures, g.open_until = 3, time.monotonic() - 1  # as a long outage leaves it, backoff run out
    assert not g.degraded
    assert await g.get("t:a:k") is None  # the probe
    assert g.failures == 0 and not g.degraded
    assert await asyncio.gather(*(g.get("t:a:k") for _ in range(5))) == [None] * 5
    await g.close()
