"""A store lock held exactly as long as its holder lives: a short lease, renewed in the background.

A lock with a long lease outlives a holder killed mid-work (kill -9, OOM, a lost
replica) by that whole lease, and everyone waiting for it waits as long. A
short lease renewed while the holder works bounds that to a few seconds, while
a live holder keeps the lock however long its work takes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from proxy.logs import event
from proxy.store.base import Store, StoreError

RENEWALS_PER_LEASE = 3  # renew this often per lease: two renewals may fail before the lock is lost


@contextlib.asynccontextmanager
async def renewed(store: Store, name: str, token: str, lease: float) -> AsyncIterator[None]:
    """Keep renewing the lock `name` (held with `token`) while the block runs; release it after.

    Losing the lock (another holder took it after a renewal failed) is logged, not raised: the
    work in hand is still valid, it may only be done twice. A release that fails is not raised
    either: the lease runs out by itself within `lease` seconds.
    """
    renewer = asyncio.get_running_loop().create_task(_renew(store, name, token, lease))
    try:
        yield
    finally:
        renewer.cancel()  # not awaited: a cancellation of this task must not be swallowed
        try:
            await store.release_lock(name, token)
        except StoreError as e:
            event("lock not released; its lease runs out", lock=name, error=str(e))


async def _renew(store: Store, name: str, token: str, lease: float) -> None:
    while True:
        await asyncio.sleep(lease / RENEWALS_PER_LEASE)
        try:
            if not await store.renew_lock(name, token, lease):
                event("lock lost while held: its lease ran out", lock=name)
                return
        except StoreError as e:
            event("lock renewal failed; retrying", lock=name, error=str(e))
