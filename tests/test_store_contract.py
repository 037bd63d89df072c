"""One behavioural contract, run against every Store backend (SQLite file and real Redis: one server,
a Redis Cluster, a Sentinel-managed primary).

Redis tests use CTXPROXY_TEST_REDIS_URL (default redis://127.0.0.1:6379/15) under a
random key prefix per test, removed afterwards. If Redis is unreachable they FAIL,
unless CTXPROXY_SKIP_REDIS=1, in which case they skip. The cluster and the Sentinel
set are started locally (tests/redis_topology.py); on the cluster, no node may have
answered CROSSSLOT when a test ends.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis
from silent_server import SilentServer

from proxy.store import RedisStore, SqliteStore, Store, StoreError, open_store
from proxy.store.base import Writes

REDIS_URL = os.environ.get("CTXPROXY_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
SKIP_REDIS = os.environ.get("CTXPROXY_SKIP_REDIS") == "1"
# Short TTLs/leases keep the suite fast; the sleeps leave a wide margin past them.
SHORT_TTL = 0.2
PAST_SHORT_TTL = 0.3  # asyncio.sleep only ever sleeps longer; both backends expire by the wall clock, to the ms
CONCURRENT_CALLS = 20


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


class Backend:
    """Opens store instances that share one backend: the same SQLite file, or the same Redis db+prefix."""

    def __init__(self, kind: str, tmp_path: Path, url: str = REDIS_URL) -> None:
        self.kind = kind
        self.url = url
        self.path = tmp_path / "not-yet-created" / "state.db"
        self.prefix = f"ctxproxy-test:{uuid.uuid4().hex}:"
        self.opened: list[Store] = []

    def open(self) -> Store:
        store: Store
        if self.kind == "sqlite":
            store = SqliteStore(self.path)
        else:
            store = RedisStore(self.url, prefix=self.prefix)
        self.opened.append(store)
        return store

    async def cleanup(self) -> None:
        for store in self.opened:
            try:
                await store.close()
            except StoreError:
                pass
        if self.kind == "redis":  # the cluster and the Sentinel set are the suite's own, gone after it
            raw = aioredis.Redis.from_url(REDIS_URL)
            try:
                doomed = [k async for k in raw.scan_iter(match=f"{self.prefix}*")]
                if doomed:
                    await raw.delete(*doomed)
            finally:
                await raw.aclose()


BACKEND_KEY = pytest.StashKey[Backend]()


@pytest.fixture(params=["sqlite", "redis", "cluster", "sentinel"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    topology = None
    if request.param in ("cluster", "sentinel"):
        topology = request.getfixturevalue(f"redis_{request.param}")
    backend = Backend(request.param, tmp_path, REDIS_URL if topology is None else topology.url)
    first = backend.open()
    if backend.kind == "redis" and not await first.ping():
        await first.close()
        where = _redacted(REDIS_URL)
        if SKIP_REDIS:
            pytest.skip(f"Redis unreachable at {where} (CTXPROXY_SKIP_REDIS=1)")
        pytest.fail(
            f"Redis unreachable at {where}; start it, set CTXPROXY_TEST_REDIS_URL, or CTXPROXY_SKIP_REDIS=1",
            pytrace=False,
        )
    request.node.stash[BACKEND_KEY] = backend
    yield first
    await backend.cleanup()
    if request.param == "cluster":
        assert topology.crossslot_errors() == 0, "a cluster node answered CROSSSLOT"


@pytest.fixture
def backend(store: Store, request: pytest.FixtureRequest) -> Backend:
    """The backend behind ``store``, for tests that need a second instance on it."""
    return request.node.stash[BACKEND_KEY]


# ---- blobs and records ------------------------------------------------------------


async def test_store_satisfies_protocol(store: Store) -> None:
    assert isinstance(store, Store)
    assert await store.ping() is True


async def test_blob_round_trips_and_overwrites(store: Store) -> None:
    assert await store.get("t:a:blob:1") is None
    await store.put("t:a:blob:1", b"\x00first\xff")
    assert await store.get("t:a:blob:1") == b"\x00first\xff"
    await store.put("t:a:blob:1", b"second")
    assert await store.get("t:a:blob:1") == b"second"


async def test_blob_survives_reopen(store: Store, backend: Backend) -> None:
    await store.put("t:a:blob:h1", b"payload")
    await store.put_json("t:a:rec:1", {"decision": "keep", "n": 3})
    await store.incr("t:a:tokens", 7)
    await store.append_log("t:a:log", b"event-1")
    await store.close()

    reopened = backend.open()
    assert await reopened.get("t:a:blob:h1") == b"payload"
    assert await reopened.get_json("t:a:rec:1") == {"decision": "keep", "n": 3}
    assert await reopened.get_counter("t:a:tokens") == 7
    assert await reopened.read_log("t:a:log") == [b"event-1"]


async def test_json_record_is_recorded_once(store: Store) -> None:
    first = {"kept": [1, 2, 3], "note": "héllo ✓", "nested": {"ok": True, "none": None}}
    assert await store.put_json_if_absent("t:a:decision:9", first) is True
    assert await store.put_json_if_absent("t:a:decision:9", {"kept": []}) is False
    assert await store.get_json("t:a:decision:9") == first
    assert await store.get_json("t:a:decision:missing") is None


async def test_get_json_on_non_json_blob_raises_store_error(store: Store) -> None:
    await store.put("t:a:raw", b"\xffnot json")
    with pytest.raises(StoreError):
        await store.get_json("t:a:raw")


async def test_expired_record_is_gone(store: Store) -> None:
    await store.put("t:a:short", b"v", ttl=SHORT_TTL)
    await store.put_json("t:a:short-rec", {"x": 1}, ttl=SHORT_TTL)
    await store.put("t:a:forever", b"f")
    assert await store.get("t:a:short") == b"v"
    assert await store.get_json("t:a:short-rec") == {"x": 1}

    await asyncio.sleep(PAST_SHORT_TTL)
    assert await store.get("t:a:short") is None
    assert await store.get_json("t:a:short-rec") is None
    assert await store.get_many(["t:a:short", "t:a:forever"]) == [None, b"f"]
    assert await store.keys("t:a:") == ["t:a:forever"]
    assert await store.put_if_absent("t:a:short", b"new") is True
    assert await store.get("t:a:short") == b"new"


async def test_put_without_ttl_clears_previous_expiry(store: Store) -> None:
    await store.put("t:a:k", b"v1", ttl=SHORT_TTL)
    await store.put("t:a:k", b"v2")
    await asyncio.sleep(PAST_SHORT_TTL)
    assert await store.get("t:a:k") == b"v2"


async def test_put_if_absent_keeps_first_value_under_concurrency(store: Store, backend: Backend) -> None:
    other = backend.open()
    instances = [store, other]
    values = [f"candidate-{i}".encode() for i in range(CONCURRENT_CALLS)]
    results = await asyncio.gather(
        *(instances[i % 2].put_if_absent("t:a:once", v, ttl=60) for i, v in enumerate(values))
    )
    assert results.count(True) == 1
    winner = values[results.index(True)]
    assert await store.get("t:a:once") == winner
    assert await other.get("t:a:once") == winner


async def test_get_many_preserves_order_duplicates_and_gaps(store: Store) -> None:
    await store.put("t:a:1", b"one")
    await store.put("t:a:2", b"two")
    got = await store.get_many(["t:a:2", "t:a:missing", "t:a:1", "t:a:2"])
    assert got == [b"two", None, b"one", b"two"]
    assert await store.get_many([]) == []


async def test_delete_forgets_blob_counter_and_log(store: Store) -> None:
    for key in ("t:a:x", "stats:a:x"):  # a key of the schema, and one outside it (no slot group)
        await store.put(key, b"v")
        await store.incr(key, 3)
        await store.append_log(key, b"e")
    await store.put("t:a:y", b"kept")
    for key in ("t:a:x", "stats:a:x"):
        await store.delete(key)
        assert await store.get(key) is None
        assert await store.get_counter(key) == 0
        assert await store.read_log(key) == []
    await store.delete("t:a:never-existed")
    assert await store.get("t:a:y") == b"kept"


async def test_keys_with_prefix(store: Store) -> None:
    for key in ["t:a:2", "t:a:1", "t:ab:3", "t:b:1", "t:[a]*?:1"]:
        await store.put(key, b"v")
    await store.put_json("t:a:rec", {"r": 1})
    await store.incr("t:a:counter")  # counters and logs are not blob/record keys
    await store.append_log("t:a:log", b"e")

    assert await store.keys("t:a:") == ["t:a:1", "t:a:2", "t:a:rec"]
    assert await store.keys("t:a") == ["t:a:1", "t:a:2", "t:a:rec", "t:ab:3"]
    assert await store.keys("t:[a]*?:") == ["t:[a]*?:1"]  # glob characters match literally
    assert await store.keys("t:[") == ["t:[a]*?:1"]
    assert await store.keys("t:zz") == []
    assert "t:b:1" in await store.keys("")


# ---- counters ---------------------------------------------------------------------


async def test_incr_int(store: Store) -> None:
    assert await store.get_counter("t:a:n") == 0
    first = await store.incr("t:a:n")
    assert first == 1 and isinstance(first, int)
    assert await store.incr("t:a:n", 41) == 42
    assert await store.incr("t:a:n", -2) == 40
    got = await store.get_counter("t:a:n")
    assert got == 40 and isinstance(got, int)


async def test_incr_float(store: Store) -> None:
    first = await store.incr("t:a:cost", 0.5)
    assert first == 0.5 and isinstance(first, float)
    assert await store.incr("t:a:cost", 1.25) == pytest.approx(1.75)
    assert await store.incr("t:a:cost", 1) == pytest.approx(2.75)  # int onto a fractional counter
    assert await store.get_counter("t:a:cost") == pytest.approx(2.75)
    whole = await store.incr("t:a:cost", 0.25)
    assert whole == 3.0 and isinstance(whole, float)
    assert await store.get_counter("t:a:cost") == 3  # integral counters read back as int
    assert await store.incr("t:a:cost", 2) == 5


async def test_counters_add_up_across_two_store_instances(store: Store, backend: Backend) -> None:
    other = backend.open()
    instances = [store, other]
    await asyncio.gather(*(instances[i % 2].incr("t:a:req") for i in range(50)))
    await asyncio.gather(*(instances[i % 2].incr("t:a:usd", 0.25) for i in range(10)))
    assert await store.get_counter("t:a:req") == 50
    assert await other.get_counter("t:a:req") == 50
    assert await other.get_counter("t:a:usd") == pytest.approx(2.5)


async def test_incr_many_adds_to_each_counter_atomically(store: Store, backend: Backend) -> None:
    other = backend.open()
    await store.incr("t:a:seen", 5)
    await asyncio.gather(*(([store, other][i % 2]).incr_many({"t:a:seen": 1, "t:a:tokens": 100, "t:a:cost": 0.5})
                           for i in range(20)))
    assert await other.get_counter("t:a:seen") == 25
    assert await store.get_counter("t:a:tokens") == 2000
    assert await store.get_counter("t:a:cost") == pytest.approx(10.0)
    await store.incr_many({})


async def test_append_logs_writes_many_logs_at_once(store: Store) -> None:
    await store.append_log("t:a:l1", b"0")
    await store.append_logs([("t:a:l1", b"1"), ("t:a:l2", b"x"), ("t:a:l1", b"2"), ("t:a:l1", b"3")], max_len=3)
    assert await store.read_log("t:a:l1") == [b"1", b"2", b"3"]
    assert await store.read_log("t:a:l2") == [b"x"]
    await store.append_logs([])


async def test_write_batch_does_what_its_calls_one_by_one_do(store: Store) -> None:
    await store.incr("t:a:n", 2)
    await store.put_json("t:a:first", {"kept": True})
    await store.append_log("t:a:l1", b"0")
    await store.write_batch(Writes(
        ttl=60, amounts={"t:a:n": 3, "t:a:x": 0.5}, records={"t:a:rec": {"a": [1, "b"]}, "t:a:r2": 7},
        records_if_absent={"t:a:first": {"kept": False}, "t:a:new": 1.5},
        logs=[([("t:a:l1", b"1"), ("t:a:l2", b"x")], None), ([("t:a:l1", b"2"), ("t:a:l1", b"3")], 3), ([], 1)]))
    assert (await store.get_counter("t:a:n"), await store.get_counter("t:a:x")) == (5, 0.5)
    assert await store.get_json("t:a:rec") == {"a": [1, "b"]} and await store.get_json("t:a:r2") == 7
    assert await store.get("t:a:rec") == b'{"a":[1,"b"]}'  # the bytes put_json writes
    assert await store.get_json("t:a:first") == {"kept": True} and await store.get_json("t:a:new") == 1.5
    assert await store.read_log("t:a:l1") == [b"1", b"2", b"3"]  # the second list's max_len applies to it
    assert await store.read_log("t:a:l2") == [b"x"]
    await store.write_batch(Writes())


async def test_counters_by_prefix(store: Store) -> None:
    await store.incr("t:a:in", 10)
    await store.incr("t:a:out", 2.5)
    await store.incr("t:ab:in", 1)
    await store.incr("t:[a]*:in", 4)
    await store.put("t:a:blob", b"not a counter")
    assert await store.counters("t:a:") == {"t:a:in": 10, "t:a:out": 2.5}
    assert await store.counters("t:[a]*:") == {"t:[a]*:in": 4}
    assert await store.counters("t:none:") == {}


# ---- logs -------------------------------------------------------------------------


async def test_log_appends_in_order_and_reads_ranges_like_lrange(store: Store) -> None:
    for i in range(5):
        await store.append_log("t:a:s:1:log", f"e{i}".encode())
    assert await store.read_log("t:a:s:1:log") == [b"e0", b"e1", b"e2", b"e3", b"e4"]
    assert await store.read_log("t:a:s:1:log", 1, 2) == [b"e1", b"e2"]
    assert await store.read_log("t:a:s:1:log", -2, -1) == [b"e3", b"e4"]
    assert await store.read_log("t:a:s:1:log", 3, 100) == [b"e3", b"e4"]
    assert await store.read_log("t:a:s:1:log", -100, 0) == [b"e0"]
    assert await store.read_log("t:a:s:1:log", 10, 20) == []
    assert await store.read_log("t:a:s:1:log", 3, 1) == []
    assert await store.read_log("t:a:s:missing") == []


async def test_log_max_len_keeps_newest(store: Store) -> None:
    for i in range(7):
        await store.append_log("t:a:log", f"e{i}".encode(), max_len=3)
    assert await store.read_log("t:a:log") == [b"e4", b"e5", b"e6"]
    assert await store.read_log("t:a:log", 0, 0) == [b"e4"]


async def test_log_ttl_expires_whole_log(store: Store) -> None:
    await store.append_log("t:a:log", b"old-1", ttl=SHORT_TTL)
    await store.append_log("t:a:log", b"old-2")  # no ttl: keeps the log's current expiry
    assert await store.read_log("t:a:log") == [b"old-1", b"old-2"]
    await asyncio.sleep(PAST_SHORT_TTL)
    assert await store.read_log("t:a:log") == []
    await store.append_log("t:a:log", b"fresh")
    assert await store.read_log("t:a:log") == [b"fresh"]


# ---- locks ------------------------------------------------------------------------


async def test_lock_is_exclusive_until_released(store: Store, backend: Backend) -> None:
    other = backend.open()
    token = await store.acquire_lock("t:a:compact", lease=30)
    assert token
    assert await other.acquire_lock("t:a:compact", lease=30) is None
    assert await store.acquire_lock("t:a:compact", lease=30) is None
    assert await other.release_lock("t:a:compact", "not-the-token") is False
    assert await other.renew_lock("t:a:compact", "not-the-token", 30) is False
    assert await store.release_lock("t:a:compact", token) is True
    assert await store.release_lock("t:a:compact", token) is False

    second = await other.acquire_lock("t:a:compact", lease=30)
    assert second and second != token


async def test_lock_has_one_winner_under_concurrency(store: Store, backend: Backend) -> None:
    other = backend.open()
    instances = [store, other]
    tokens = await asyncio.gather(
        *(instances[i % 2].acquire_lock("t:a:race", lease=30) for i in range(CONCURRENT_CALLS))
    )
    assert sum(t is not None for t in tokens) == 1


async def test_lock_lease_expires(store: Store, backend: Backend) -> None:
    other = backend.open()
    stale = await store.acquire_lock("t:a:job", lease=SHORT_TTL)
    assert stale
    assert await other.acquire_lock("t:a:job", lease=SHORT_TTL) is None
    await asyncio.sleep(PAST_SHORT_TTL)

    fresh = await other.acquire_lock("t:a:job", lease=30)
    assert fresh and fresh != stale
    assert await store.renew_lock("t:a:job", stale, 30) is False
    assert await store.release_lock("t:a:job", stale) is False
    assert await other.release_lock("t:a:job", fresh) is True


async def test_renew_extends_lease(store: Store, backend: Backend) -> None:
    other = backend.open()
    token = await store.acquire_lock("t:a:job", lease=0.3)
    assert token
    await asyncio.sleep(0.15)
    assert await store.renew_lock("t:a:job", token, 1.0) is True
    await asyncio.sleep(0.3)  # past the original lease, inside the renewed one
    assert await other.acquire_lock("t:a:job", lease=30) is None
    assert await store.release_lock("t:a:job", token) is True


# ---- counted blobs: a byte quota per group, oldest evicted first ------------------

BLOB = 100  # bytes per counted blob in these tests
QUOTA = 350  # room for three of them


async def test_counted_put_evicts_the_groups_oldest_blobs_first(store: Store, backend: Backend) -> None:
    other = backend.open()  # another replica/process on the same backend shares the quota
    for i in range(6):
        evicted = await (store if i % 2 else other).put_counted(
            f"t:a:blob:{i}", bytes([i]) * BLOB, "t:a:archive", QUOTA, ttl=60)
        assert evicted == (1 if i >= 3 else 0)
        assert await store.counted_bytes("t:a:archive") <= QUOTA
    assert await store.get_many([f"t:a:blob:{i}" for i in range(6)]) == [None] * 3 + [bytes([i]) * BLOB
                                                                                      for i in (3, 4, 5)]
    assert await store.counted_bytes("t:a:archive") == 3 * BLOB


async def test_counted_put_leaves_other_groups_and_plain_blobs_alone(store: Store) -> None:
    await store.put("t:a:decision:1", b"a recorded decision")
    for i in range(3):
        await store.put_counted(f"t:b:blob:{i}", b"b" * BLOB, "t:b:archive", QUOTA)
    for i in range(10):
        await store.put_counted(f"t:a:blob:{i}", b"a" * BLOB, "t:a:archive", QUOTA)
    assert await store.get_many([f"t:b:blob:{i}" for i in range(3)]) == [b"b" * BLOB] * 3
    assert await store.counted_bytes("t:b:archive") == 3 * BLOB
    assert await store.get("t:a:decision:1") == b"a recorded decision"
    assert await store.counted_bytes("t:a:archive") == 3 * BLOB
    assert await store.counted_bytes("t:nobody:archive") == 0


async def test_storing_a_counted_blob_again_replaces_its_size_and_makes_it_newest(store: Store) -> None:
    for i in range(3):
        await store.put_counted(f"t:a:blob:{i}", b"x" * BLOB, "t:a:archive", QUOTA)
    bigger = b"y" * (BLOB + BLOB // 2)
    assert await store.put_counted("t:a:blob:0", bigger, "t:a:archive", QUOTA) == 0  # 0 is now the newest
    assert await store.counted_bytes("t:a:archive") == 2 * BLOB + len(bigger)
    assert await store.put_counted("t:a:blob:3", b"z" * BLOB, "t:a:archive", QUOTA) == 1  # 1, the oldest now
    assert await store.get_many(["t:a:blob:0", "t:a:blob:1", "t:a:blob:2"]) == [bigger, None, b"x" * BLOB]
    assert await store.counted_bytes("t:a:archive") == 2 * BLOB + len(bigger)


async def test_a_counted_blob_larger_than_the_quota_is_kept_until_the_next_put(store: Store) -> None:
    await store.put_counted("t:a:blob:small", b"s" * BLOB, "t:a:archive", QUOTA)
    assert await store.put_counted("t:a:blob:huge", b"h" * (QUOTA * 2), "t:a:archive", QUOTA) == 1
    assert await store.get("t:a:blob:huge") == b"h" * (QUOTA * 2)
    assert await store.put_counted("t:a:blob:next", b"n" * BLOB, "t:a:archive", QUOTA) == 1
    assert await store.get("t:a:blob:huge") is None
    assert await store.counted_bytes("t:a:archive") == BLOB


async def test_counted_puts_under_concurrency_never_lose_count(store: Store, backend: Backend) -> None:
    instances = [store, backend.open()]
    await asyncio.gather(*(instances[i % 2].put_counted(f"t:a:blob:{i}", b"c" * BLOB, "t:a:archive", QUOTA)
                           for i in range(CONCURRENT_CALLS)))
    kept = [b for b in await store.get_many([f"t:a:blob:{i}" for i in range(CONCURRENT_CALLS)]) if b is not None]
    assert len(kept) == 3
    assert await store.counted_bytes("t:a:archive") == 3 * BLOB


async def test_a_counted_blob_outside_its_groups_slot_group_is_refused(store: Store) -> None:
    """Eviction deletes blobs and bookkeeping in one step, which a cluster can do only inside one slot: refused on
    every backend alike, so the mistake shows on SQLite too."""
    for key, group in (("t:b:blob:1", "t:a:archive"), ("t:a:s:S:blob", "t:a:archive"), ("k", "g")):
        with pytest.raises(ValueError, match="slot group"):
            await store.put_counted(key, b"x", group, QUOTA)
    assert await store.get("t:b:blob:1") is None and await store.counted_bytes("t:a:archive") == 0


async def test_counted_blob_expires_like_any_blob(store: Store) -> None:
    await store.put_counted("t:a:blob:short", b"x" * BLOB, "t:a:archive", QUOTA, ttl=SHORT_TTL)
    await asyncio.sleep(PAST_SHORT_TTL)
    assert await store.get("t:a:blob:short") is None
    with pytest.raises(ValueError):
        await store.put_counted("t:a:blob:bad", b"x", "t:a:archive", 0)


# ---- validation and failure -------------------------------------------------------


async def test_rejects_nonsense_ttl_and_max_len(store: Store) -> None:
    with pytest.raises(ValueError):
        await store.put("t:a:k", b"v", ttl=0)
    with pytest.raises(ValueError):
        await store.put_if_absent("t:a:k", b"v", ttl=-1)
    with pytest.raises(ValueError):
        await store.append_log("t:a:log", b"v", max_len=0)
    with pytest.raises(ValueError):
        await store.acquire_lock("t:a:lock", lease=0)
    assert await store.get("t:a:k") is None


# Every Store method, called the way the proxy calls it.
EVERY_CALL: dict[str, Callable[[Store], Awaitable[Any]]] = {
    "get": lambda s: s.get("t:a:k"),
    "put": lambda s: s.put("t:a:k", b"v", ttl=60),
    "put_if_absent": lambda s: s.put_if_absent("t:a:k", b"v"),
    "get_json": lambda s: s.get_json("t:a:rec"),
    "put_json": lambda s: s.put_json("t:a:rec", {"a": 1}),
    "put_json_if_absent": lambda s: s.put_json_if_absent("t:a:rec", {"a": 1}),
    "get_many": lambda s: s.get_many(["t:a:k", "t:a:j"]),
    "delete": lambda s: s.delete("t:a:k"),
    "put_counted": lambda s: s.put_counted("t:a:blob:1", b"v", "t:a:archive", 1000, ttl=60),
    "counted_bytes": lambda s: s.counted_bytes("t:a:archive"),
    "incr": lambda s: s.incr("t:a:n"),
    "incr_many": lambda s: s.incr_many({"t:a:n": 1, "t:a:m": 2.5}),
    "get_counter": lambda s: s.get_counter("t:a:n"),
    "counters": lambda s: s.counters("t:a:"),
    "keys": lambda s: s.keys("t:a:"),
    "append_log": lambda s: s.append_log("t:a:log", b"e", max_len=10, ttl=60),
    "append_logs": lambda s: s.append_logs([("t:a:log", b"e")], max_len=10, ttl=60),
    "write_batch": lambda s: s.write_batch(Writes(ttl=60, amounts={"t:a:n": 1}, records={"t:a:rec": 1},
                                                  logs=[([("t:a:log", b"e")], 10)])),
    "read_log": lambda s: s.read_log("t:a:log"),
    "acquire_lock": lambda s: s.acquire_lock("t:a:lock", lease=1),
    "renew_lock": lambda s: s.renew_lock("t:a:lock", "token", lease=1),
    "release_lock": lambda s: s.release_lock("t:a:lock", "token"),
}
# A failing backend answers within its timeouts (0.5 s by default, connect + one round trip
# at worst); a call still running after this has hung, as it did with the old 5 s timeouts.
# It is a client-side cap: exceeding it fails the test, nothing here reads a clock.
FAILS_WITHIN_S = 1.5
# The per-op failure tests run every Store method against a dead backend; they use a short
# configured timeout (store_timeout, what open_store passes) so 21 ops x 2 backends do not each
# wait the 0.5 s default. The defaults are covered by test_default_timeouts_bound_a_dead_backend.
DEAD_TIMEOUT_S = 0.02


@pytest.fixture(scope="module", params=["refused", "never-answers"])
def failing_redis(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a Redis that refuses connections, or of one that accepts them and never replies.

    One of each for the module: neither keeps anything of a call (the silent one only holds its sockets)."""
    if request.param == "refused":
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield f"redis://127.0.0.1:{port}/0"
    else:
        with SilentServer() as silent:
            yield silent.url


