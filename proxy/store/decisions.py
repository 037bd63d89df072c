"""Recorded rewrite decisions, one route's apart from another's: a route's policy decides for that route only.

Byte stability needs a decision (an offload's placeholder, a span's summary) to
be recorded the first time and replayed verbatim afterwards, whatever the
settings say then, on every replica. Which content gets rewritten at all is the
policy of the route the request is on (its thresholds, its summarizer), so a
record is keyed by route and content: a tool result one route offloads is sent
whole on a route whose threshold it does not pass. The text a handle names is
not a decision: it is stored once per tenant (proxy/store/archive.py) and reads
back on every route.

A record is keyed by the route's *name*, not by a fingerprint of its settings:
a route whose settings change keeps replaying what it decided, as the one rule
asks (with a fingerprint, the first request after a config change would
recompute every running session's decisions and break its cached prefix).

Migration. Records written before decisions had routes are keyed by tenant and
content only (`t:<tenant>:decision:<kind>:<handle>`). They are read in the same
round trip as the route's own, as a fallback, and a route adopts one only where
its own policy makes that decision too (`adopt`: for an offload, the content is
over this route's threshold); an adopted record is copied under the route's key,
so it stays pinned there. A session running across the upgrade therefore keeps
its bytes on every route whose policy made the decision, and a route whose
policy would not have made it sends the client's text, for old records as for
new ones. Old records expire with their retention (`retention_days`, 7 days by
default); after that the fallback finds nothing and `LEGACY_FALLBACK` can go.
During a rolling upgrade a replica still on the old code does not see records
the new code wrote: upgrade the replicas sharing a store together.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.store.base import Store
from proxy.store.keys import route_key, tenant_key

SECONDS_PER_DAY = 86_400
LEGACY_FALLBACK = True  # read records of before decisions had routes (remove once they have all expired)

# (handle, an old record) -> whether this route's own policy makes that decision too
Adopt = Callable[[str, Any], bool]


def adopt_any(handle: str, decision: Any) -> bool:
    """For a decision the caller's policy has already made (a summary of the span it chose to summarize)."""
    return True


class Decisions:
    """The recorded decisions of one tenant on one route."""

    def __init__(self, store: Store, tenant: str, route: str, retention_days: float | None = None) -> None:
        self.store = store
        self.tenant, self.route = tenant, route
        self.ttl = retention_days * SECONDS_PER_DAY if retention_days else None

    def key(self, kind: str, handle: str) -> str:
        return route_key(self.tenant, self.route, "decision", kind, handle)

    def legacy_key(self, kind: str, handle: str) -> str:
        return tenant_key(self.tenant, "decision", kind, handle)

    async def get(self, kind: str, handles: list[str], adopt: Adopt) -> list[Any | None]:
        """The decisions standing for these handles on this route, in order, in one round trip."""
        if not handles:
            return []
        keys = [self.key(kind, h) for h in handles]
        if LEGACY_FALLBACK:
            keys += [self.legacy_key(kind, h) for h in handles]
        raws = await self.store.get_many(keys)
        out: list[Any | None] = []
        n = len(handles)
        for j, handle in enumerate(handles):
            own = raws[j]
            if own is not None:
                out.append(orjson.loads(own))
                continue
            old = raws[n + j] if LEGACY_FALLBACK else None
            decision = None if old is None else orjson.loads(old)
            adopted = decision is not None and adopt(handle, decision)
            out.append(await self.record(kind, handle, decision) if adopted else None)
        return out

    async def record(self, kind: str, handle: str, decision: Any) -> Any:
        """Record a decision unless one exists on this route; return the one that stands (ours or the first)."""
        key = self.key(kind, handle)
        if await self.store.put_json_if_absent(key, decision, ttl=self.ttl):
            return decision
        existing = await self.store.get_json(key)
        return decision if existing is None else existing
