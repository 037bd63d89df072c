"""The accounting's batch written to SQLite in a few set-based statements, however many rows it holds.

Why: the store's thread releases the GIL for every statement it steps and must win it back to go on; while the
event loop is busy (16 agents at once) each win waits up to the interpreter's switch interval (5 ms). Written a
statement per row (a dozen per request), a batch of a few hundred requests took seconds, passed the store
timeout, and the guarded store then forwarded every request unmodified ("store-unavailable"). Here each kind of
write is one statement over a JSON array (SQLite's json_each), so a batch is about twenty statements, whatever
its size. The results are those of the row-by-row statements (tests/test_sqlite_sets.py compares both).

What JSON cannot carry exactly goes row by row, as before: a log entry or record that is not UTF-8 text (or holds
a NUL), a counter amount that is not an integer within 2**53.
"""

from __future__ import annotations

import sqlite3

import orjson

# json_each and json_extract are built into SQLite from 3.38 (a build without them writes row by row).
AVAILABLE = sqlite3.sqlite_version_info >= (3, 38, 0)
_EXACT_INT = 2 ** 53  # integers below it are exact in a REAL counter and in SQLite's JSON parsing

_INCR_SET = (
    "INSERT INTO counters (key, value) SELECT key, value FROM json_each(?) WHERE true"
    " ON CONFLICT (key) DO UPDATE SET value = value + excluded.value"
)
_BLOBS_SET = (
    "INSERT INTO blobs (key, value, expires_at) SELECT key, CAST(value AS BLOB), :now + :ttl FROM json_each(:set)"
    " WHERE true ON CONFLICT (key) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at"
)
# An expired row counts as absent, so the upsert may take it over.
_BLOBS_SET_IF_ABSENT = _BLOBS_SET + " WHERE blobs.expires_at IS NOT NULL AND blobs.expires_at <= :now"
# A log whose expiry has passed is dropped before it is appended to (it starts again at seq 0).
_EXPIRED_LOGS = ("SELECT m.key FROM log_meta m JOIN json_each(:keys) j ON m.key = j.value"
                 " WHERE m.expires_at IS NOT NULL AND m.expires_at <= :now")
_CLEAR_ITEMS = f"DELETE FROM log_items WHERE key IN ({_EXPIRED_LOGS})"
_CLEAR_META = f"DELETE FROM log_meta WHERE key IN ({_EXPIRED_LOGS})"
# items: [key, position among this batch's entries of that key, text]; numbered after the log's last.
_APPEND_ITEMS = (
    "INSERT INTO log_items (key, seq, value)"
    " SELECT json_extract(j.value, '$[0]'), COALESCE(m.next_seq, 0) + json_extract(j.value, '$[1]'),"
    " CAST(json_extract(j.value, '$[2]') AS BLOB)"
    " FROM json_each(:items) j LEFT JOIN log_meta m ON m.key = json_extract(j.value, '$[0]')"
)
# counts: {key: entries appended}; the expiry is renewed when the batch has a ttl, else kept.
_ADVANCE_META = (
    "INSERT INTO log_meta (key, next_seq, expires_at)"
    " SELECT j.key, COALESCE(m.next_seq, 0) + j.value, COALESCE(:now + :ttl, m.expires_at)"
    " FROM json_each(:counts) j LEFT JOIN log_meta m ON m.key = j.key WHERE true"
    " ON CONFLICT (key) DO UPDATE SET next_seq = excluded.next_seq, expires_at = excluded.expires_at"
)
# Each log keeps its newest max_len entries.
_TRIM = (
    "DELETE FROM log_items WHERE (key, seq) IN (SELECT li.key, li.seq FROM json_each(:keys) j"
    " JOIN log_meta m ON m.key = j.value JOIN log_items li ON li.key = m.key AND li.seq <= m.next_seq - 1 - :max_len)"
)

