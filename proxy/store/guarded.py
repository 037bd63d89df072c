"""A store that fails fast while its backend is down, so a dead Redis costs requests nothing.

After a backend failure every call raises `StoreError` at once for a cooldown
(callers then forward unmodified and say so); the first call after the
cooldown tries the backend again, so the proxy recovers by itself when the
store returns. `ping` always asks the backend: readiness must tell the truth.
"""

from __future__ import annotations

import time
from typing import Any

from proxy.store.base import Store, StoreError

COOLDOWN_S = 5.0  # seconds of fail-fast after a backend error


class GuardedStore:
    def __init__(self, inner: Store, cooldown: float | None = None) -> None:
        self.inner = inner
        self.cooldown = COOLDOWN_S if cooldown is None else cooldown
        self.down_until = 0.0

    @property
    def degraded(self) -> bool:
        return time.monotonic() < self.down_until

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.degraded:
                raise StoreError(f"store unavailable (backing off after a failure): {name}")
            try:
                return await attr(*args, **kwargs)
            except StoreError:
                self.down_until = time.monotonic() + self.cooldown
                raise

        return guarded

    async def ping(self) -> bool:
        ok = await self.inner.ping()
        if ok:
            self.down_until = 0.0
        return ok

    async def close(self) -> None:
        await self.inner.close()
