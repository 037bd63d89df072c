"""The Redis store URL forms (one server, Cluster, Sentinel) are read as documented, refused in one line that never
shows a password, accepted by the config, and `ctxproxy check` asks a live Cluster or Sentinel set like one server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import probe as cli_probe
from proxy.config import load_settings
from proxy.errors import ConfigError
from proxy.store import RedisStore, open_store
from proxy.store.guarded import ask_backend
from proxy.store.redis_url import DEFAULT_WAIT_MS, parse_redis_url

ROOT = Path(__file__).resolve().parents[1]
SECRET = "s3cr3t-pw"


def test_cluster_url_names_its_seed_nodes_and_waits_for_one_replica() -> None:
    t = parse_redis_url(f"redis+cluster://app:{SECRET}@10.0.0.1:7000,10.0.0.2,[::1]:7002/")
    assert t.mode == "cluster" and not t.ssl
    assert t.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 6379), ("::1", 7002))
    assert (t.username, t.password, t.db) == ("app", SECRET, 0)
    assert (t.wait, t.wait_ms) == (1, DEFAULT_WAIT_MS)
    assert parse_redis_url("rediss+cluster://h:1").ssl and parse_redis_url("redis+cluster://h:1?wait=0").wait == 0


def test_sentinel_url_names_the_sentinels_the_service_and_the_db() -> None:
    t = parse_redis_url(f"redis+sentinel://:{SECRET}@s1,s2:26380/my-primary/3?wait=2&wait_ms=50&sentinel_password=x")
    assert t.mode == "sentinel" and t.nodes == (("s1", 26379), ("s2", 26380))
    assert (t.service, t.db, t.password, t.username) == ("my-primary", 3, SECRET, None)
    assert (t.wait, t.wait_ms, t.sentinel_password) == (2, 50, "x")
    assert parse_redis_url("redis+sentinel://s1/p").db == 0


def test_one_server_url_keeps_redis_py_options_and_takes_out_the_stores_own() -> None:
    t = parse_redis_url(f"redis://:{SECRET}@h:6380/2?wait=1&health_check_interval=5")
    assert t.mode == "single" and t.wait == 1
    assert t.single_url == f"redis://:{SECRET}@h:6380/2?health_check_interval=5"
    assert parse_redis_url("redis://h/0").wait == 0  # a single server may have no replica to wait for


@pytest.mark.parametrize(("url", "says"), [
    (f"redis+cluster://:{SECRET}@h:1/4", "database 0 only"),
    (f"redis+cluster://:{SECRET}@", "at least one host"),
    (f"redis+cluster://:{SECRET}@h:notaport/", "port is not a number"),
    (f"redis+cluster://:{SECRET}@h:1/?socket_timeout=1", "unknown option(s) socket_timeout"),
    (f"redis+sentinel://:{SECRET}@h:1", "/<service-name>"),
    (f"redis+sentinel://:{SECRET}@h:1/svc/x", "must be a number"),
    (f"redis+sentinel://:{SECRET}@h:1/svc?wait=-1", "wait must be a whole number"),
    (f"redis://:{SECRET}@h:1/0?wait_ms=soon", "wait_ms must be a whole number"),
])
def test_a_malformed_url_is_refused_in_one_line_without_its_password(url: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        open_store(url)
    message = str(info.value)
    assert says in message and SECRET not in message and "\n" not in message


def test_the_config_accepts_the_three_forms_and_refuses_a_malformed_one(tmp_path: Path) -> None:
    for url in ("redis://h:1/0", "redis+cluster://h:1,h:2/", "rediss+sentinel://s:1/primary/0"):
        assert load_settings(env={"CTXPROXY_STORE": url}).store == url
    with pytest.raises(ConfigError) as info:
        load_settings(env={"CTXPROXY_STORE": f"redis+sentinel://:{SECRET}@s:1"})
    assert "service-name" in str(info.value) and SECRET not in str(info.value)


def test_a_wait_never_outlasts_the_socket_timeout() -> None:
    """WAIT blocks its connection: a wait past the socket timeout would fail the very write it guards."""
    assert RedisStore("redis+cluster://h:1/?wait_ms=5000", socket_timeout=0.5).wait_ms == 250
    assert RedisStore("redis+cluster://h:1/?wait_ms=30", socket_timeout=0.5).wait_ms == 30


def test_a_store_prefix_with_a_brace_is_refused() -> None:
    with pytest.raises(ValueError, match="must not contain"):
        RedisStore("redis://127.0.0.1:6379/0", prefix="app{1}:")


def test_check_asks_a_live_cluster_and_sentinel_set(redis_cluster, redis_sentinel) -> None:
    assert cli_probe.store_problem(redis_cluster.url) is None
    assert cli_probe.store_problem(redis_sentinel.url) is None


async def test_both_topologies_open_with_the_store_timeout(redis_cluster, redis_sentinel) -> None:
    for url, mode in ((redis_cluster.url, "cluster"), (redis_sentinel.url, "sentinel")):
        store = open_store(url, 0.3)
        assert isinstance(store, RedisStore) and store.mode == mode
        try:
            await store.put("t:urls:k", b"v")
            assert await store.get("t:urls:k") == b"v"
        finally:
            await store.delete("t:urls:k")
            await store.close()


def test_check_says_a_dead_cluster_or_sentinel_set_in_one_line_without_the_password(tmp_path: Path, upstream) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    for url in (f"redis+cluster://:{SECRET}@127.0.0.1:1,127.0.0.1:2/",
                f"redis+sentinel://:{SECRET}@127.0.0.1:1/primary/0"):
        r = subprocess.run([sys.executable, "-m", "proxy.cli", "check"], capture_output=True, text=True, timeout=60,
                           cwd=tmp_path, env={**env, "PYTHONPATH": str(ROOT), "CTXPROXY_STORE": url,
                                              "CTXPROXY_UPSTREAM": upstream.base_url})
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert SECRET not in r.stdout + r.stderr and ":***@127.0.0.1:1" in r.stdout
        (line,) = r.stderr.splitlines()
        assert "is unreachable: redis get failed: " in line  # the backend's own reason, not the probe's deadline


def test_a_dead_topology_fails_fast_as_a_store_error() -> None:
    async def ask(url: str) -> str | None:
        store = open_store(url, 0.3)
        try:
            return await asyncio.wait_for(ask_backend(store, 0.5), 5)
        finally:
            await store.close()
    for url in ("redis+cluster://127.0.0.1:1/", "redis+sentinel://127.0.0.1:1/primary/0"):
        assert asyncio.run(ask(url)) is not None
