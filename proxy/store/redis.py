"""Redis backend: shared state for several proxy replicas."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from .base import (
    MAX_EVICTIONS_PER_PUT,
    SharedOpsMixin,
    StoreError,
    as_number,
    check_amount,
    check_max_len,
    check_quota,
    check_ttl,
    incr_result,
    new_lock_token,
    ttl_ms,
)

DEFAULT_PREFIX = "ctxproxy:"
# An unreachable or silent Redis must fail fast so callers degrade instead of stalling
# requests (a healthy one answers in well under a millisecond); open_store passes the
# configured store_timeout for both.
CONNECT_TIMEOUT_S = 0.5
# Upper bound on one command's round trip once connected.
SOCKET_TIMEOUT_S = 0.5
# One quick retry on a dropped connection (e.g. a pooled socket the server closed), never
# on a timeout: a server that did not answer once will not answer sooner when asked again.
RETRIES = 1
RETRY_BACKOFF_BASE_S = 0.01
RETRY_BACKOFF_CAP_S = 0.1
# Keys the server examines per SCAN round trip.
SCAN_COUNT = 500
# redis-py types every reply as `bytes | str` whatever the client's decode_responses; this
# client always has decode_responses=False (checked in RedisStore.__init__), so replies are
# bytes and are cast to that where they are returned.

# Characters special in a SCAN MATCH pattern, escaped so a prefix matches literally.
GLOB_SPECIALS = "\\*?[]"

# Sub-namespaces under the prefix, one per kind of value, mirroring the SQLite tables
# so keys()/counters() only see their own kind and delete() can reach all three.
_BLOB, _COUNTER, _LOG, _LOCK = "b:", "c:", "l:", "lock:"
# A counted group's bookkeeping: members by store order (sorted set), their sizes (hash),
# and {bytes, seq} (hash). Members are the callers' keys; their blobs live under _BLOB.
_COUNTED = "q:"

# Renew/release only if the caller still holds the lock (its token is the stored value).
_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# A counted put, atomic: store the blob, make it the group's newest, add its size, then delete
# the group's oldest blobs while it holds more than the quota (never the one just stored).
# The bookkeeping lives as long as the longest-lived blob stored into it.
_PUT_COUNTED_LUA = """
local blob, order, sizes, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local value, ttl, quota, member, blob_head, max_evict = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5],
    tonumber(ARGV[6])
local existed = redis.call('EXISTS', order) == 1
local size = string.len(value)
local old = tonumber(redis.call('HGET', sizes, member) or '0')
if ttl == '' then redis.call('SET', blob, value) else redis.call('SET', blob, value, 'PX', ttl) end
redis.call('ZADD', order, redis.call('HINCRBY', meta, 'seq', 1), member)
redis.call('HSET', sizes, member, size)
local used = redis.call('HINCRBY', meta, 'bytes', size - old)
local evicted = 0
while used > quota and evicted < max_evict do
    local oldest = redis.call('ZRANGE', order, 0, 0)[1]
    if (not oldest) or oldest == member then break end
    used = redis.call('HINCRBY', meta, 'bytes', -tonumber(redis.call('HGET', sizes, oldest) or '0'))
    redis.call('DEL', blob_head .. oldest)
    redis.call('ZREM', order, oldest)
    redis.call('HDEL', sizes, oldest)
    evicted = evicted + 1
end
if ttl == '' then
    for i = 2, 4 do redis.call('PERSIST', KEYS[i]) end
else
    local left = redis.call('PTTL', order)
    if not (existed and left == -1) and left < tonumber(ttl) then
        for i = 2, 4 do redis.call('PEXPIRE', KEYS[i], ttl) end
    end
