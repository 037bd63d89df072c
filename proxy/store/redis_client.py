"""The redis-py client a parsed store URL asks for: one server, a cluster, or the primary Sentinel names.

All three fail fast the same way (the connect and socket timeouts the store was given, one
quick retry on a dropped connection, never on a timeout), so the guarded store degrades
within its deadline whichever topology is down. Recovery is the client's own: a cluster
client relearns the slot map after a connection error or a MOVED reply (a promoted replica
answers for its slots), a Sentinel client asks the sentinels for the primary on every new
connection; the proxy does not restart anything.
"""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from .redis_url import RedisTarget

# One quick retry on a dropped connection (e.g. a pooled socket the server closed), never
# on a timeout: a server that did not answer once will not answer sooner when asked again.
RETRIES = 1
RETRY_BACKOFF_BASE_S = 0.01
RETRY_BACKOFF_CAP_S = 0.1

Client = aioredis.Redis | RedisCluster


class RoutedCluster(RedisCluster):
    """RedisCluster that has its slot map before it routes a command.

    redis-py 8.1 picks a command's routing before it initializes the client: a command
    issued before the first slot map (or after a connection error reset it) goes to an
    arbitrary node, is answered MOVED, and handling the redirect closes connections other
    commands are in the middle of using (they fail with AttributeError or "connection
    closed"). Initializing first, once, routes every command by its key.
    """

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if self._initialize:
            await self.initialize()
        return await super().execute_command(*args, **kwargs)


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=RETRY_BACKOFF_CAP_S, base=RETRY_BACKOFF_BASE_S), RETRIES,
                 supported_errors=(RedisConnectionError,))


def open_client(target: RedisTarget, connect_timeout: float, socket_timeout: float) -> Client:
    """A client for ``target``; nothing connects until its first command. Replies are bytes."""
    timeouts: dict[str, Any] = {"socket_connect_timeout": connect_timeout, "socket_timeout": socket_timeout}
    if target.mode == "single":
        client = aioredis.Redis.from_url(target.single_url, decode_responses=False, retry=_retry(), **timeouts)
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("redis store URL must not set decode_responses; the store works in bytes")
        return client
    auth: dict[str, Any] = {"username": target.username, "password": target.password}
    if target.mode == "cluster":
        return RoutedCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            decode_responses=False, ssl=target.ssl, retry=_retry(), **auth, **timeouts)
    sentinel_auth = {"password": target.sentinel_password} if target.sentinel_password else {}
    sentinels = Sentinel(list(target.nodes),  # type: ignore[no-untyped-call]
                         sentinel_kwargs={**timeouts, **sentinel_auth, "retry": _retry(), "ssl": target.ssl})
    assert target.service is not None  # parse_redis_url requires it for a sentinel URL
    primary = sentinels.master_for(target.service, redis_class=aioredis.Redis, db=target.db, ssl=target.ssl,
                                   decode_responses=False, retry=_retry(), **auth, **timeouts)
    return cast(aioredis.Redis, primary)
