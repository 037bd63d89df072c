"""The one policy for a rewrite that cannot be done: send the client's request as it came.

A proxy must never be the reason an agent run dies. Whether the store is down
or a transform raised (a bug, an input nobody foresaw), the request goes
upstream byte for byte as the client sent it, and says so three ways: the
`x-ctxproxy-degraded` header naming the cause (`store-unavailable` or the
transform's name), the `ctxproxy_degraded_requests` metric, and a log line:
for a failed transform an error line per request; for the store, whose outage
spans many requests, the request's own line names the event, and the store's
going down and coming back are logged once each, at warning
(proxy/store/guarded.py), so the log is not one warning per request.

One exception: a request the proxy counts over its window would be rejected for
length if sent as it came. It waits for a store that stalls (STORE_WAIT_S,
unless the store was already known to be down) and is rewritten once the store
answers; while the store stays down it is rewritten from the process's own
in-memory store instead (`x-ctxproxy-degraded: store-fallback`): offloads give
the same bytes as with the store, a compaction is the fallback's own, and what
it stores is readable within this process and handed back to the store when it
answers again (proxy/state.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

from proxy.logs import event, log
from proxy.request import Conversation, RequestContext
from proxy.request.events import Degraded
from proxy.store import Store

STORE_DOWN = "store-unavailable"
STORE_FALLBACK = "store-fallback"  # rewritten from the process's own store while the configured one is down
# How long a request already over its window waits for a stalled store before it goes unmodified (and is
# rewritten from the in-process fallback): a store that stalls for a few seconds then costs that request a few
# seconds, not the agent's run. Once the store is said down, later such requests go to the fallback at once.
STORE_WAIT_S = 5.0
_STORE_ASKED_EVERY_S = 0.1


async def forward_unmodified(conv: Conversation, ctx: RequestContext, cause: str, error: BaseException) -> Conversation:
    """A fresh parse of the client's bytes, carrying one Degraded event; `cause` names what failed."""
    if cause == STORE_DOWN:
        event("store unavailable; forwarding unmodified", logging.DEBUG, request_id=ctx.request_id, error=str(error))
    else:
        log.error("transform failed; forwarding unmodified", exc_info=error,
                  extra={"fields": {"request_id": ctx.request_id, "transform": cause}})
    fresh = await Conversation.read(conv.raw, conv.wire)
    fresh.events.append(Degraded(cause, "store unavailable" if cause == STORE_DOWN else f"{type(error).__name__}"))
    await fresh.prepare_digests()
    await fresh.prepare_counts()
    return fresh


async def wait_for_store(store: Store, seconds: float | None = None) -> bool:
    """Ask the store (its readiness ping, each within the store's own deadline) until it answers or `seconds`
    have passed; True once it answers (a guarded store's breaker is then closed: the rewrite can run)."""
    deadline = time.monotonic() + (STORE_WAIT_S if seconds is None else seconds)
    while True:
        if await store.ping():
            event("store answered a request that was over its window; rewriting it after all", logging.INFO)
            return True
        if time.monotonic() + _STORE_ASKED_EVERY_S >= deadline:
            return False
        await asyncio.sleep(_STORE_ASKED_EVERY_S)
