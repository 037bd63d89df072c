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
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from proxy.logs import event
from proxy.store.base import Store, StoreError

TIMEOUT_S = 0.5  # deadline of one store call (config: store_timeout)
BACKOFF_S = 0.5  # fail-fast period after the first failure ...
MAX_BACKOFF_S = 10.0  # ... doubling with each failed probe, up to this (a ping that succeeds ends it sooner)
# Whole-keyspace scans (dashboard, stats) legitimately take many round trips: their
# deadline is this many times longer. Each round trip is still bounded by the backend's
# own socket/busy timeout, so a silent backend fails them just as fast.
BULK_OPS = frozenset({"keys", "counters"})
BULK_TIMEOUT_FACTOR = 20


def backing_off(store: Store) -> bool:
    """True if `store` is a guarded store whose breaker is open right now (calls would fail fast)."""
    return isinstance(store, GuardedStore) and store.degraded


class GuardedStore:
    """Wraps any `Store`; same methods, same results, plus a deadline and a breaker."""

    def __init__(self, inner: Store, timeout: float | None = None, backoff: float | None = None,
                 max_backoff: float | None = None) -> None:
        self.inner = inner
        self.timeout = TIMEOUT_S if timeout is None else timeout
        self.backoff = BACKOFF_S if backoff is None else backoff
        self.max_backoff = MAX_BACKOFF_S if max_backoff is None else max_backoff
        self.failures = 0  # 0: closed; else failed attempts in a row (the first one, then probes)
        self.open_until = 0.0  # monotonic time before which every call fails fast
        self.probing = False  # a probe is in flight: the others fail fast meanwhile

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
                async with asyncio.timeout(timeout):
                    result = await attr(*args, **kwargs)
            except TimeoutError as exc:
                self._failed(probe, name)
                raise StoreError(f"store {name} did not answer within {timeout:g}s") from exc
            except StoreError:
                self._failed(probe, name)
                raise
            finally:
                if probe:
                    self.probing = False
            if probe:
                self._recovered()
            return result

        return guarded

    def _admit(self, name: str) -> bool:
        """Let a call through (True if it is the probe), or raise at once while the breaker is open."""
        if not self.failures:
            return False
        if self.probing or time.monotonic() < self.open_until:
            raise StoreError(f"store unavailable (backing off after a failure): {name}")
        self.probing = True
        return True

    def _failed(self, probe: bool, name: str) -> None:
        if not probe and self.failures:
            return  # a call that started before the breaker opened: no reason to back off longer
        self.failures += 1
        wait = min(self.max_backoff, self.backoff * 2 ** (self.failures - 1))
        self.open_until = time.monotonic() + wait
        event("store failing; backing off", op=name, failures=self.failures, backoff_s=wait)

    def _recovered(self) -> None:
        if self.failures:
            event("store answering again", failures=self.failures)
        self.failures, self.open_until = 0, 0.0

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(self.timeout):
                ok = await self.inner.ping()
        except TimeoutError:
            return False
        if ok:
            self._recovered()
        return ok

    async def close(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self.inner.close()
        except TimeoutError:
            event("store did not close within its deadline", timeout_s=self.timeout)