end
return evicted
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class RedisStore(SharedOpsMixin):
    """The proxy's state in Redis, so several replicas share one view of it.

    Every conditional write is a single Redis command or Lua script (SET NX, INCRBY,
    token-checked lock scripts), so it is atomic across every client and replica:
    a decision recorded once is replayed identically everywhere. TTLs are native
    Redis expiry. Everything lives under ``prefix`` (default ``ctxproxy:``) so the
    proxy can share a database with other users. Backend failures, a server that
    accepts connections but never answers included, surface as ``StoreError`` within
    about the connect + socket timeouts rather than hanging a request.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        socket_timeout: float = SOCKET_TIMEOUT_S,
    ) -> None:
        self.prefix = prefix
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            url,
            decode_responses=False,
            socket_connect_timeout=connect_timeout,
            socket_timeout=socket_timeout,
            retry=Retry(ExponentialBackoff(cap=RETRY_BACKOFF_CAP_S, base=RETRY_BACKOFF_BASE_S), RETRIES,
                        supported_errors=(RedisConnectionError,)),
        )
        if self._client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("redis store URL must not set decode_responses; the store works in bytes")
        self._renew = self._client.register_script(_RENEW_LUA)
        self._release = self._client.register_script(_RELEASE_LUA)
        self._put_counted = self._client.register_script(_PUT_COUNTED_LUA)

    def _k(self, kind: str, key: str) -> bytes:
        return f"{self.prefix}{kind}{key}".encode()

    @contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        try:
            yield
        except (RedisError, OSError) as exc:
            raise StoreError(f"redis {op} failed: {type(exc).__name__}: {exc}") from exc

    async def _scan(self, kind: str, prefix: str) -> list[bytes]:
        head = f"{self.prefix}{kind}"
        pattern = _glob_escape(head + prefix) + "*"
        found: set[bytes] = set()  # SCAN may repeat a key
        async for raw in self._client.scan_iter(match=pattern.encode(), count=SCAN_COUNT):
            found.add(raw)
        return sorted(found)

    def _strip(self, kind: str, raw: bytes) -> str:
        return raw.decode()[len(self.prefix) + len(kind) :]

    # ---- blobs and records ----------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        with self._errors("get"):
            return cast("bytes | None", await self._client.get(self._k(_BLOB, key)))

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> None:
        ttl = check_ttl(ttl)
        with self._errors("put"):
            await self._client.set(self._k(_BLOB, key), value, px=None if ttl is None else ttl_ms(ttl))

    async def put_if_absent(self, key: str, value: bytes, ttl: float | None = None) -> bool:
        ttl = check_ttl(ttl)
        with self._errors("put_if_absent"):
            stored = await self._client.set(
                self._k(_BLOB, key), value, nx=True, px=None if ttl is None else ttl_ms(ttl)
            )
        return bool(stored)

    async def get_many(self, keys: list[str]) -> list[bytes | None]:
        if not keys:
            return []
        with self._errors("get_many"):
            return list(cast("list[bytes | None]", await self._client.mget([self._k(_BLOB, k) for k in keys])))

    async def delete(self, key: str) -> None:
        with self._errors("delete"):
            await self._client.delete(self._k(_BLOB, key), self._k(_COUNTER, key), self._k(_LOG, key))

    async def put_counted(self, key: str, value: bytes, group: str, quota: int, ttl: float | None = None) -> int:
        ttl, quota = check_ttl(ttl), check_quota(quota)
        head = self._k(_COUNTED, group)
        with self._errors("put_counted"):
            return int(await self._put_counted(
                keys=[self._k(_BLOB, key), head + b":order", head + b":sizes", head + b":meta"],
                args=[value, b"" if ttl is None else ttl_ms(ttl), quota, key.encode(), self._k(_BLOB, ""),
                      MAX_EVICTIONS_PER_PUT]))

    async def counted_bytes(self, group: str) -> int:
        with self._errors("counted_bytes"):
            raw = await self._client.hget(self._k(_COUNTED, group) + b":meta", b"bytes")
        return 0 if raw is None else int(raw)

    async def keys(self, prefix: str) -> list[str]:
        with self._errors("keys"):
            raw = await self._scan(_BLOB, prefix)
        return sorted(self._strip(_BLOB, r) for r in raw)

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
            pipe = self._client.pipeline(transaction=False)
            for key, amount in amounts.items():
                k = self._k(_COUNTER, key)
                if isinstance(amount, int):
                    pipe.incrby(k, amount)
                else:
                    pipe.incrbyfloat(k, amount)
            await pipe.execute()

    async def get_counter(self, key: str) -> int | float:
        with self._errors("get_counter"):
            raw = await self._client.get(self._k(_COUNTER, key))
        return 0 if raw is None else _parse_number(raw)

    async def counters(self, prefix: str) -> dict[str, int | float]:
        with self._errors("counters"):
            names = await self._scan(_COUNTER, prefix)
            values = await self._client.mget(names) if names else []
        return {
            self._strip(_COUNTER, name): _parse_number(raw)
            for name, raw in zip(names, values)
            if raw is not None  # deleted between SCAN and MGET
        }

    # ---- logs -----------------------------------------------------------------

    async def append_logs(
        self, entries: list[tuple[str, bytes]], max_len: int | None = None, ttl: float | None = None
    ) -> None:
        max_len, ttl = check_max_len(max_len), check_ttl(ttl)
        if not entries:
            return
        with self._errors("append_logs"):
            async with self._client.pipeline(transaction=True) as pipe:
                for key, value in entries:
                    k = self._k(_LOG, key)
                    pipe.rpush(k, value)
                    if max_len is not None:
                        pipe.ltrim(k, -max_len, -1)
                    if ttl is not None:
                        pipe.pexpire(k, ttl_ms(ttl))
                await pipe.execute()

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


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in GLOB_SPECIALS else ch for ch in text)


def _parse_number(raw: bytes | str | float | int) -> int | float:
    """Counter text from Redis ("3", "2.5") as int when integral, else float."""
    if isinstance(raw, (int, float)):
        return as_number(raw)
    try:
        return int(raw)
    except ValueError:
        return as_number(float(raw))
