"""The process's own store, in memory: what a request falls back on while the configured store is down.

A request over its window while the store is down would go upstream as sent
and be rejected for length; it is rewritten from this store instead
(proxy/rewrite/pipeline.py from_fallback). When the store answers again, what
this one holds is handed back to it (proxy/state.py).
"""

from __future__ import annotations

from proxy.store.base import Store
from proxy.store.sqlite import MEMORY_PATH, SqliteStore


def in_process_store() -> SqliteStore:
    """A store of this process alone, in memory."""
    return SqliteStore(MEMORY_PATH)


async def hand_back(fallback: SqliteStore, store: Store) -> int:
    """What a process stored in its fallback while the store was down (offloaded texts, decisions, compaction
    records), written to the store - what another process wrote there meanwhile is kept - and forgotten here.
    Returns how many were handed back."""
    handed = 0
    for key, value, ttl in await fallback.live_blobs():
        handed += await store.put_if_absent(key, value, ttl)
        await fallback.delete(key)
    return handed
