"""The earlier request a request's cacheable prefix is measured against: the provider's cache, as the proxy sees it.

A provider caches per model: a prompt can only reuse a prefix that an earlier
prompt to the same model carried. So the previous request of a session is the
session's previous request *to this model* the provider accepted (Claude Code
sends its side requests to another model under the same session id; measured
against those, its main turns looked uncacheable while the provider cached
them). A session's first request to a model is measured against the opening
request of the tenant's latest other session on that model: two sessions of one
agent share their tools and system prompt, which the provider caches for both
(no break cause is given for that one: it is not the session's own history).

Traces live in the store (they survive restarts and are shared by replicas) and
in a bounded in-process cache. The cache is only read first when this process
is the only one serving the sessions: with several workers (`serve --workers N`),
or replicas on Redis behind a load balancer, consecutive requests of one session
land on different processes, and a process's cached trace would be an older
request than the one the store holds; then the store is read every time (the
cache still serves `last`), and the accountant writes each trace as soon as its request is recorded, not with its batch.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from proxy.accounting.prefix_check import PrefixCheck, PrefixTrace, compare
from proxy.lru import LRU
from proxy.store import Store, StoreError
from proxy.store.keys import session_key, tenant_key
from proxy.tokens.prefix import common_prefix

TRACES_CACHED = 1_000  # (tenant, session, model) traces kept in process


def _model_tag(model: str | None) -> str:
    """A short, key-safe name for a model (its string is the client's, of any length). Every request asks for
    its model's three times (check, last, keep): a name of ordinary length is hashed once (`_cached_tag`)."""
    if model is not None and len(model) <= _TAG_CACHED_CHARS:
        return _cached_tag(model)
    return _tag(model)


def _tag(model: str | None) -> str:
    return hashlib.blake2b((model or "").encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


_TAG_CACHED_CHARS = 200  # a longer name is hashed every time: the cache's memory stays bounded
_cached_tag = functools.lru_cache(maxsize=1024)(_tag)  # model names come from clients: bounded


def trace_key(tenant: str, session: str, model: str | None) -> str:
    return session_key(tenant, session, "trace", _model_tag(model))


def opening_key(tenant: str, model: str | None) -> str:
    return tenant_key(tenant, "opening", _model_tag(model))


class Previous:
    """Finds and keeps the traces requests are compared with."""

    def __init__(self, store: Store, shared: bool = False) -> None:
        self.store, self.shared = store, shared
        self._traces: LRU[str, PrefixTrace] = LRU(TRACES_CACHED)

    async def _get(self, key: str) -> PrefixTrace | None:
        trace = None if self.shared else self._traces.get(key)
        if trace is None:
            try:
                raw = await self.store.get_json(key)
            except StoreError:  # this process's own latest, if it has one
                return self._traces.get(key)
            trace = PrefixTrace.from_json(raw) if raw else None
            if trace is not None:
                self._traces.put(key, trace)
        return trace

    async def check(self, tenant: str, session: str, model: str | None, cur: PrefixTrace) -> PrefixCheck:
        """This request against the session's previous accepted one to its model, else the tenant's latest
        opening on that model (cacheable only: no cause, no previous)."""
        prev = await self._get(trace_key(tenant, session, model))
        if prev is not None:
            return compare(prev, cur)
        opening = await self._get(opening_key(tenant, model))
        if opening is None:
            return PrefixCheck(0, 0, None)
        return PrefixCheck(compare(opening, cur).cacheable, 0, None)

    async def branch(self, tenant: str, session: str, model: str | None, raw: list[bytes]) -> str:
        """The session a request of a session derived from its opening belongs to (`raw`: its messages' digests).

        Two conversations with one opening (parallel attempts at one task, a benchmark harness) derive one
        session; a request that does not continue the session's previous one to its model is another
        conversation: the branch named after the session and its messages up to the first that differs, so every
        request of that conversation finds the same branch, on any replica. A request that continues the previous
        one, rewinds it, or differs from it only in its own last message (a turn redone, an edited prompt) stays.
        """
        prev = await self._get(trace_key(tenant, session, model))
        if prev is None:
            return session
        k = common_prefix(prev.raw, raw)
        if k >= min(len(prev.raw), len(raw) - 1):  # it continues the previous, rewinds it, or redoes its last message
            return session
        h = hashlib.blake2b(session.encode(), digest_size=6)
        for d in raw[:k + 1]:
            h.update(d)
        return f"{session}.{h.hexdigest()}"

    def last(self, tenant: str, session: str, model: str | None) -> PrefixTrace | None:
        """The session's previous trace for the model, if this process holds it (for the inspector's texts)."""
        return self._traces.get(trace_key(tenant, session, model))

    def keep(self, tenant: str, session: str, model: str | None, trace: PrefixTrace, opened: bool) -> dict[str, Any]:
        """Make `trace` the one the next request is compared with; returns the store writes to do.
        `opened`: it had no previous in its session (it is the tenant's latest opening on its model too)."""
        writes = {trace_key(tenant, session, model): trace}
        if opened:
            writes[opening_key(tenant, model)] = trace
        for key, t in writes.items():
            self._traces.put(key, t)
        return {key: t.to_json() for key, t in writes.items()}
