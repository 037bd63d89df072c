"""The accounting's batch on SQLite: a few statements whatever its size, with the row-by-row statements' results.

A statement per row starved for the GIL under load (proxy/store/sqlite_sets.py says how), so the count of
statements is what is pinned here; the tables after a run of batches are compared with the row-by-row writes'.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from proxy.store import sqlite as sqlite_store
from proxy.store import sqlite_sets
from proxy.store.base import Writes
from proxy.store.sqlite import SqliteStore


def _connection() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.executescript(sqlite_store._SCHEMA)
    return conn


def _tables(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
            for t in ("counters", "blobs", "log_meta", "log_items")}


def _batch(rng: random.Random, n: int) -> tuple[dict[str, int | float], dict[str, bytes], list[tuple[str, bytes]]]:
    amounts: dict[str, int | float] = {}
    for _ in range(n):
        key = f"c{rng.randrange(12)}|é"
        amounts[key] = rng.choice([1, 7, -3, 2 ** 60, 0.25, 1e-7, 2 ** 53 + 1])
    blobs = {f"b{rng.randrange(8)}": rng.choice([b'{"a":1}', "ß\u2028😀".encode(), b"\xff\xfe", b"a\0b", b""])
             for _ in range(n)}
    entries = [(f"log{rng.randrange(4)}", rng.choice([b'{"n":%d}' % i, "ü\t\"\\".encode(), b"\x80", b"x\0"]))
               for i in range(n)]
    return amounts, blobs, entries


def _apply(conn: sqlite3.Connection, rng: random.Random, now: float) -> None:
    amounts, blobs, entries = _batch(rng, rng.randrange(1, 30))
    ttl = rng.choice([None, 5.0])
    max_len = rng.choice([None, 1, 3, 10])
    absent = rng.random() < 0.5

    row_sql = sqlite_store._UPSERT_BLOB_IF_ABSENT if absent else sqlite_store._UPSERT_BLOB

    conn.execute("BEGIN IMMEDIATE")
    sqlite_sets.add_counters(conn, amounts, sqlite_store._INCR)
    sqlite_sets.put_blobs(conn, blobs, ttl, now, absent, row_sql)
    if rng.random() < 0.7:  # else entries that JSON cannot carry are left out: the set path runs
        entries = [(k, v) for k, v in entries if b"\0" not in v and v != b"\x80"]
    sqlite_sets.append_logs(conn, entries, max_len, ttl, now)
    conn.execute("COMMIT")


@pytest.mark.parametrize("seed", range(6))
def test_set_writes_leave_what_row_writes_leave(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    sets_conn, rows_conn = _connection(), _connection()
    for conn, available in ((sets_conn, True), (rows_conn, False)):
        monkeypatch.setattr(sqlite_sets, "AVAILABLE", available)
        rng, now = random.Random(seed), 1000.0
        for _ in range(25):
            now += rng.choice([0.5, 1.0, 6.0])  # 6 s: a 5 s ttl has expired, the log starts again
            _apply(conn, rng, now)
    got, want = _tables(sets_conn), _tables(rows_conn)
    assert got == want
    assert want["log_items"] and want["counters"] and want["blobs"]  # the run wrote something of each


async def test_a_batch_of_hundreds_of_requests_is_a_few_statements(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    try:
        await store.write_batch(Writes(amounts={"warm": 1}))
        statements: list[str] = []
        await store._run("trace", lambda conn, p: conn.set_trace_callback(statements.append))
        requests = 300
        logs = [(f"t:{i % 16}:timeline", b'{"request":%d}' % i) for i in range(requests)]
        await store.write_batch(Writes(
            ttl=3600.0, amounts={f"stats|{k}": 3 for k in range(40)},
            records={f"meta:{i % 16}": {"last": i} for i in range(requests)},
            records_if_absent={f"first:{i % 16}": i for i in range(requests)},
            logs=[(logs, 500), ([(k.replace("timeline", "inspect"), v) for k, v in logs], 100)]))
        await store._run("trace", lambda conn, p: conn.set_trace_callback(None))
        assert len(statements) <= 20, statements  # a statement per row was over 3,000
        assert len(await store.read_log("t:3:timeline")) == requests // 16 + (3 < requests % 16)
        assert await store.get_counter("stats|7") == 3
    finally:
        await store.close()
