"""Redis backend: shared state for several proxy replicas."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from . import redis_lua
from .base import (
    MAX_EVICTIONS_PER_PUT,
    SharedOpsMixin,
    StoreError,
    as_number,
    check_amount,
    check_counted,
    check_max_len,
    check_ttl,
    incr_result,
    new_lock_token,
    ttl_ms,
)
from .redis_client import Client, open_client
from .redis_layout import KeyLayout, by_slot
from .redis_url import parse_redis_url

DEFAULT_PREFIX = "ctxproxy:"
# An unreachable or silent Redis must fail fast so callers degrade instead of stalling
# requests (a healthy one answers in well under a millisecond); open_store passes the
# configured store_timeout for both.
CONNECT_TIMEOUT_S = 0.5
# Upper bound on one command's round trip once connected.
SOCKET_TIMEOUT_S = 0.5
# Keys the server examines per SCAN round trip.
SCAN_COUNT = 500
# A counted put whose evictions changed under it (another replica evicted first) asks again
# with the members it now needs, this many times in all, then fails like any backend error.
COUNTED_ATTEMPTS = 8
# Members a counted put that must evict names beyond the ones it evicts, so a concurrent
# eviction of a few of them rarely costs another round trip.
COUNTED_SLACK = 16
# At most this share of the socket timeout goes to waiting for replicas (the rest to the write).
WAIT_SHARE = 0.5
# redis-py types every reply as `bytes | str` whatever the client's decode_responses; this
# client always has decode_responses=False (checked in open_client), so replies are
# bytes and are cast to that where they are returned.

# Sub-namespaces under the prefix, one per kind of value, mirroring the SQLite tables
# so keys()/counters() only see their own kind and delete() can reach all three.
_BLOB, _COUNTER, _LOG, _LOCK = "b:", "c:", "l:", "lock:"
# A counted group's bookkeeping: members by store order (sorted set), their sizes (hash),
# and {bytes, seq} (hash). Members are the callers' keys; their blobs live under _BLOB.
_COUNTED = "q:"
_COUNTED_PARTS = (":order", ":sizes", ":meta")


class RedisStore(SharedOpsMixin):
    """The proxy's state in Redis, so several replicas share one view of it.

    Every conditional write is a single Redis command or Lua script (SET NX, INCRBY,
    token-checked lock scripts), so it is atomic across every client and replica:
    a decision recorded once is replayed identically everywhere. TTLs are native
    Redis expiry. Everything lives under ``prefix`` (default ``ctxproxy:``) so the
    proxy can share a database with other users. Backend failures, a server that
    accepts connections but never answers included, surface as ``StoreError`` within
    about the connect + socket timeouts rather than hanging a request.

    One server, a Redis Cluster or a Sentinel-managed primary (proxy/store/redis_url.py),
    with one key layout on all three (proxy/store/redis_layout.py): no command, script or
    transaction spans two slots, so a cluster never answers CROSSSLOT. Blob and record
    writes (handles, decisions) return once ``wait`` replicas have them, or after
    ``wait_ms`` if fewer answered (then only the primary holds them): what a failover
    keeps is what a replica acknowledged.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        socket_timeout: float = SOCKET_TIMEOUT_S,
    ) -> None:
        self.layout = KeyLayout(prefix)
        target = parse_redis_url(url)
        self.mode = target.mode
        # A WAIT blocks its connection: past the socket timeout it would fail the write it guards.
        self.wait, self.wait_ms = target.wait, min(target.wait_ms, int(socket_timeout * 1000 * WAIT_SHARE))
        self.unreplicated = 0  # acknowledged writes no replica had within wait_ms: a failover may lose them
        self.on_unreplicated: Callable[[], None] | None = None  # told of each (ProxyState: /metrics counts them)
        self._client: Client = open_client(target, connect_timeout, socket_timeout)
        self._renew = self._client.register_script(redis_lua.RENEW)
        self._release = self._client.register_script(redis_lua.RELEASE)

    def _k(self, kind: str, key: str) -> bytes:
        return self.layout.name(kind, key)

    @contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        try:
            yield
        except (RedisError, RedisClusterException, OSError) as exc:
            raise StoreError(f"redis {op} failed: {type(exc).__name__}: {exc}") from exc

    def _pipeline(self) -> Any:
        """A non-transactional pipeline: one round trip per node, each command on its key's node. Run it with `_run`."""
        return self._client.pipeline(transaction=False)

    async def _run(self, pipe: Any) -> list[Any]:
        if isinstance(self._client, RedisCluster):
            await self._client.initialize()  # route by the slot map, not to any node (redis_client.RoutedCluster)
        return cast("list[Any]", await pipe.execute())

    async def _wait_after(self, pipe: Any, name: bytes) -> None:
        """Queue a WAIT behind the write to ``name``, on its node and connection (WAIT counts that connection's)."""
        if not self.wait:
            return
        if isinstance(self._client, RedisCluster):
            await self._client.initialize()  # the slot map, to name the node the write goes to
            node = self._client.get_node_from_key(name.decode())
            pipe.execute_command("WAIT", self.wait, self.wait_ms, target_nodes=node)
        else:
            pipe.execute_command("WAIT", self.wait, self.wait_ms)

    async def _set(self, op: str, key: str, value: bytes, ttl: float | None, *flags: str) -> Any:
        """SET a blob (put, put_if_absent), with its WAIT when the store waits for replicas; the SET's reply."""
        ttl = check_ttl(ttl)
        name = self._k(_BLOB, key)
        command = ("SET", name, value, *flags, *(() if ttl is None else ("PX", ttl_ms(ttl))))
        with self._errors(op):
            if not self.wait:
                return await self._client.execute_command(*command)
            pipe = self._pipeline()
            pipe.execute_command(*command)
            await self._wait_after(pipe, name)
            return self._acked(await self._run(pipe))[0]

    def _acked(self, replies: list[Any]) -> list[Any]:
        """The replies of a pipeline that ends in the WAIT `_wait_after` queued, that WAIT's taken off; a write
        fewer replicas acknowledged than asked (in time) counts in ``unreplicated`` (only the primary holds it)."""
        if self.wait and int(replies.pop()) < self.wait:
            self.unreplicated += 1
            if self.on_unreplicated is not None:
                self.on_unreplicated()
        return replies

    async def _mget(self, names: list[bytes]) -> list[bytes | None]:
        """MGET of names in any slots: one MGET per slot, all in one pipeline."""
        groups = by_slot(names)
        pipe = self._pipeline()
        for positions in groups.values():
            pipe.execute_command("MGET", *(names[i] for i in positions))  # a cluster pipeline blocks .mget()
        out: list[bytes | None] = [None] * len(names)
        for positions, values in zip(groups.values(), await self._run(pipe)):
            for i, value in zip(positions, values):
                out[i] = value
        return out

    async def _scan(self, kind: str, prefix: str) -> list[tuple[str, bytes]]:
        """(key, stored name) of each ``kind`` key starting with ``prefix``, sorted; on a cluster, every primary's."""
        found: dict[str, bytes] = {}  # SCAN may repeat a key
        async for raw in self._client.scan_iter(match=self.layout.pattern(kind, prefix), count=SCAN_COUNT):
            key = self.layout.key_of(kind, raw, prefix)
            if key is not None:
                found[key] = raw
        return sorted(found.items())

    # ---- blobs and records ----------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        with self._errors("get"):
            return cast("bytes | None", await self._client.get(self._k(_BLOB, key)))

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> None:
        await self._set("put", key, value, ttl)

    async def put_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        return bool(await self._set("put_if_absent", key, value, ttl, "NX"))

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        with self._errors("get_many"):
            return await self._mget([self._k(_BLOB, k) for k in keys])

    async def delete(self, key: str) -> None:
        with self._errors("delete"):  # one slot for a key of the schema; RedisCluster.delete splits the others by slot
            await self._client.delete(self._k(_BLOB, key), self._k(_COUNTER, key), self._k(_LOG, key))

    async def put_counted(self, key: str, value: bytes, group: str, quota: int, ttl: float | None = None) -> int:
        ttl, quota = check_ttl(ttl), check_counted(key, group, quota)
        blob = self._k(_BLOB, key)
        books = [self.layout.name(_COUNTED, group + part, group=group) for part in _COUNTED_PARTS]
        args = [value, b"" if ttl is None else ttl_ms(ttl), quota, key.encode(), MAX_EVICTIONS_PER_PUT, COUNTED_SLACK]
        named: list[str] = []  # members whose blobs this call passes, for evictions
        with self._errors("put_counted"):
            for _ in range(COUNTED_ATTEMPTS):
                pipe = self._pipeline()
                pipe.eval(redis_lua.PUT_COUNTED, 4 + len(named), blob, *books,
                          *(self._k(_BLOB, m) for m in named), *args, *(m.encode() for m in named))
                await self._wait_after(pipe, blob)
                replies = await self._run(pipe)
                answer = replies[0]
                if not isinstance(answer, list):  # stored (else nothing was written: the WAIT says nothing)
                    self._acked(replies)
                    return int(answer)
                named = list(dict.fromkeys([m.decode() for m in answer] + named))
        raise StoreError(f"redis put_counted failed: the group's evictions changed {COUNTED_ATTEMPTS} times in a row")

    async def counted_bytes(self, group: str) -> int:
        with self._errors("counted_bytes"):
            raw = await self._client.hget(self.layout.name(_COUNTED, group + ":meta", group=group), b"bytes")
        return 0 if raw is None else int(raw)

    async def keys(self, prefix: str) -> list[str]:
        with self._errors("keys"):
            return [key for key, _ in await self._scan(_BLOB, prefix)]

    # ---- counters -------------------------------------------------------------

    async def incr(self, key: str, amount: int | float = 1) -> int | float:
        check_amount(amount)
        k = self._k(_COUNTER, key)
        with self._errors("incr"):
            if isinstance(amount, int):
                try:
                    return await self._client.incrby(k, amount)
                except ResponseError:
                    pass  # the counter holds a non-integer (or would overflow): add as float
            total = await self._client.incrbyfloat(k, amount)
        return incr_result(amount, _parse_number(total))

    async def incr_many(self, amounts: dict[str, int | float]) -> None:
        for amount in amounts.values():
            check_amount(amount)
        with self._errors("incr_many"):
            pipe = self._pipeline()  # each INCRBY is atomic alone, on its key's node
            for key, amount in amounts.items():
                k = self._k(_COUNTER, key)
                if isinstance(amount, int):
                    pipe.incrby(k, amount)
                else:
                    pipe.incrbyfloat(k, amount)
            await self._run(pipe)

    async def get_counter(self, key: str) -> int | float:
        with self._errors("get_counter"):
            raw = await self._client.get(self._k(_COUNTER, key))
        return 0 if raw is None else _parse_number(raw)

    async def counters(self, prefix: str) -> dict[str, int | float]:
        with self._errors("counters"):
            found = await self._scan(_COUNTER, prefix)
            values = await self._mget([name for _, name in found]) if found else []
        return {
            key: _parse_number(raw)
            for (key, _), raw in zip(found, values)
            if raw is not None  # deleted between SCAN and MGET
        }

    # ---- logs -----------------------------------------------------------------

    async def append_logs(
        self, entries: list[tuple[str, bytes]], max_len: int | None = None, ttl: float | None = None
    ) -> None:
        """One script per slot (a session's logs together), all in one round trip; each slot's appends atomic."""
        max_len, ttl = check_max_len(max_len), check_ttl(ttl)
        if not entries:
            return
        names = [self._k(_LOG, key) for key, _ in entries]
        head = [b"" if max_len is None else max_len, b"" if ttl is None else ttl_ms(ttl)]
        with self._errors("append_logs"):
            pipe = self._pipeline()
            for positions in by_slot(names).values():
                logs = list(dict.fromkeys(names[i] for i in positions))
                index = {name: n for n, name in enumerate(logs, 1)}
                pairs = [x for i in positions for x in (index[names[i]], entries[i][1])]
                pipe.eval(redis_lua.APPEND_LOGS, len(logs), *logs, *head, *pairs)
            await self._run(pipe)

    async def read_log(self, key: str, start: int = 0, end: int = -1) -> list[bytes]:
        with self._errors("read_log"):
            return list(cast("list[bytes]", await self._client.lrange(self._k(_LOG, key), start, end)))

    # ---- locks ----------------------------------------------------------------

    async def acquire_lock(self, name: str, lease: float) -> str | None:
        lease = cast(float, check_ttl(lease))  # a float lease checks to a float
        token = new_lock_token()
        with self._errors("acquire_lock"):
            won = await self._client.set(self._k(_LOCK, name), token.encode(), nx=True, px=ttl_ms(lease))
        return token if won else None

    async def renew_lock(self, name: str, token: str, lease: float) -> bool:
        lease = cast(float, check_ttl(lease))  # a float lease checks to a float
        with self._errors("renew_lock"):
            done: int = await self._renew(keys=[self._k(_LOCK, name)], args=[token.encode(), ttl_ms(lease)])
        return done == 1

    async def release_lock(self, name: str, token: str) -> bool:
        with self._errors("release_lock"):
            done: int = await self._release(keys=[self._k(_LOCK, name)], args=[token.encode()])
        return done == 1

    # ---- lifecycle ------------------------------------------------------------

    async def ping(self) -> bool:
        try:
            return bool(await self._client.ping())
        except Exception:
            return False

    async def close(self) -> None:
        with self._errors("close"):
            await self._client.aclose()


def _parse_number(raw: bytes | str | float | int) -> int | float:
    """Counter text from Redis ("3", "2.5") as int when integral, else float."""
    if isinstance(raw, (int, float)):
        return as_number(raw)
    try:
        return int(raw)
    except ValueError:
        return as_number(float(raw))
