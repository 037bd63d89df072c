"""Several processes on one SQLite file (`serve --workers N` on the default store) stay exact.

Each process opens its own SqliteStore on the same file and all of them start
each operation at the same moment; what they did together is then read back and
must be what one process doing it all would have left: one put_if_absent
winner, counters and logs without a lost update, the counted quota held with
the evictions accounted, and a lock that only one holder at a time has (a
read-modify-write under it loses nothing).
"""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from proxy.store.sqlite import SqliteStore

PROCESSES = 4
ROUNDS = 25  # increments, appends, counted puts and locked updates per process
BLOB = 100  # bytes of each counted blob
QUOTA = 1_000  # bytes the counted group may hold: far fewer than PROCESSES * ROUNDS blobs
BUSY_S = 30.0  # a process waits this long for the file's write lock: under contention nothing fails


async def _race(path: str, me: int, start: Barrier) -> dict[str, Any]:
    store = SqliteStore(path, busy_timeout=BUSY_S)
    await store.ping()  # opened (schema, WAL) before the race starts
    await asyncio.to_thread(start.wait)
    won = await store.put_if_absent("race:first", str(me).encode())
    evicted = 0
    locked_updates = 0
    for i in range(ROUNDS):
        await store.incr("race:count")
        await store.incr_many({"race:many:a": 1, "race:many:b": 2})
        await store.append_log("race:log", f"{me}:{i}".encode())
        evicted += await store.put_counted(f"t:race:blob:{me}:{i}", b"x" * BLOB, "t:race:group", QUOTA)
        while (token := await store.acquire_lock("race:lock", lease=60)) is None:
            await asyncio.sleep(0.001)
        value = int((await store.get("race:guarded")) or b"0")  # not atomic by itself: only the lock protects it
        await asyncio.sleep(0)
        await store.put("race:guarded", str(value + 1).encode())
        assert await store.release_lock("race:lock", token)
        locked_updates += 1
    await store.close()
    return {"won": won, "evicted": evicted, "locked": locked_updates}


def _process(path: str, me: int, start: Barrier, results: Any) -> None:
    results.put((me, asyncio.run(_race(path, me, start))))


async def _read(path: str) -> dict[str, Any]:
    store = SqliteStore(path)
    blobs = await store.get_many([f"t:race:blob:{p}:{i}" for p in range(PROCESSES) for i in range(ROUNDS)])
    out = {"first": await store.get("race:first"), "count": await store.get_counter("race:count"),
           "a": await store.get_counter("race:many:a"), "b": await store.get_counter("race:many:b"),
           "log": await store.read_log("race:log"), "kept": sum(b is not None for b in blobs),
           "counted": await store.counted_bytes("t:race:group"), "guarded": await store.get("race:guarded")}
    await store.close()
    return out


def test_processes_racing_on_one_file_leave_exact_results(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.db")
    ctx = multiprocessing.get_context("spawn")  # as uvicorn starts its workers
    start, results = ctx.Barrier(PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_process, args=(path, me, start, results)) for me in range(PROCESSES)]
    for p in procs:
        p.start()
    done = dict(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    state = asyncio.run(_read(path))

    winners = [me for me, r in done.items() if r["won"]]
    assert len(winners) == 1 and state["first"] == str(winners[0]).encode()
    total = PROCESSES * ROUNDS
    assert (state["count"], state["a"], state["b"]) == (total, total, 2 * total)
    assert sorted(state["log"]) == sorted(f"{p}:{i}".encode() for p in range(PROCESSES) for i in range(ROUNDS))
    assert state["counted"] == state["kept"] * BLOB <= QUOTA
    assert sum(r["evicted"] for r in done.values()) == total - state["kept"]
    assert state["guarded"] == str(sum(r["locked"] for r in done.values())).encode() == str(total).encode()
