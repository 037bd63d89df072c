# ============================================================================
# Mock OpenAI upstream (tests/mock_upstream.py). One real HTTP server for the
# whole session; `upstream` hands it to a test freshly reset.
# ============================================================================
from __future__ import annotations

from collections.abc import Iterator

import pytest
from mock_upstream import MockUpstream


@pytest.fixture(scope="session")
def mock_upstream() -> Iterator[MockUpstream]:
    """Started once: binding a port and loading tiktoken per test would be slow."""
    with MockUpstream() as mock:
        yield mock


@pytest.fixture
def upstream(mock_upstream: MockUpstream) -> MockUpstream:
    """The session mock after reset(): no requests, script, failures, delays or cache."""
    mock_upstream.reset()
    return mock_upstream


# ============================================================================
# (other fixtures below)
# ============================================================================

import socket  # noqa: E402

import redis  # noqa: E402

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def _redis_keys() -> dict[int, set[bytes]] | None:
    """Every key in every database of the test Redis, or None when it is not there."""
    try:
        socket.create_connection((REDIS_HOST, REDIS_PORT), timeout=1).close()
    except OSError:
        return None
    out: dict[int, set[bytes]] = {}
    for db in range(16):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db, socket_timeout=5)
        try:
            out[db] = set(client.scan_iter(count=1000))
        except redis.RedisError:
            return None
        finally:
            client.close()
    return out


@pytest.fixture(scope="session", autouse=True)
def redis_left_as_found() -> Iterator[None]:
    """The suite deletes what it writes to Redis: keys that were not there before it ran are removed after."""
    before = _redis_keys()
    yield
    after = _redis_keys()
    if before is None or after is None:
        return
    for db, keys in after.items():
        new = list(keys - before.get(db, set()))
        if new:
            client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db, socket_timeout=5)
            try:
                for i in range(0, len(new), 500):
                    client.delete(*new[i:i + 500])
            finally:
                client.close()
