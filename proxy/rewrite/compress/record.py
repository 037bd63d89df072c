"""A session's recorded compaction: which raw prefix it replaced and with what, replayed verbatim.

The record says: "while the client's messages[0:upto] hash to `chain`, send
`prefix` in their place". Between compactions every request therefore starts
with the same bytes, and the provider's cache keeps hitting. A new compaction
writes a new version; a client that edits or truncates its history simply
stops matching and gets its messages as they are.

A record is the compaction one route's policy (trigger, target, layers) made,
so it is kept per session and route: a client that sends one session id to two
routes gets each route's own compactions, never the other's.

Migration: records written before they had routes are keyed by session only.
They are read in the same round trip as the route's own, as a fallback, and
replayed by a route only where its own policy compacts too: the log is consulted
only past the route's trigger (proxy/rewrite/compress/transform.py), and a
replayed record still has to match the client's messages byte for byte. A
derived session id already names its route, so its old record is that route's;
a session running across the upgrade keeps its bytes. The next compaction is
written under the route's key, with the next version. Old records expire with
`retention_days`, then `LEGACY_FALLBACK` (proxy/store/decisions.py) can go.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.lru import LRU
from proxy.rewrite.compress.history import Message, chain
from proxy.store import Store
from proxy.store.decisions import LEGACY_FALLBACK
from proxy.store.keys import route_session_key, session_key
from proxy.wire import jsonio

Kind = tuple[str, str | None] | None  # what the proxy wrote: (kind, the handle it names); None: the client's
PREFIX_CACHE = 256  # recorded prefixes kept in process, by (tenant, session, version)


@dataclass
class View:
    """What goes upstream: `messages`, of which the first `kept` come from the record (or none)."""

    messages: list[Message]
    counts: list[int]
    kept: int  # length of the recorded prefix at the start of `messages`
    upto: int  # raw messages[upto:] follow the prefix verbatim
    version: int
    unsent: dict[str, Any] | None = None  # the record's compaction, when a count wrote it (proxy/rewrite/first_send.py)
    reserve: int = 0  # the answer reserve (max_tokens) of the turn that compacted: what a count assumes
    # what each of the first `kept` messages is, if the proxy wrote it: (kind, handle) (proxy/rewrite/marks.py);
    # None: a record written before records kept them
    kinds: list[Kind] | None = None

    def raw_index(self, i: int) -> int:
        """The client's index of `messages[i]`, for i at or after the recorded prefix."""
        return self.upto + (i - self.kept)


@dataclass(frozen=True)
class Record:
    version: int
    upto: int
    chain: bytes
    layer: str
    prefix: list[Message]
    unsent: dict[str, Any] | None = None  # as View.unsent
    reserve: int = 0  # as View.reserve
    kinds: list[Kind] | None = None  # as View.kinds


class CompactionLog:
    """Reads and writes the records of one session on one route."""

    def __init__(self, store: Store, tenant: str, session: str, route: str, ttl: float | None) -> None:
        self.store, self.ttl = store, ttl
        self.base = route_session_key(tenant, session, route, "compaction")
        self.legacy = session_key(tenant, session, "compaction")  # before records had routes: read only
        self.lock_name = self.base + ":lock"
        self.breaker = self.base + ":breaker"

    async def latest(self, cache: LRU[str, list[Message]]) -> Record | None:
        bases = [self.base, self.legacy] if LEGACY_FALLBACK else [self.base]
        found = [(b, raw) for b, raw in zip(bases, await self.store.get_many(bases)) if raw is not None]
        if not found:
            return None
        base, raw_head = found[0]
        head = orjson.loads(raw_head)
        key = f"{base}:{head['version']}"
        prefix = cache.get(key)
        if prefix is None:
            raw = await self.store.get(key)
            if raw is None:
                return None
            prefix = jsonio.loads(raw)
            cache.put(key, prefix)
        kinds = head.get("kinds")
        return Record(head["version"], head["upto"], bytes.fromhex(head["chain"]), head["layer"], prefix,
                      head.get("unsent"), head.get("reserve", 0),
                      [tuple(k) if k else None for k in kinds] if isinstance(kinds, list) else None)

    async def write(self, version: int, upto: int, chain_at: bytes, layer: str, prefix: list[Message],
                    unsent: dict[str, Any] | None = None, reserve: int = 0, kinds: list[Kind] | None = None) -> None:
        """Prefix first, then the pointer: a reader never sees a pointer to nothing. `unsent`: the compaction
        as its events record it, when the request writing it sends no turn (a count); `reserve`: the answer
        reserve its trigger counted."""
        await self.store.put(f"{self.base}:{version}", jsonio.dumps(prefix), ttl=self.ttl)
        head: dict[str, Any] = {"version": version, "upto": upto, "chain": chain_at.hex(), "layer": layer,
                                "reserve": reserve, "kinds": kinds or [None] * len(prefix)}
        if unsent is not None:
            head["unsent"] = unsent
        await self.store.put_json(self.base, head, ttl=self.ttl)

    def sent_key(self, version: int) -> str:
        """Claimed by the first turn that sends an unsent compaction (proxy/rewrite/first_send.py)."""
        return f"{self.base}:{version}:sent"


def replay(record: Record | None, raw: list[Message], digests: list[bytes], counts: list[int],
           prefix_counts: list[int] | None) -> View:
    """The record applied to this request's messages, if they still start with what it replaced."""
    if record is None or record.upto > len(raw) or chain(digests, record.upto)[-1] != record.chain:
        return View(raw, counts, 0, 0, record.version if record else 0, reserve=record.reserve if record else 0)
    assert prefix_counts is not None
    return View(record.prefix + raw[record.upto:], prefix_counts + counts[record.upto:], len(record.prefix),
                record.upto, record.version, record.unsent, record.reserve, record.kinds)
