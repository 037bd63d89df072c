"""Durable state for the proxy: one ``Store`` contract, SQLite (default) or Redis behind it."""

from __future__ import annotations

from .base import Store, StoreError
from .redis import RedisStore
from .redis_url import SCHEMES
from .sqlite import SqliteStore

__all__ = ["Store", "StoreError", "RedisStore", "SqliteStore", "open_store"]

SQLITE_URL_HEAD = "sqlite:///"
ACCEPTED_FORMS = (
    "sqlite:///relative/path.db, sqlite:////abs/path.db, sqlite:///:memory:, "
    "redis://host:port/db, rediss://host:port/db, redis+cluster://host:port[,host:port...], "
    "redis+sentinel://host:port[,host:port...]/service[/db]"
)


def open_store(url: str, timeout: float | None = None) -> Store:
    """The store a URL names. Nothing connects until the first operation.

    ``timeout`` (seconds) bounds each backend round trip: Redis connect and socket
    timeouts, SQLite's wait for a lock held by another process. None: the backend's default.

    Raises ``ValueError`` for an unsupported or malformed URL; the message names the
    scheme, never the whole URL (a Redis URL may carry a password).
    """
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower() if sep else ""
    if scheme == "sqlite":
        path = url[len(SQLITE_URL_HEAD) :] if url[: len(SQLITE_URL_HEAD)].lower() == SQLITE_URL_HEAD else ""
        if not path:
            raise ValueError(f"sqlite store URL needs a path after 'sqlite:///'; accepted: {ACCEPTED_FORMS}")
        return SqliteStore(path) if timeout is None else SqliteStore(path, busy_timeout=timeout)
    if scheme in SCHEMES:
        return RedisStore(url) if timeout is None else RedisStore(url, connect_timeout=timeout, socket_timeout=timeout)
    shown = repr(scheme) if scheme else "(none)"
    raise ValueError(f"unsupported store URL scheme {shown}; accepted: {ACCEPTED_FORMS}")
