"""The durable-state contract every backend implements, plus the pieces they share."""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson

from .keys import slot_group

# Random bytes in a lock token: enough that two holders never collide.
LOCK_TOKEN_BYTES = 16
# Most blobs one counted put evicts: a quota lowered far below what a group holds is
# reached over several puts rather than by one call that blocks the backend.
MAX_EVICTIONS_PER_PUT = 1000
# Millisecond floor for a TTL; Redis rejects PX 0, so tiny TTLs round up to this.
MIN_TTL_MS = 1
MS_PER_S = 1000


class StoreError(Exception):
    """A backend failed (unreachable, busy, corrupt, closed).

    Every backend exception is wrapped in this one type, with the original kept as
    ``__cause__``, so callers catch ``StoreError`` and degrade instead of crashing.
    Messages name the operation and the backend error, never a stored value.
    """


@dataclass
class Writes:
    """Writes that go together (a batch of the accounting's), in one call: counters added to, JSON records put,
    records put unless present, and log appends, each list of appends with its own ``max_len``. All of them
    share ``ttl``. A backend applies them as one unit of work (SQLite: one transaction on its thread), in
    that order, with the results of the calls they stand for."""

    ttl: float | None = None
    amounts: dict[str, int | float] = field(default_factory=dict)
    records: dict[str, Any] = field(default_factory=dict)
    records_if_absent: dict[str, Any] = field(default_factory=dict)
    logs: list[tuple[list[tuple[str, bytes]], int | None]] = field(default_factory=list)


@runtime_checkable
class Store(Protocol):
    """Shared, durable key/value state for the proxy.

    Keys are plain strings that callers namespace themselves (``t:{tenant}:blob:{h}``).
    ``ttl`` is seconds (float) or ``None`` for no expiry; an expired entry reads as
    absent. Blobs and JSON records share one keyspace; counters, logs, locks and the
    byte counts of counted groups each have their own, so a counter and a blob under
    the same key are independent.
    Every conditional write (``*_if_absent``, ``incr``, locks) is atomic across all
    store instances on the same backend, including ones in other processes.
    """

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> None: ...

    async def put_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent (or expired); True if this call stored it."""
        ...

    async def get_json(self, key: str) -> Any | None: ...

    async def put_json(self, key: str, value: Any, ttl: float | None = None) -> None: ...

    async def put_json_if_absent(self, key: str, value: Any, ttl: float | None = None) -> bool: ...

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        """Blobs for ``keys`` in order, ``None`` where absent, in one round trip (per node, on a cluster)."""
        ...

    async def delete(self, key: str) -> None:
        """Forget ``key``: its blob/record, counter and log (not locks)."""
        ...

    async def put_counted(self, key: str, value: bytes, group: str, quota: int, ttl: float | None = None) -> int:
        """Store a blob counted against ``group``'s byte budget; return how many blobs that evicted.

        While the group's counted blobs hold more than ``quota`` bytes, its least recently
        stored ones are deleted first (never the one just stored: a single blob larger than
        the whole quota stays until the next counted put). Storing a key again replaces its
        size and makes it the newest. Atomic against every other counted put of the group,
        on every store instance of the backend. ``key`` and ``group`` must have the same slot
        group (proxy/store/keys.py), else ``ValueError``. A counted blob reads like any other (``get``);
        ``delete`` does not uncount it (its bytes are reclaimed when it would be evicted).
        """
        ...

    async def counted_bytes(self, group: str) -> int:
        """Bytes the group's counted blobs hold, as eviction sees them."""
        ...

    async def incr(self, key: str, amount: int | float = 1) -> int | float:
        """Add ``amount`` atomically; float if ``amount`` is a float, else int when integral."""
        ...

    async def incr_many(self, amounts: dict[str, int | float]) -> None:
        """Add to several counters in one round trip per node (accounting writes ~20 per request); each add is
        atomic on its own, the batch is not a transaction."""
        ...

    async def get_counter(self, key: str) -> int | float: ...

    async def counters(self, prefix: str) -> dict[str, int | float]: ...

    async def keys(self, prefix: str) -> list[str]:
        """Sorted, unexpired blob/record keys starting with ``prefix``."""
        ...

    async def append_log(
        self, key: str, value: bytes, max_len: int | None = None, ttl: float | None = None
    ) -> None:
        """Append to a list, keeping the newest ``max_len``; ``ttl`` (re)sets the whole log's expiry."""
        ...

    async def append_logs(
        self, entries: list[tuple[str, bytes]], max_len: int | None = None, ttl: float | None = None
    ) -> None:
        """Several appends (to one or many logs) in one round trip.

        Atomic per slot group (proxy/store/keys.py: a session's logs together): on a
        sharded backend the appends to logs of different groups are separate transactions."""
        ...

    async def write_batch(self, writes: Writes) -> None:
        """`writes` applied as incr_many, put_json, put_json_if_absent and append_logs would, in that order."""
        ...

    async def read_log(self, key: str, start: int = 0, end: int = -1) -> list[bytes]:
        """Entries ``start..end`` inclusive; negative indexes count from the end (like LRANGE)."""
        ...

    async def acquire_lock(self, name: str, lease: float) -> str | None:
        """A fresh token if the lock was free or its lease had run out, else None."""
        ...

    async def renew_lock(self, name: str, token: str, lease: float) -> bool: ...

    async def release_lock(self, name: str, token: str) -> bool: ...

    async def ping(self) -> bool:
        """True if the backend answers; never raises."""
        ...

    async def close(self) -> None: ...


