"""A session's clock for the status bar: when it was first seen and when its previous request came.

Why in process: the clock was read from the store and written back on every agent request, two store round trips
(a thread hop each on SQLite) in the request's path for two numbers. When no other process serves the session
(one worker on SQLite: RequestContext.shared is False) this process saw its previous request itself, so after
the first request of a session here (read from the store: it may predate a restart) the clock is kept in memory,
and written to the store in the background for the next restart. Those writes go in order: SQLite runs one
process's operations on one thread, one after another. When other processes may serve the session, the store
is read and written in the request as before: its previous request may have been another replica's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.logs import event
from proxy.lru import LRU
from proxy.request import RequestContext
from proxy.store import StoreError
from proxy.store.keys import session_key

_SESSIONS_KEPT = 10_000  # sessions whose clock this process keeps


class SessionClock:
    def __init__(self) -> None:
        self._known: LRU[tuple[str, str], dict[str, float]] = LRU(_SESSIONS_KEPT)
        self._writes: set[asyncio.Task[None]] = set()

    async def tick(self, ctx: RequestContext, now: float) -> dict[str, float]:
        """The clock as it stood before this request ({"first", "last"}: epoch seconds); `now` becomes its last."""
        key = session_key(ctx.tenant, ctx.session, "clock")
        mine = None if ctx.shared else self._known.get((ctx.tenant, ctx.session))
        clock: dict[str, Any] = mine or await ctx.store.get_json(key) or {"first": now, "last": now}
        after = {"first": clock["first"], "last": now}
        if ctx.shared:
            await ctx.store.put_json(key, after)
            return clock
        self._known.put((ctx.tenant, ctx.session), after)
        task = asyncio.get_running_loop().create_task(self._write(ctx, key, after))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return clock

    @staticmethod
    async def _write(ctx: RequestContext, key: str, clock: dict[str, float]) -> None:
        try:
            await ctx.store.put_json(key, clock)
        except StoreError as err:  # the clock in memory is right; only a restart would see an older one
            event("status bar clock not stored", session=ctx.session, error=str(err))
