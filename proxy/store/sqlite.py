"""Embedded SQLite backend: the default store, one file, no server."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson

from . import sqlite_sets as sets
from .base import (
    MAX_EVICTIONS_PER_PUT,
    SharedOpsMixin,
    StoreError,
    Writes,
    as_number,
    check_amount,
    check_counted,
    check_max_len,
    check_ttl,
    incr_result,
    new_lock_token,
)

# How long a call waits for another process's lock on the same file before failing (seconds);
# open_store passes the configured store_timeout. A locked file must not stall requests:
# the worker thread gives up by itself, so no call queued behind it waits much longer.
BUSY_TIMEOUT_S = 0.5
# Minimum seconds between opportunistic purges of expired rows during writes.
PURGE_INTERVAL_S = 60.0
# Keys bound per "SELECT ... IN (...)"; well under SQLite's host-parameter limit.
MAX_IN_PARAMS = 500
# Highest Unicode code point and the UTF-16 surrogate gap (not storable as UTF-8 text).
MAX_CODEPOINT = 0x10FFFF
SURROGATE_FIRST, SURROGATE_LAST = 0xD800, 0xDFFF
MEMORY_PATH = ":memory:"
# Pause between retries of connection setup while another process holds the file.
SETUP_RETRY_S = 0.01
# Extended SQLite result codes keep the primary code in their low byte.
PRIMARY_CODE_MASK = 0xFF

_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires_at REAL);
CREATE INDEX IF NOT EXISTS blobs_expiry ON blobs (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS counters (key TEXT PRIMARY KEY, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS log_meta (key TEXT PRIMARY KEY, next_seq INTEGER NOT NULL, expires_at REAL);
CREATE TABLE IF NOT EXISTS log_items (
    key TEXT NOT NULL, seq INTEGER NOT NULL, value BLOB NOT NULL, PRIMARY KEY (key, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS locks (name TEXT PRIMARY KEY, token TEXT NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS counted (
    seq INTEGER PRIMARY KEY, key TEXT NOT NULL UNIQUE, grp TEXT NOT NULL, size INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS counted_order ON counted (grp, seq);
CREATE TABLE IF NOT EXISTS counted_bytes (grp TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
"""
_LIVE = "(expires_at IS NULL OR expires_at > :now)"
# ":now + :ttl" is NULL (never expires) when ttl is None.
_UPSERT_BLOB = (
    "INSERT INTO blobs (key, value, expires_at) VALUES (:key, :value, :now + :ttl)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
)
# An expired row counts as absent, so the upsert may take it over.
_UPSERT_BLOB_IF_ABSENT = _UPSERT_BLOB + " WHERE blobs.expires_at IS NOT NULL AND blobs.expires_at <= :now"
_INCR = (
    "INSERT INTO counters (key, value) VALUES (:key, :amount)"
    " ON CONFLICT (key) DO UPDATE SET value = value + excluded.value"
)
# Counted blobs that expired give their bytes back before the blobs themselves go.
_EXPIRED_COUNTED = (
    "SELECT c.grp, SUM(c.size) FROM blobs b JOIN counted c ON c.key = b.key WHERE b.expires_at <= :now GROUP BY c.grp"
)
_PURGE = (
    "DELETE FROM counted WHERE key IN (SELECT key FROM blobs WHERE expires_at <= :now)",
    "DELETE FROM blobs WHERE expires_at <= :now",
    "DELETE FROM locks WHERE expires_at <= :now",
    "DELETE FROM log_items WHERE key IN (SELECT key FROM log_meta WHERE expires_at <= :now)",
    "DELETE FROM log_meta WHERE expires_at <= :now",
)

T = TypeVar("T")
Params = dict[str, Any]