class SharedOpsMixin:
    """Operations written once on top of each backend's primitives, so both backends agree byte for byte:
    JSON records over blobs, a single log append over the batched one."""

    async def append_log(self: Store, key: str, value: bytes, max_len: int | None = None,
                         ttl: float | None = None) -> None:
        await self.append_logs([(key, value)], max_len, ttl)

    async def get_json(self: Store, key: str) -> Any | None:
        raw = await self.get(key)
        if raw is None:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise StoreError(f"record at {key!r} is not valid JSON") from exc

    async def put_json(self: Store, key: str, value: Any, ttl: float | None = None) -> None:
        await self.put(key, orjson.dumps(value), ttl)

    async def put_json_if_absent(self: Store, key: str, value: Any, ttl: float | None = None) -> bool:
        return await self.put_if_absent(key, orjson.dumps(value), ttl)

    async def write_batch(self: Store, writes: Writes) -> None:
        """One call per write, in the contract's order (a backend with a cheaper way overrides this)."""
        if writes.amounts:
            await self.incr_many(writes.amounts)
        for key, value in writes.records.items():
            await self.put(key, orjson.dumps(value), writes.ttl)
        for key, value in writes.records_if_absent.items():
            await self.put_if_absent(key, orjson.dumps(value), writes.ttl)
        for entries, max_len in writes.logs:
            if entries:
                await self.append_logs(entries, max_len, writes.ttl)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_ttl(ttl: float | None) -> float | None:
    """Validate a TTL (or lock lease) in seconds; ``None`` means no expiry."""
    if ttl is None:
        return None
    if not _is_number(ttl) or ttl <= 0:
        raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
    return float(ttl)


def ttl_ms(ttl: float) -> int:
    """A validated TTL in whole milliseconds, never below ``MIN_TTL_MS``."""
    return max(MIN_TTL_MS, round(ttl * MS_PER_S))


def check_max_len(max_len: int | None) -> int | None:
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise ValueError(f"max_len must be a positive int or None, got {max_len!r}")
    return max_len


def check_counted(key: str, group: str, quota: int) -> int:
    """The quota of a counted put, checked with its key and group.

    A counted blob must share its group's slot group: eviction deletes blobs and bookkeeping in one step,
    which a sharded backend can do only inside one slot. Checked on every backend, so a caller that breaks
    the rule finds out on the embedded one, not first on a cluster."""
    if isinstance(quota, bool) or not isinstance(quota, int) or quota < 1:
        raise ValueError(f"quota must be a positive int of bytes, got {quota!r}")
    if not slot_group(group) or slot_group(key) != slot_group(group):
        raise ValueError(f"counted key {key!r} and group {group!r} must share one non-empty slot group "
                         "(proxy/store/keys.py: the same tenant, or the same session)")
    return quota


def check_amount(amount: int | float) -> int | float:
    if not _is_number(amount):
        raise TypeError(f"counter amount must be a finite int or float, got {amount!r}")
    return amount


def as_number(value: int | float) -> int | float:
    """Counters read back as int when integral, else float (the same on every backend)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def incr_result(amount: int | float, total: int | float) -> int | float:
    """What ``incr`` returns: a float for float amounts, else ``as_number(total)``."""
    return float(total) if isinstance(amount, float) else as_number(total)


def new_lock_token() -> str:
    return secrets.token_hex(LOCK_TOKEN_BYTES)
