"""A session's recorded compaction: which raw prefix it replaced and with what, replayed verbatim.

The record says: "while the client's messages[0:upto] hash to `chain`, send
`prefix` in their place". Between compactions every request therefore starts
with the same bytes, and the provider's cache keeps hitting. A new compaction
writes a new version; a client that edits or truncates its history simply
stops matching and gets its messages as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.lru import LRU
from proxy.rewrite.compress.history import Message, chain
from proxy.store import Store
from proxy.store.keys import session_key
from proxy.wire import jsonio

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


class CompactionLog:
    """Reads and writes the records of one tenant's sessions."""

    def __init__(self, store: Store, tenant: str, session: str, ttl: float | None) -> None:
        self.store, self.ttl = store, ttl
        self.base = session_key(tenant, session, "compaction")
        self.lock_name = self.base + ":lock"
        self.breaker = self.base + ":breaker"

    async def latest(self, cache: LRU[str, list[Message]]) -> Record | None:
        head = await self.store.get_json(self.base)
        if head is None:
            return None
        key = f"{self.base}:{head['version']}"
        prefix = cache.get(key)
        if prefix is None:
            raw = await self.store.get(key)
            if raw is None:
                return None
            prefix = jsonio.loads(raw)
            cache.put(key, prefix)
        return Record(head["version"], head["upto"], bytes.fromhex(head["chain"]), head["layer"], prefix,
                      head.get("unsent"))

    async def write(self, version: int, upto: int, chain_at: bytes, layer: str, prefix: list[Message],
                    unsent: dict[str, Any] | None = None) -> None:
        """Prefix first, then the pointer: a reader never sees a pointer to nothing. `unsent`: the compaction
        as its events record it, when the request writing it sends no turn (a count)."""
        await self.store.put(f"{self.base}:{version}", jsonio.dumps(prefix), ttl=self.ttl)
        head: dict[str, Any] = {"version": version, "upto": upto, "chain": chain_at.hex(), "layer": layer}
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
        return View(raw, counts, 0, 0, record.version if record else 0)
    assert prefix_counts is not None
    return View(record.prefix + raw[record.upto:], prefix_counts + counts[record.upto:], len(record.prefix),
                record.upto, record.version, record.unsent)
