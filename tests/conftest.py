# ============================================================================
# Mock OpenAI upstream (tests/mock_upstream.py). One real HTTP server for the
# whole session; `upstream` hands it to a test freshly reset.
# ============================================================================
from __future__ import annotations

import functools
import gc
import io
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import httpx._config
import httpx._transports.default
import proxy_server
import pytest
from mock_upstream import MockUpstream
from proxy_server import InProcessProxy, ProxyServer, make_settings

import proxy.app
from proxy import logs
from proxy.app import create_app
from proxy.config import Settings
from proxy.tokens.encodings import SeededEncodings, ensure_encodings

# Every httpx client (the proxy's upstream client, each test's clients) builds an
# SSL context, and building one reads the whole CA bundle (~80 ms): the suite builds thousands, none of
# them used (every upstream is plain HTTP on loopback). One context per set of arguments serves them all.
_create_ssl_context = functools.lru_cache(maxsize=None)(httpx._config.create_ssl_context)
httpx.create_ssl_context = _create_ssl_context
httpx._transports.default.create_ssl_context = _create_ssl_context  # type: ignore[attr-defined]

# The collector. An app's start-up (proxy/app.py) runs gc.collect() and gc.freeze(), as a server should once per
# process; every app the suite starts in this process (InProcessProxy, ProxyServer, tests/asgi_proxy.py, the
# replay's own proxy) skips both: a full collection of the test process costs 0.3-0.7 s, and a freeze would keep
# each test's objects for good. `ctxproxy serve` in a subprocess still runs them. Instead the suite freezes its
# own start-up heap once, after collection (~460k objects: the libraries, the test modules): the collector's
# full passes then walk only what the tests made, not every module of openai, anthropic and hypothesis, and
# no pass stalls a test's event loop for half a second (a Redis connect timed out in one).
proxy.app.gc = proxy_server.NoFullCollection()  # type: ignore[attr-defined]
proxy_server.SERVER_FREEZES = False


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


# An app's start-up seeds tiktoken's cache directory with the shipped BPE files, hashing each one first (~5 ms of
# every proxy start, ~600 of them). For the apps the suite starts the files were verified once per directory:
# the same directory is not hashed again (tests/test_encodings.py calls ensure_encodings itself, on directories
# of its own, and corrupts files only there).
_seeded: dict[tuple[str | None, tuple[str, ...] | None], SeededEncodings] = {}


def _ensure_encodings_once(names: Sequence[str] | None = None) -> SeededEncodings:
    key = (os.environ.get("TIKTOKEN_CACHE_DIR"), None if names is None else tuple(names))
    if key not in _seeded:
        _seeded[key] = ensure_encodings(names)
    return _seeded[key]


proxy.app.ensure_encodings = _ensure_encodings_once  # type: ignore[attr-defined]


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
# The proxy under test. `make_proxy(...)` starts one (in process over ASGI
# unless real=True) with config overrides; `proxy` is one made from the
# `proxy_config` markers of the test and its module (closest wins):
#
#     pytestmark = pytest.mark.proxy_config(defaults={"offload": {"enabled": False}})
#
# Every proxy a test made is stopped when the test ends.
# ============================================================================

MakeProxy = Callable[..., Any]


@pytest.fixture
def make_proxy(upstream: MockUpstream, tmp_path: Path) -> Iterator[MakeProxy]:
    """`make_proxy(store=None, *, settings=None, upstream_url=None, env=None, real=False, **config)`.

    store defaults to a fresh SQLite file under tmp_path (a second proxy gets its own file unless
    given the same store); settings, when given, is used as is (replicas of one configuration).
    """
    stack = ExitStack()
    n = itertools.count(1)

    def make(store: str | None = None, *, settings: Settings | None = None, upstream_url: str | None = None,
             env: dict[str, str] | None = None, real: bool = False, **raw: Any) -> InProcessProxy | ProxyServer:
        if settings is None:
            i = next(n)
            store = store or f"sqlite:///{tmp_path}/ctx{'' if i == 1 else f'-{i}'}.db"
            settings = make_settings(upstream_url or upstream.base_url, store, env=env, **raw)
        return stack.enter_context(ProxyServer(settings) if real else InProcessProxy(settings))

    with stack:
        yield make


