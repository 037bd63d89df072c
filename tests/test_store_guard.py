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
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest
from silent_server import SilentServer

from proxy.store import RedisStore, StoreError
from proxy.store.guarded import GuardedStore

DEADLINE = 0.1
BACKOFF = 0.1
# The client's own socket timeout is left long (SOCKET_TIMEOUT): the guard's deadline must hold by
# itself. A call that is still pending after CLIENT_CAP was not bounded by the guard (it would have
# failed at DEADLINE) and fails the test; the cap sits well below the socket timeout, so the socket
# giving up cannot pass for the guard doing its job.
SOCKET_TIMEOUT = 5
CLIENT_CAP = 2.5


@pytest.fixture
async def silent() -> AsyncIterator[SilentServer]:
    with SilentServer() as server:
        yield server


def guard(server: SilentServer, max_backoff: float = 10.0, backoff: float = BACKOFF) -> GuardedStore:
    inner = RedisStore(server.url, prefix=f"ctxproxy-test:{uuid.uuid4().hex}:", connect_timeout=SOCKET_TIMEOUT,
                       socket_timeout=SOCKET_TIMEOUT)
    return GuardedStore(inner, timeout=DEADLINE, backoff=backoff, max_backoff=max_backoff)


async def fails_at_the_deadline(call: Coroutine[Any, Any, Any]) -> StoreError:
    """The call raises StoreError, because of the guard's deadline (not the client socket's timeout)."""
    try:
        await asyncio.wait_for(call, CLIENT_CAP)
    except StoreError as exc:
        assert f"within {DEADLINE:g}s" in str(exc), exc  # the guard's deadline, not some other failure
        return exc
    except TimeoutError:
        pytest.fail(f"still waiting after {CLIENT_CAP}s: the guard's {DEADLINE}s deadline did not hold")
    pytest.fail("a silent store answered")


def fails_without_waiting(call: Coroutine[Any, Any, Any]) -> None:
    """The call raises StoreError on its very first step: it never suspended, so it waited on nothing."""
    try:
        call.send(None)
    except StoreError:
        return
    except StopIteration:
        pytest.fail("a call answered while the breaker was open")
    call.close()
    pytest.fail("the call suspended (waited on the store) instead of failing fast")


async def test_a_call_to_a_silent_store_fails_at_the_deadline(silent: SilentServer) -> None:
    g = guard(silent)
    await fails_at_the_deadline(g.get("t:a:k"))
    assert silent.connections == 1  # it did ask the store, and gave up on it
    assert g.degraded
    await g.close()


async def test_while_backing_off_calls_fail_fast_without_reaching_the_store(silent: SilentServer) -> None:
    g = guard(silent)
    await fails_at_the_deadline(g.get("t:a:k"))
    reached = silent.connections
    for call in (g.get("t:a:k"), g.put("t:a:k", b"v"), g.incr("t:a:n"), g.acquire_lock("t:a:l", 5),
                 g.put_counted("t:a:b", b"v", "t:a:archive", 100)):
        fails_without_waiting(call)
    assert silent.connections == reached
    await g.close()


async def test_after_the_backoff_only_one_call_probes_and_the_others_fail_fast(silent: SilentServer) -> None:
    g = guard(silent)
    await fails_at_the_deadline(g.get("t:a:k"))
    await asyncio.sleep(BACKOFF * 1.5)
    assert not g.degraded  # the backoff has run out: the next call may probe
    reached = silent.connections
    order: list[int] = []

    async def one(i: int) -> None:
        with pytest.raises(StoreError):
            await g.get(f"t:a:{i}")
        order.append(i)

    probe = asyncio.create_task(one(0))
    await asyncio.sleep(0)  # the probe is admitted and now waits on the store
    assert g.probing and g.degraded
    for i in range(1, 10):  # the others, while it is in flight: each fails on its first step
        fails_without_waiting(g.get(f"t:a:{i}"))
    others = [asyncio.create_task(one(i)) for i in range(1, 10)]
    await asyncio.wait_for(asyncio.gather(probe, *others), CLIENT_CAP)
    assert order == [*range(1, 10), 0]  # nine failed while the probe was still waiting on the store
    assert silent.connections == reached + 1  # one probe reached the store, the others never asked it
    await g.close()


async def test_backoff_doubles_with_each_failed_probe_up_to_its_cap(silent: SilentServer) -> None:
    first = BACKOFF / 2  # the waits below are the backoffs themselves: 0.05, 0.1, then 0.2 three times
    g = guard(silent, max_backoff=first * 4, backoff=first)
    backoffs = []
    for _ in range(5):
        before = time.monotonic()
        await fails_at_the_deadline(g.get("t:a:k"))
        after = time.monotonic()
        # The breaker opened at the failure, which happened between `before` and `after`, for its backoff.
        backoffs.append((before, g.open_until, after))
        await asyncio.sleep(max(0.0, g.open_until - time.monotonic()) + 0.01)
    expected = [first, first * 2, first * 4, first * 4, first * 4]
    for (before, until, after), e in zip(backoffs, expected, strict=True):
        assert before + e <= until <= after + e, (backoffs, expected)
    await g.close()


async def test_ping_of_a_silent_store_answers_false_within_the_deadline(silent: SilentServer) -> None:
    g = guard(silent)
    try:
        assert await asyncio.wait_for(g.ping(), CLIENT_CAP) is False
    except TimeoutError:
        pytest.fail(f"ping still waiting after {CLIENT_CAP}s: the guard's {DEADLINE}s deadline did not hold")
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