async def _fails_fast(call: Awaitable[Any], what: str = "the call") -> StoreError:
    try:
        await asyncio.wait_for(call, FAILS_WITHIN_S)
    except StoreError as exc:
        return exc
    except TimeoutError:
        pytest.fail(f"{what} still running after {FAILS_WITHIN_S:g}s instead of raising StoreError: it hangs")
    pytest.fail(f"{what} answered although the backend cannot have")


@pytest.mark.parametrize("op", list(EVERY_CALL))
async def test_redis_that_refuses_or_never_answers_fails_every_call_fast(failing_redis: str, op: str) -> None:
    dead = RedisStore(failing_redis, prefix=f"ctxproxy-test:{uuid.uuid4().hex}:",
                      connect_timeout=DEAD_TIMEOUT_S, socket_timeout=DEAD_TIMEOUT_S)
    try:
        await _fails_fast(EVERY_CALL[op](dead), op)
        try:
            assert await asyncio.wait_for(dead.ping(), FAILS_WITHIN_S) is False
        except TimeoutError:
            pytest.fail(f"ping still running after {FAILS_WITHIN_S:g}s: it hangs")
    finally:
        await asyncio.wait_for(dead.close(), FAILS_WITHIN_S)


def _exclusive_holder(path: Path) -> sqlite3.Connection:
    """What another process holding the file open exclusively looks like."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("CREATE TABLE held (x)")
    return holder


async def test_default_timeouts_bound_a_dead_backend(tmp_path: Path) -> None:
    """With no store_timeout configured, a silent Redis and a locked SQLite file still fail, not hang.

    The four calls wait on their own backends' default timeouts side by side (each is still bounded by
    FAILS_WITHIN_S), rather than one after the other."""
    async def redis_calls(url: str) -> None:
        dead = RedisStore(url, prefix=f"ctxproxy-test:{uuid.uuid4().hex}:")
        try:
            await asyncio.gather(_fails_fast(dead.get("t:a:k"), "redis get"),
                                 _fails_fast(dead.put("t:a:k", b"v"), "redis put"))
        finally:
            await dead.close()

    async def sqlite_calls(locked: SqliteStore) -> None:
        await _fails_fast(locked.get("t:a:k"), "sqlite get")
        await _fails_fast(locked.put("t:a:k", b"v"), "sqlite put")

    path = tmp_path / "locked.db"
    holder = _exclusive_holder(path)
    locked = SqliteStore(path)
    try:
        with SilentServer() as silent:
            await asyncio.gather(redis_calls(silent.url), sqlite_calls(locked))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        await locked.close()


async def test_configured_timeout_bounds_a_redis_that_never_answers() -> None:
    """store_timeout=0.1 is what bounds the call: raced against a store on the 0.5 s default, it gives up first."""
    order: list[str] = []

    async def fail(name: str, store: Store) -> None:
        await _fails_fast(store.get("t:a:k"), name)
        order.append(name)

    with SilentServer() as silent:
        configured, default = open_store(silent.url, timeout=0.1), open_store(silent.url)
        try:
            await asyncio.gather(fail("configured", configured), fail("default", default))
        finally:
            await configured.close()
            await default.close()
    assert order == ["configured", "default"]


async def test_sqlite_file_locked_by_another_process_fails_every_call_fast(tmp_path: Path) -> None:
    path = tmp_path / "locked.db"
    holder = _exclusive_holder(path)
    locked = SqliteStore(path, busy_timeout=DEAD_TIMEOUT_S)
    try:
        for op, call in EVERY_CALL.items():
            await _fails_fast(call(locked), op)
        assert await locked.ping() is False
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        await locked.close()


async def test_sqlite_write_waiting_on_another_writer_fails_fast_and_reads_still_answer(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    store = SqliteStore(path, busy_timeout=DEAD_TIMEOUT_S)
    await store.put("t:a:k", b"v")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process in the middle of a long write
    writer.execute("INSERT INTO counters VALUES ('t:other', 1)")
    try:
        for op in ("put", "put_counted", "incr", "append_logs", "acquire_lock"):
            await _fails_fast(EVERY_CALL[op](store), op)
        assert await store.get("t:a:k") == b"v"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    await store.put("t:a:k", b"after")  # the lock gone, writes work again
    assert await store.get("t:a:k") == b"after"
    await store.close()


async def test_unusable_sqlite_path_raises_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    broken = SqliteStore(blocker / "state.db")
    try:
        with pytest.raises(StoreError):
            await broken.put("t:a:k", b"v")
        assert await broken.ping() is False
    finally:
        await broken.close()


async def test_closed_sqlite_store_raises_store_error(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "s.db")
    await s.put("t:a:k", b"v")
    await s.close()
    with pytest.raises(StoreError):
        await s.get("t:a:k")
    assert await s.ping() is False


@pytest.mark.parametrize(
    ("url", "scheme"),
    [
        ("memcached://127.0.0.1:11211", "'memcached'"),
        ("postgres://user:s3cret@db/x", "'postgres'"),
        ("state.db", "(none)"),
    ],
)
def test_open_store_rejects_unknown_scheme(url: str, scheme: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url)
    message = str(info.value)
    assert scheme in message
    assert "sqlite:///" in message and "redis://" in message
    assert "\n" not in message and "s3cret" not in message


def test_open_store_rejects_sqlite_url_without_path() -> None:
    for url in ("sqlite://", "sqlite:///", "sqlite://relative.db"):
        with pytest.raises(ValueError, match="sqlite"):
            open_store(url)


async def test_open_store_accepts_documented_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = open_store("sqlite:///rel/dir/a.db")
    absolute = open_store(f"sqlite:///{tmp_path / 'abs.db'}")  # -> sqlite:////tmp/...
    memory = open_store("sqlite:///:memory:")
    try:
        assert isinstance(relative, SqliteStore) and relative.path == "rel/dir/a.db"
        assert isinstance(absolute, SqliteStore) and absolute.path == str(tmp_path / "abs.db")
        assert isinstance(memory, SqliteStore) and memory.path == ":memory:"
        for s in (relative, absolute, memory):
            await s.put("k", b"v")
            assert await s.get("k") == b"v"
        assert (tmp_path / "rel" / "dir" / "a.db").is_file()
        assert (tmp_path / "abs.db").is_file()
    finally:
        for s in (relative, absolute, memory):
            await s.close()
    for url in ("redis://127.0.0.1:6379/0", "rediss://cache.example:6380/2"):
        remote = open_store(url)
        assert isinstance(remote, RedisStore)
        await remote.close()