def _as_text(value: bytes) -> str | None:
    """`value` as a string JSON carries byte for byte, or None (always, on a SQLite without JSON)."""
    if not AVAILABLE or b"\0" in value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def add_counters(conn: sqlite3.Connection, amounts: dict[str, int | float], row_wise: str) -> None:
    """Counters added to: exact integers in one statement, any other amount by `row_wise` (the per-row upsert,
    binding :key and :amount)."""
    whole = {k: v for k, v in amounts.items() if AVAILABLE and isinstance(v, int) and -_EXACT_INT < v < _EXACT_INT}
    rest = [(k, v) for k, v in amounts.items() if k not in whole]
    if whole:
        try:
            conn.execute(_INCR_SET, (orjson.dumps(whole),))
        except orjson.JSONEncodeError:  # a key no JSON holds (a lone surrogate): every one row by row
            rest = list(amounts.items())
    if rest:
        conn.executemany(row_wise, ({"key": k, "amount": v} for k, v in rest))


def put_blobs(conn: sqlite3.Connection, values: dict[str, bytes], ttl: float | None, now: float, if_absent: bool,
              row_wise: str) -> None:
    """Blobs put (or put unless present and live), in one statement; what JSON cannot carry by `row_wise` (the
    per-row upsert of the same kind)."""
    texts: dict[str, str] = {}
    rest: list[str] = []
    for key, value in values.items():
        text = _as_text(value)
        if text is None:
            rest.append(key)
        else:
            texts[key] = text
    if texts:
        try:
            payload = orjson.dumps(texts)
        except orjson.JSONEncodeError:  # a key or text no JSON holds (a lone surrogate): every one row by row
            rest = list(values)
        else:
            conn.execute(_BLOBS_SET_IF_ABSENT if if_absent else _BLOBS_SET, {"set": payload, "ttl": ttl, "now": now})
    for key in rest:
        conn.execute(row_wise, {"key": key, "value": values[key], "ttl": ttl, "now": now})


def append_logs(conn: sqlite3.Connection, entries: list[tuple[str, bytes]], max_len: int | None,
                ttl: float | None, now: float) -> None:
    """Entries appended to their logs in order, each log trimmed to `max_len`, in five statements; the whole
    list goes row by row (`append_rows`) when an entry is not text JSON carries exactly (order must hold)."""
    items: list[list[object]] = []
    counts: dict[str, int] = {}
    for key, value in entries:
        text = _as_text(value)
        if text is None:
            append_rows(conn, entries, max_len, ttl, now)
            return
        n = counts.get(key, 0)
        items.append([key, n, text])
        counts[key] = n + 1
    if not items:
        return
    try:
        keys, payload, counted = orjson.dumps(list(counts)), orjson.dumps(items), orjson.dumps(counts)
    except orjson.JSONEncodeError:
        append_rows(conn, entries, max_len, ttl, now)
        return
    conn.execute(_CLEAR_ITEMS, {"keys": keys, "now": now})
    conn.execute(_CLEAR_META, {"keys": keys, "now": now})
    conn.execute(_APPEND_ITEMS, {"items": payload})
    conn.execute(_ADVANCE_META, {"counts": counted, "ttl": ttl, "now": now})
    if max_len is not None:
        conn.execute(_TRIM, {"keys": keys, "max_len": max_len})


def append_rows(conn: sqlite3.Connection, entries: list[tuple[str, bytes]], max_len: int | None, ttl: float | None,
                now: float) -> None:
    """The appends one statement at a time (what JSON cannot carry), inside the caller's transaction."""
    for key, value in entries:
        meta = conn.execute("SELECT next_seq, expires_at FROM log_meta WHERE key = ?", (key,)).fetchone()
        if meta is not None and meta[1] is not None and meta[1] <= now:  # expired: the log starts again at seq 0
            conn.execute("DELETE FROM log_items WHERE key = ?", (key,))
            meta = None
        seq, expires_at = meta or (0, None)
        if ttl is not None:
            expires_at = now + ttl
        conn.execute(
            "INSERT INTO log_meta (key, next_seq, expires_at) VALUES (?, ?, ?) ON CONFLICT (key)"
            " DO UPDATE SET next_seq = excluded.next_seq, expires_at = excluded.expires_at",
            (key, seq + 1, expires_at),
        )
        conn.execute("INSERT INTO log_items (key, seq, value) VALUES (?, ?, ?)", (key, seq, bytes(value)))
        if max_len is not None:
            conn.execute("DELETE FROM log_items WHERE key = ? AND seq <= ?", (key, seq - max_len))
