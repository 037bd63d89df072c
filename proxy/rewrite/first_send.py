"""Work a request wrote but did not send, counted once, by the first turn that sends it.

A count (Anthropic's `count_tokens`) is rewritten as a turn would be, so it may
be the request that stores an offload or writes a compaction, yet it is no turn:
nothing of it is accounted. What it writes is recorded `unsent` (a flag in the
offload decision, the compaction's record in its pointer), and the first turn
that replays it claims it: a `put_if_absent` on a small key, atomic across
replicas, so exactly one turn wins. That turn's events say it did the work, so
its headers, the timeline, the counters and /metrics count it, once.

The flag never changes what is sent (a decision's placeholder, a record's
prefix stay byte for byte what they were); once a claim is settled in this
process (won or lost), later turns do not ask the store again.
"""

from __future__ import annotations

from proxy.lru import LRU
from proxy.store import Store

SETTLED = 20_000  # claim keys known to be taken, in process (per transform)
CLAIMED = b"1"


class FirstSend:
    """The claims of one transform: `claim` is True for exactly one caller per key, across replicas."""

    def __init__(self) -> None:
        self._settled: LRU[str, bool] = LRU(SETTLED)

    async def claim(self, store: Store, key: str, ttl: float | None) -> bool:
        """True if this call is the first to send what `key` names (and so counts it)."""
        if self._settled.get(key):
            return False
        won = await store.put_if_absent(key, CLAIMED, ttl=ttl)
        self._settled.put(key, True)
        return won