class SqliteStore(SharedOpsMixin):
    """The proxy's state in a single SQLite file, so one replica needs no other service.

    Durable: WAL + synchronous=NORMAL, so a handle written before a restart resolves
    after it (a power cut may lose only the last few commits, never corrupt the file).
    All access runs on one dedicated worker thread, so the event loop never blocks on
    disk and this instance's operations are serialized. Conditional writes are single
    upsert statements or BEGIN IMMEDIATE transactions, so they stay atomic against
    other processes on the same file (which wait up to ``busy_timeout`` seconds, then
    fail with ``StoreError``: a locked file degrades requests, it does not stall them).
    Expiry uses wall-clock time, so TTLs survive restarts. Counters are REAL: exact
    for integers up to 2**53.
    """

    def __init__(self, path: str | Path, busy_timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = str(path)
        self.busy_timeout = busy_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxproxy-sqlite")
        self._conn: sqlite3.Connection | None = None  # created and used only on the worker thread
        self._next_purge = 0.0
        self._closed = False

    async def _run(self, op: str, fn: Callable[[sqlite3.Connection, Params], T], **params: Any) -> T:
        """Run ``fn(conn, params)`` on the worker thread; ``params["now"]`` is bound there."""
        if self._closed:
            raise StoreError(f"sqlite {op}: store is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._call, fn, params)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"sqlite {op} failed on {self.path}: {exc}") from exc

    def _call(self, fn: Callable[[sqlite3.Connection, Params], T], params: Params) -> T:
        conn = self._connection()
        params["now"] = time.time()
        return fn(conn, params)

    async def _rows(self, op: str, sql: str, **params: Any) -> list[Any]:
        return await self._run(op, lambda conn, p: conn.execute(sql, p).fetchall(), **params)

    async def _changed(self, op: str, sql: str, **params: Any) -> bool:
        """Run one write statement; True if it changed exactly one row."""

        def write(conn: sqlite3.Connection, p: Params) -> bool:
            self._maybe_purge(conn, p["now"])
            return conn.execute(sql, p).rowcount == 1

        return await self._run(op, write, **params)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        if self.path != MEMORY_PATH:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                conn.execute(f"PRAGMA busy_timeout = {round(self.busy_timeout * 1000)}")
                # Switching a fresh file to WAL fails at once (no busy wait) if another
                # process is opening it too; every setup step is idempotent, so retry.
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.executescript(_SCHEMA)
                self._purge(conn, time.time())
                break
            except BaseException as exc:
                if _is_busy(exc) and time.monotonic() < deadline:
                    time.sleep(SETUP_RETRY_S)
                    continue
                conn.close()
                raise
        self._conn = conn
        return conn

    def _purge(self, conn: sqlite3.Connection, now: float) -> None:
        with _transaction(conn, "BEGIN IMMEDIATE"):
            for grp, freed in conn.execute(_EXPIRED_COUNTED, {"now": now}).fetchall():
                conn.execute("UPDATE counted_bytes SET bytes = bytes - ? WHERE grp = ?", (freed, grp))
            for sql in _PURGE:
                conn.execute(sql, {"now": now})
        self._next_purge = now + PURGE_INTERVAL_S

    def _maybe_purge(self, conn: sqlite3.Connection, now: float) -> None:
        if now >= self._next_purge:
            self._purge(conn, now)

    # Blobs and JSON records.

    async def get(self, key: str) -> bytes | None:
        rows = await self._rows("get", f"SELECT value FROM blobs WHERE key = :key AND {_LIVE}", key=key)
        return bytes(rows[0][0]) if rows else None

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._changed("put", _UPSERT_BLOB, key=key, value=bytes(value), ttl=check_ttl(ttl))

    async def live_blobs(self) -> list[tuple[str, bytes, float | None]]:
        """Every unexpired blob: key, value and the seconds it has left (None: no expiry)."""
        rows = await self._rows("live_blobs", f"SELECT key, value, expires_at FROM blobs WHERE {_LIVE}")
        now = time.time()
        return [(k, bytes(v), None if exp is None else max(1.0, exp - now)) for k, v, exp in rows]

    async def put_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return await self._changed("put_if_absent", _UPSERT_BLOB_IF_ABSENT, key=key, value=bytes(value),
                                   ttl=check_ttl(ttl))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []

        def read(conn: sqlite3.Connection, p: Params) -> dict[str, bytes]:
            found: dict[str, bytes] = {}
            unique = list(dict.fromkeys(keys))
            with _transaction(conn, "BEGIN"):  # one snapshot across chunks
                for i in range(0, len(unique), MAX_IN_PARAMS):
                    chunk = unique[i : i + MAX_IN_PARAMS]
                    marks = ",".join(f":k{j}" for j in range(len(chunk)))
                    binds = {f"k{j}": k for j, k in enumerate(chunk)} | {"now": p["now"]}
                    rows = conn.execute(f"SELECT key, value FROM blobs WHERE key IN ({marks}) AND {_LIVE}", binds)
                    found.update((k, bytes(v)) for k, v in rows)
            return found

        found = await self._run("get_many", read)
        return [found.get(k) for k in keys]

    async def delete(self, key: str) -> None:
        def forget(conn: sqlite3.Connection, p: Params) -> None:
            with _transaction(conn, "BEGIN IMMEDIATE"):
                for table in ("blobs", "counters", "log_meta", "log_items"):
                    conn.execute(f"DELETE FROM {table} WHERE key = :key", p)

        await self._run("delete", forget, key=key)

    async def put_counted(self, key: str, value: bytes, group: str, quota: int, ttl: float | None = None) -> int:
        ttl, quota = check_ttl(ttl), check_counted(key, group, quota)

        def write(conn: sqlite3.Connection, p: Params) -> int:
            self._maybe_purge(conn, p["now"])
            with _transaction(conn, "BEGIN IMMEDIATE"):  # one writer at a time on the file: atomic across processes
                old = conn.execute("DELETE FROM counted WHERE key = ? RETURNING size, grp", (key,)).fetchone()
                if old is not None:
                    conn.execute("UPDATE counted_bytes SET bytes = bytes - ? WHERE grp = ?", old)
                conn.execute(_UPSERT_BLOB, {"key": key, "value": bytes(value), "now": p["now"], "ttl": ttl})
                conn.execute("INSERT INTO counted (key, grp, size) VALUES (?, ?, ?)", (key, group, len(value)))
                (used,) = conn.execute(
                    "INSERT INTO counted_bytes (grp, bytes) VALUES (?, ?) ON CONFLICT (grp)"
                    " DO UPDATE SET bytes = bytes + excluded.bytes RETURNING bytes", (group, len(value))).fetchone()
                evicted = 0
                oldest = conn.execute(
                    "SELECT seq, key, size FROM counted WHERE grp = ? AND key != ? ORDER BY seq LIMIT ?",
                    (group, key, MAX_EVICTIONS_PER_PUT)) if used > quota else ()
                for seq, doomed, size in list(oldest):
                    if used <= quota:
                        break
                    conn.execute("DELETE FROM blobs WHERE key = ?", (doomed,))
                    conn.execute("DELETE FROM counted WHERE seq = ?", (seq,))
                    used -= size
                    evicted += 1
                if evicted:
                    conn.execute("UPDATE counted_bytes SET bytes = ? WHERE grp = ?", (used, group))
                return evicted

        return await self._run("put_counted", write)

    async def counted_bytes(self, group: str) -> int:
        rows = await self._rows("counted_bytes", "SELECT bytes FROM counted_bytes WHERE grp = :grp", grp=group)
        return int(rows[0][0]) if rows else 0

    async def keys(self, prefix: str) -> list[str]:
        where, bounds = _prefix_clause(prefix)
        rows = await self._rows("keys", f"SELECT key FROM blobs WHERE {where} AND {_LIVE}", **bounds)
        return sorted(k for (k,) in rows)

    # Counters (no expiry).

    async def incr(self, key: str, amount: int | float = 1) -> int | float:
        # fetchall() finishes the statement, so the write commits before returning.
        rows = await self._rows("incr", _INCR + " RETURNING value", key=key, amount=check_amount(amount))
        return incr_result(amount, rows[0][0])

    async def incr_many(self, amounts: dict[str, int | float]) -> None:
        await self._write("incr_many", Writes(amounts=amounts))

    async def get_counter(self, key: str) -> int | float:
        rows = await self._rows("get_counter", "SELECT value FROM counters WHERE key = :key", key=key)
        return as_number(rows[0][0]) if rows else 0

    async def counters(self, prefix: str) -> dict[str, int | float]:
        where, bounds = _prefix_clause(prefix)
        rows = await self._rows("counters", f"SELECT key, value FROM counters WHERE {where}", **bounds)
        return {k: as_number(v) for k, v in rows}

    # Logs: items numbered by seq; log_meta holds the next seq and the whole log's expiry.

    async def append_logs(
        self, entries: list[tuple[str, bytes]], max_len: int | None = None, ttl: float | None = None
    ) -> None:
        check_max_len(max_len)  # even with no entries to append
        await self._write("append_logs", Writes(ttl=ttl, logs=[(entries, max_len)]))

    async def write_batch(self, writes: Writes) -> None:
        """One thread hop and one transaction for the accounting's whole batch, in a few set-based statements
        (proxy/store/sqlite_sets.py: a statement per row starved for the GIL under load)."""
        await self._write("write_batch", writes)

    async def _write(self, op: str, writes: Writes) -> None:
        """`writes` in one transaction (incr_many and append_logs are batches of one kind of write)."""
        ttl = check_ttl(writes.ttl)
        for amount in writes.amounts.values():
            check_amount(amount)
        logs = [(entries, check_max_len(max_len)) for entries, max_len in writes.logs if entries]
        records = {k: orjson.dumps(v) for k, v in writes.records.items()}
        absent = {k: orjson.dumps(v) for k, v in writes.records_if_absent.items()}

        def write(conn: sqlite3.Connection, p: Params) -> None:
            now = p["now"]
            self._maybe_purge(conn, now)
            with _transaction(conn, "BEGIN IMMEDIATE"):
                sets.add_counters(conn, writes.amounts, _INCR)
                sets.put_blobs(conn, records, ttl, now, False, _UPSERT_BLOB)
                sets.put_blobs(conn, absent, ttl, now, True, _UPSERT_BLOB_IF_ABSENT)
                for entries, max_len in logs:
                    sets.append_logs(conn, entries, max_len, ttl, now)

        if writes.amounts or records or absent or logs:
            await self._run(op, write)

    async def read_log(self, key: str, start: int = 0, end: int = -1) -> list[bytes]:
        def read(conn: sqlite3.Connection, p: Params) -> list[bytes]:
            with _transaction(conn, "BEGIN"):  # count and slice from one snapshot
                (n,) = conn.execute("SELECT COUNT(*) FROM log_items WHERE key = :key AND EXISTS"
                                    f" (SELECT 1 FROM log_meta WHERE key = :key AND {_LIVE})", p).fetchone()
                lo, hi = _lrange_bounds(n, start, end)
                if lo > hi:
                    return []
                rows = conn.execute(
                    "SELECT value FROM log_items WHERE key = ? ORDER BY seq LIMIT ? OFFSET ?", (key, hi - lo + 1, lo)
                )
                return [bytes(v) for (v,) in rows]

        return await self._run("read_log", read, key=key)

    # Locks: a row per name; an expired row is free for the taking.

    async def acquire_lock(self, name: str, lease: float) -> str | None:
        token = new_lock_token()
        sql = (
            "INSERT INTO locks (name, token, expires_at) VALUES (:name, :token, :now + :lease)"
            " ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at"
            " WHERE locks.expires_at <= :now"
        )
        won = await self._changed("acquire_lock", sql, name=name, token=token, lease=check_ttl(lease))
        return token if won else None

    async def renew_lock(self, name: str, token: str, lease: float) -> bool:
        sql = "UPDATE locks SET expires_at = :now + :lease WHERE name = :name AND token = :token AND expires_at > :now"
        return await self._changed("renew_lock", sql, name=name, token=token, lease=check_ttl(lease))

    async def release_lock(self, name: str, token: str) -> bool:
        sql = "DELETE FROM locks WHERE name = :name AND token = :token AND expires_at > :now"
        return await self._changed("release_lock", sql, name=name, token=token)

    # Lifecycle.

    async def ping(self) -> bool:
        try:
            await self._rows("ping", "SELECT 1")
        except Exception:
            return False
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        finally:
            self._executor.shutdown(wait=False)


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    conn.execute(begin)
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _is_busy(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.OperationalError) else None
    return code is not None and code & PRIMARY_CODE_MASK in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _lrange_bounds(n: int, start: int, end: int) -> tuple[int, int]:
    """Redis LRANGE index rules: negatives count from the end, out-of-range ends are clamped."""
    lo = start + n if start < 0 else start
    hi = end + n if end < 0 else end
    return max(lo, 0), min(hi, n - 1)


def _prefix_clause(prefix: str) -> tuple[str, dict[str, str]]:
    """An index-friendly ``key`` range covering exactly the keys that start with ``prefix``."""
    stem = prefix.rstrip(chr(MAX_CODEPOINT))
    if not stem:
        return "key >= :lo", {"lo": prefix}
    nxt = ord(stem[-1]) + 1
    if SURROGATE_FIRST <= nxt <= SURROGATE_LAST:
        nxt = SURROGATE_LAST + 1
    return "key >= :lo AND key < :hi", {"lo": prefix, "hi": stem[:-1] + chr(nxt)}
