"""A store whose every call has a deadline, behind a breaker: a dead or silent backend costs requests milliseconds.

A backend can fail two ways: refuse at once (Redis down) or never answer (a relay
that accepts connections and swallows commands, a wedged server, a locked SQLite
file). Every call here is bounded by `timeout`, and a timeout is a failure like
any other. After a failure the breaker opens: calls raise `StoreError` at once
(callers forward unmodified and say so) for a backoff that doubles with each
failed probe, up to `max_backoff`. Once the backoff has run out, one call at a
time goes through as a probe while the others keep failing fast, so a hanging
backend makes at most one call per backoff pay the deadline; a probe that
succeeds closes the breaker and the proxy recovers by itself. `ping` always asks
the backend, within the deadline: readiness must tell the truth, quickly.

Said out loud: while the store is down context management is off (requests go
upstream unmodified), so the change is logged at `warning`, with the reason,
once per transition: when it goes down (the first failure, a failed readiness
ping, or `problem()` at start) and when it answers again, never per request or
per failed probe (those are `debug`).

The deadline measures the store, not the event loop: while a call waits, the
loop may be held by other work (a big request's parse, a GC pass). Time the
loop spent blocked meanwhile, measured by a small lag monitor (`LoopLag`), does
not count against the call: a slow neighbour must never open the breaker for
every tenant. Only the store's own slowness does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from proxy.logs import event
from proxy.redact import redact_url
from proxy.store.base import Store, StoreError
from proxy.store.keys import tenant_key
from proxy.telemetry.base import OFF, Tracing

TIMEOUT_S = 0.5  # deadline of one store call (config: store_timeout)
BACKOFF_S = 0.5  # fail-fast period after the first failure ...
MAX_BACKOFF_S = 10.0  # ... doubling with each failed probe, up to this (a ping that succeeds ends it sooner)
# Whole-keyspace scans (dashboard, stats) legitimately take many round trips: their
# deadline is this many times longer. Each round trip is still bounded by the backend's
# own socket/busy timeout, so a silent backend fails them just as fast.
BULK_OPS = frozenset({"keys", "counters"})
BULK_TIMEOUT_FACTOR = 20
LAG_TICK_S = 0.02  # the lag monitor's beat: a beat late by more than this was a blocked loop
LOOP_LAG_TASK = "ctxproxy-loop-lag"  # the monitor's task: it runs as long as the store does
PROBE_KEY = tenant_key("ctxproxy", "probe")  # read by `ask_backend`; no tenant is named so, nothing is stored there


class LoopLag:
    """How long the event loop has been blocked in all, from a task that beats every LAG_TICK_S.

    A beat that comes late came late because the loop was busy with something
    else. `blocked()` is that lateness summed, the beat still due included
    (so it is exact right after a block, before the monitor has run again).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.total = 0.0
        self.last = loop.time()
        self.task = loop.create_task(self._beat(), name=LOOP_LAG_TASK)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(LAG_TICK_S)
            now = self.loop.time()
            self.total += max(0.0, now - self.last - LAG_TICK_S)
            self.last = now

    def blocked(self) -> float:
        return self.total + max(0.0, self.loop.time() - self.last - LAG_TICK_S)


@asynccontextmanager
async def store_deadline(lag: LoopLag, seconds: float) -> AsyncIterator[None]:
    """asyncio.timeout(seconds), but the time the loop was blocked meanwhile is added to the deadline."""
    loop = lag.loop
    start, blocked = loop.time(), lag.blocked()
    async with asyncio.timeout(None) as cm:
        handles: list[asyncio.TimerHandle] = []

        def check() -> None:
            left = seconds - (loop.time() - start - (lag.blocked() - blocked))
            if left <= 0:
                cm.reschedule(loop.time())  # expires now: the call is cancelled, TimeoutError raised
            else:
                handles.append(loop.call_later(left, check))

        handles.append(loop.call_later(seconds, check))
        try:
            yield
        finally:
            handles[-1].cancel()


async def ask_backend(store: Store, timeout: float) -> str | None:
    """One read of a key nobody writes, within `timeout`: why it failed in one line, or None. Logs nothing."""
    try:
        async with asyncio.timeout(timeout):
            await store.get(PROBE_KEY)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except StoreError as e:
        return str(e)
    return None


def backing_off(store: Store) -> bool:
    """True if `store` is a guarded store whose breaker is open right now (calls would fail fast)."""
    return isinstance(store, GuardedStore) and store.degraded


def said_down(store: Store) -> bool:
    """True if `store` is a guarded store said to be down and not answering since (its breaker may be half open)."""
    return isinstance(store, GuardedStore) and store.down_since is not None