def proxy_config(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The `proxy_config` markers' keyword arguments, the module's first and the test's over them."""
    merged: dict[str, Any] = {}
    for mark in reversed(list(request.node.iter_markers("proxy_config"))):
        merged.update(mark.kwargs)
    return merged


@pytest.fixture
def proxy(make_proxy: MakeProxy, request: pytest.FixtureRequest) -> Any:
    return make_proxy(**proxy_config(request))


# ============================================================================
# (other fixtures below)
# ============================================================================

import socket  # noqa: E402
import uuid  # noqa: E402

import redis  # noqa: E402
from redis_topology import redis_cluster, redis_sentinel  # noqa: E402, F401 - the local Cluster and Sentinel set

from proxy.store.redis import RedisStore  # noqa: E402

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


# Every Redis store a test process opens writes under a prefix of this run's own (in-process proxies, the
# store tests' helpers), so the clean-up below can remove what this run wrote and nothing another run
# sharing the test Redis wrote meanwhile. Proxies started as subprocesses still write under `ctxproxy:`.
# Under pytest-xdist (addopts: `-n`) the controller picks the run's id and its workers inherit it, each
# writing under a prefix of its own (`ctxproxy-run-<id>-<worker>:`) so that two tests running at once
# never share keys; the controller cleans up once every worker has finished.
_RUN_ID = os.environ.setdefault("CTXPROXY_TEST_RUN_ID", uuid.uuid4().hex[:12])
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
RUN_PREFIX = f"ctxproxy-run-{_RUN_ID}{'-' + _WORKER if _WORKER else ''}:"
OTHER_RUNS = (b"ctxproxy-run-", b"ctxproxy-test:")  # other runs' (the store contract cleans its own per test)
RedisStore.__init__.__kwdefaults__["prefix"] = RUN_PREFIX
_THIS_RUN = (f"ctxproxy-run-{_RUN_ID}:".encode(), f"ctxproxy-run-{_RUN_ID}-".encode())  # the controller's, its workers'


def _ours(key: bytes) -> bool:
    return key.startswith(_THIS_RUN) or not key.startswith(OTHER_RUNS)


_keys_before: dict[int, set[bytes]] | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    """The keys there before the run, read once by the process that runs the whole session."""
    global _keys_before
    if not _WORKER:
        _keys_before = _redis_keys()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The suite deletes what it writes to Redis: keys of this run (or of no run) that were not there before it ran."""
    if _WORKER:
        return
    after = _redis_keys()
    if _keys_before is None or after is None:
        return
    for db, keys in after.items():
        new = [k for k in keys - _keys_before.get(db, set()) if _ours(k)]
        if new:
            client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=db, socket_timeout=5)
            try:
                for i in range(0, len(new), 500):
                    client.delete(*new[i:i + 500])
            finally:
                client.close()


# Tests run in parallel a file at a time (each file's tests in order on one worker, as they were written),
# but the files whose proxies run as subprocesses on the shared Redis databases (unprefixed keys) run one
# after another on one worker: two of them at once could read each other's figures. The grouping is a
# scheduler of our own (pytest-xdist's public hook), not xdist_group marks: xdist 3.8 writes the group
# into Node._nodeid, which pytest 9 no longer reads, so under pytest 9 the marks group nothing.
_SHARED_REDIS_FILES = frozenset({"test_redaction.py", "test_redis_urls.py", "test_serve.py", "test_serve_workers.py",
                                 "test_store_said_out_loud.py"})
# The slowest files go out first, so the last file a worker starts is a short one, not a 60-second tail.
_SLOWEST_FIRST = ("test_container.py", "test_serve_workers.py", "test_store_contract.py",
                  "test_redis_topologies.py", "test_replay_cli.py", "test_fuzz.py", "test_server_limits.py")


def _file_scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "shared-redis" if path.rsplit("/", 1)[-1] in _SHARED_REDIS_FILES else path


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _file_scope(nodeid)

    config.option.loadscopereorder = False  # keep the collection order below, slowest first
    return FileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(_SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


# ============================================================================
# The JSON log, captured (tests/test_log_lines.py, tests/test_secrets_channels.py)

class Writes(io.StringIO):
    """A stream that remembers each write call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def write(self, s: str) -> int:
        self.calls.append(s)
        return super().write(s)


@pytest.fixture
def log_stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[Writes]:
    """setup_logging's handler writing to a Writes (every write call kept); the loggers put back afterwards."""
    names = (logs.LOGGER_NAME, "uvicorn", "uvicorn.error")
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level, logging.getLogger(n).propagate)
             for n in names}
    out = Writes()
    monkeypatch.setattr(logs.sys, "stderr", out)
    monkeypatch.setattr(logs, "_direct", None)
    logs.setup_logging()
    yield out
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate


# ============================================================================
# The app over ASGI (tests/test_hostile_rounds.py, tests/test_readback_leaks.py)

@pytest.fixture
async def asgi_client(upstream: MockUpstream, tmp_path: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The app in process, its lifespan run, reached over ASGI (a fresh SQLite store per test)."""
    app = create_app(make_settings(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db"))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy", timeout=30) as c:
            yield c