class GuardedStore:
    """Wraps any `Store`; same methods, same results, plus a deadline and a breaker."""

    def __init__(self, inner: Store, timeout: float = TIMEOUT_S, backoff: float = BACKOFF_S,
                 max_backoff: float = MAX_BACKOFF_S, name: str = "store") -> None:
        self.inner = inner
        self.name = redact_url(name)  # how the log names it: its URL, any password masked (not only the log's guess)
        self.timeout = timeout
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.failures = 0  # 0: closed; else failed attempts in a row (the first one, then probes)
        self.open_until = 0.0  # monotonic time before which every call fails fast
        self.probing = False  # a probe is in flight: the others fail fast meanwhile
        self.down_since: float | None = None  # monotonic time it was said to be down; None: said up (or unknown)
        self._lag: LoopLag | None = None
        self.tracing: Tracing = OFF  # the app's (proxy/telemetry/): a span per call made inside a traced request
        self.on_recovered: Callable[[], None] | None = None  # called when it answers again after it was said down

    def _deadline(self, seconds: float) -> Any:
        """The deadline of one call (store_deadline), with this loop's lag monitor (started on first use)."""
        loop = asyncio.get_running_loop()
        if self._lag is None or self._lag.loop is not loop or self._lag.task.done():
            self._lag = LoopLag(loop)
        return store_deadline(self._lag, seconds)

    @property
    def degraded(self) -> bool:
        """True while a call would fail fast without asking the backend."""
        return self.failures > 0 and (self.probing or time.monotonic() < self.open_until)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr
        timeout = self.timeout * (BULK_TIMEOUT_FACTOR if name in BULK_OPS else 1)

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            probe = self._admit(name)
            try:
                async with self._deadline(timeout):
                    result = await attr(*args, **kwargs)
            except TimeoutError as exc:
                error = StoreError(f"store {name} did not answer within {timeout:g}s")
                self._failed(probe, name, str(error))
                raise error from exc
            except StoreError as exc:
                self._failed(probe, name, str(exc))
                raise
            finally:
                if probe:
                    self.probing = False
            if probe or (self.down_since is not None and not self.failures):  # said down at start, answers now
                self._recovered()
            return result

        if not self.tracing.on:
            return guarded

        async def traced(*args: Any, **kwargs: Any) -> Any:
            with self.tracing.store_call(name):
                return await guarded(*args, **kwargs)

        return traced

    def _admit(self, name: str) -> bool:
        """Let a call through (True if it is the probe), or raise at once while the breaker is open."""
        if not self.failures:
            return False
        if self.probing or time.monotonic() < self.open_until:
            raise StoreError(f"store unavailable (backing off after a failure): {name}")
        self.probing = True
        return True

    def _failed(self, probe: bool, name: str, reason: str) -> None:
        if not probe and self.failures:
            return  # a call that started before the breaker opened: no reason to back off longer
        self.failures += 1
        wait = min(self.max_backoff, self.backoff * 2 ** (self.failures - 1))
        self.open_until = time.monotonic() + wait
        if not self._said_down(reason, name):
            event("store still unavailable; backing off", logging.DEBUG, op=name, failures=self.failures,
                  backoff_s=wait, reason=reason)

    def _said_down(self, reason: str, op: str) -> bool:
        """Log the store going down, once until it is up again; True if this call said it."""
        if self.down_since is not None:
            return False
        self.down_since = time.monotonic()
        event("store unavailable: requests are forwarded unmodified (no offload, compression or status bar; one over "
              "its window is rewritten from an in-process fallback) until it answers", logging.WARNING,
              store=self.name, op=op, reason=reason)
        return True

    def _recovered(self) -> None:
        self.failures, self.open_until = 0, 0.0
        if self.down_since is not None:
            down = time.monotonic() - self.down_since
            self.down_since = None
            event("store answering again: context management resumed", logging.WARNING, store=self.name,
                  down_s=round(down, 1))
            if self.on_recovered is not None:
                self.on_recovered()

    async def problem(self) -> str | None:
        """Why the store does not answer right now, in one line; None when it does.

        Asked at start (the app's lifespan), so a dead store is said in the first
        lines of the log rather than discovered from degraded requests; the answer
        counts as a transition like any other call's. It opens no breaker: the first
        request finds out for itself, without a second warning.
        """
        reason = await ask_backend(self.inner, self.timeout)
        if reason is None:
            self._recovered()
        else:
            self._said_down(reason, "start")
        return reason

    async def ping(self) -> bool:
        try:
            async with self._deadline(self.timeout):
                ok = await self.inner.ping()
        except TimeoutError:
            ok = False
        if ok:
            self._recovered()
        else:
            self._said_down("it did not answer a readiness ping", "ping")
        return ok

    async def close(self) -> None:
        if self._lag is not None:
            self._lag.task.cancel()
        try:
            async with asyncio.timeout(self.timeout):
                await self.inner.close()
        except TimeoutError:
            event("store did not close within its deadline", timeout_s=self.timeout)
