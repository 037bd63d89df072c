"""Replicas on a Redis Cluster and on a Sentinel-managed primary: the same bytes as one proxy, and a primary's
death costs context management only until its replica takes over, never a handle already given.

The topologies are real local ones (tests/redis_topology.py). The byte test shares the session's; each
failover test starts its own, since it kills a node. Promotion is the topologies' own, never forced: the
cluster's replica takes over once the other primaries agree its primary failed (node timeout 1 s), the
sentinels promote theirs after 0.5 s of silence.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from proxy_server import InProcessProxy, make_settings
from redis_topology import Cluster, SentinelSet, binaries_or_skip, client, running
from test_compress import assert_replicas_send_one_proxys_bytes

import proxy.store.guarded as guarded
from proxy.engine.routing import tenant_id
from proxy.store.keys import session_key, tenant_key
from proxy.store.redis import RedisStore

SALT = "ctxproxy-tenant-v1"
HANDLE = re.compile(r'context_read\(handle="(ctx_[0-9a-f]+)"')
OFFLOAD = {"offload": {"tool_result_tokens": 300}}
TURNS_BEFORE, TURNS_DURING = 4, 2
RECOVERY_WITHIN_S = 30.0  # promotion takes 1-3 s here; generous for a loaded machine
REQUEST_TIMEOUT_S = 10.0


@pytest.mark.parametrize("topology", ["redis_cluster", "redis_sentinel"])
def test_two_replicas_send_the_same_bytes_as_one_proxy(upstream, tmp_path, topology, request):
    url = request.getfixturevalue(topology).url
    assert_replicas_send_one_proxys_bytes(upstream, url, f"sqlite:///{tmp_path}/one.db")
    if isinstance(request.getfixturevalue(topology), Cluster):
        assert request.getfixturevalue(topology).crossslot_errors() == 0


@pytest.mark.parametrize("topology", ["redis_cluster", "redis_sentinel"])
async def test_a_handle_write_waits_for_the_replica_of_its_own_primary(topology, request):
    """WAIT counts the writes of the connection it is sent on: sent anywhere else it would answer at once, the write
    unchecked. While the replica of the write's own primary is stopped, the write is said unreplicated."""
    topo = request.getfixturevalue(topology)
    prefix = f"ctxproxy-test:{uuid.uuid4().hex}:"
    patient = RedisStore(topo.url + "?wait=1&wait_ms=5000", prefix=prefix, socket_timeout=10)  # replicas answer
    impatient = RedisStore(topo.url + "?wait=1&wait_ms=50", prefix=prefix)
    try:
        await patient.put("t:wait:blob:a", b"v")
        await patient.put_counted("t:wait:blob:b", b"v", "t:wait:archive", 1000)
        assert patient.unreplicated == 0  # the replica acknowledged both
        name = impatient.layout.name("b:", "t:wait:blob:c")
        replica = topo.node(topo.replica_of(topo.primary_of(name))) if isinstance(topo, Cluster) else topo.replica
        told: list[int] = []
        impatient.on_unreplicated = lambda: told.append(1)  # ProxyState's hook: /metrics counts it
        with replica.stopped():  # far shorter than the node timeout or down-after: no failover
            await impatient.put("t:wait:blob:c", b"v")
        assert impatient.unreplicated == 1 and told == [1]
        await patient.put("t:wait:blob:d", b"v")
        assert patient.unreplicated == 0
        assert await patient.get("t:wait:blob:c") == b"v"  # on the primary all along
    finally:
        await patient.close()
        await impatient.close()


# --------------------------------------------------------------------------- failover

def session_turn(history: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The agent's next turn: it ran a command whose output is big enough to offload."""
    text = "\n".join(f"turn {n} line {i}: worker processed item {i * 7919 % 100003} ok" for i in range(300))
    call = f"call_{n}"
    return [*history,
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function",
                 "function": {"name": "bash", "arguments": f'{{"cmd": "cat log{n}"}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": text}]


class Agent:
    """One agent session through two proxies, alternating; what each request sent upstream is kept."""

    def __init__(self, proxies: list[InProcessProxy], upstream: Any, key: str, session: str) -> None:
        self.clients = [p.http_client(timeout=REQUEST_TIMEOUT_S) for p in proxies]
        self.upstream, self.key, self.session = upstream, key, session
        self.history: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                              {"role": "user", "content": "Find the failing item in the logs."}]
        self.n = 0

    def turn(self, new: bool = True) -> tuple[httpx.Response, bytes, bytes]:
        """(response, what the client sent, what went upstream) for the next turn (or the same history again)."""
        if new:
            self.n += 1
            self.history = session_turn(self.history, self.n)
        raw = orjson.dumps({"model": "m", "messages": self.history})
        r = self.clients[self.n % 2].post(
            "/v1/chat/completions", content=raw,
            headers={"content-type": "application/json", "authorization": f"Bearer {self.key}",
                     "x-session-id": self.session})
        assert r.status_code == 200, r.text
        return r, raw, self.upstream.requests[-1].body

    def read(self, handle: str, which: int) -> httpx.Response:
        return self.clients[which].get(f"/ctx/v1/blobs/{handle}", headers={"authorization": f"Bearer {self.key}"})

    def close(self) -> None:
        for c in self.clients:
            c.close()


def until(what: str, ok: Callable[[], bool]) -> None:
    deadline = time.monotonic() + RECOVERY_WITHIN_S
    while not ok():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {RECOVERY_WITHIN_S:g} s")
        time.sleep(0.2)


def handles_of(body: bytes) -> list[str]:
    """The handles in the tool results a request sent upstream, in order."""
    return [h for m in orjson.loads(body)["messages"] if m["role"] == "tool" for h in HANDLE.findall(m["content"])]


def failover_run(upstream: Any, url: str, kill_primary: Callable[[], None], key: str, session: str,
                 caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenario, on either topology: `kill_primary()` SIGKILLs the primary holding the session and its handles."""
    monkeypatch.setattr(guarded, "MAX_BACKOFF_S", 1.0)  # a probe at least every second: recovery shows quickly
    caplog.set_level(logging.DEBUG)
    cfg = make_settings(upstream.base_url, url, defaults=OFFLOAD)
    with InProcessProxy(cfg) as p1, InProcessProxy(cfg) as p2:
        agent = Agent([p1, p2], upstream, key, session)
        try:
            sent_before: list[bytes] = []
            for _ in range(TURNS_BEFORE):
                r, raw, sent = agent.turn()
                assert "x-ctxproxy-degraded" not in r.headers and r.headers.get("x-ctxproxy-offloaded") == str(agent.n)
                sent_before.append(sent)
            given = handles_of(sent_before[-1])
            assert len(given) == TURNS_BEFORE  # every result offloaded, each behind its own handle

            kill_primary()
            for _ in range(TURNS_DURING):  # the gap: answered, the client's own bytes forwarded
                r, raw, sent = agent.turn()
                assert r.headers.get("x-ctxproxy-degraded") == "store-unavailable"
                assert sent == raw

            until("the proxies managing context again", lambda: all(
                "x-ctxproxy-degraded" not in agent.turn(new=False)[0].headers for _ in range(2)))
            r, raw, sent = agent.turn()
            assert "x-ctxproxy-degraded" not in r.headers and sent != raw
            # Every handle given before the kill still reads back, on both proxies, and the session's old
            # placeholders are the ones it was sent before: the decisions survived with the text.
            for which in (0, 1):
                for handle in given:
                    got = agent.read(handle, which)
                    assert got.status_code == 200 and "worker processed item" in got.text, handle
            assert handles_of(sent)[:TURNS_BEFORE] == given
            old = orjson.loads(sent_before[-1])["messages"]
            assert orjson.loads(sent)["messages"][:len(old) - 1] == old[:-1]  # all but the status bar
        finally:
            agent.close()
    assert "CROSSSLOT" not in caplog.text


def test_cluster_primary_killed_mid_session(upstream, tmp_path: Path, caplog, monkeypatch):
    binaries_or_skip()
    with running(Cluster(tmp_path / "cluster")) as cluster:
        assert isinstance(cluster, Cluster)

        key = f"sk-{uuid.uuid4()}"
        tenant = tenant_id(key, SALT)
        layout = RedisStore(cluster.url).layout  # the proxies' own prefix (no connection is opened)
        primary = cluster.primary_of(layout.name("b:", tenant_key(tenant, "blob", "x")))  # the tenant's handles
        # A session whose own keys (timeline, inspector, compactions) sit on that primary too: its death takes both.
        session = next(s for s in (f"failover-{n}" for n in range(1000))
                       if cluster.primary_of(layout.name("l:", session_key(tenant, s, "timeline"))) == primary)
        replica = cluster.replica_of(primary)
        failover_run(upstream, cluster.url, cluster.node(primary).kill, key, session, caplog, monkeypatch)
        assert client(replica).info("replication")["role"] == "master"  # promoted by the cluster itself
        assert cluster.crossslot_errors() == 0


def test_sentinel_primary_killed_mid_session(upstream, tmp_path: Path, caplog, monkeypatch):
    binaries_or_skip()
    with running(SentinelSet(tmp_path / "sentinel")) as sentinels:
        assert isinstance(sentinels, SentinelSet)
        first = sentinels.primary_port()

        failover_run(upstream, sentinels.url, sentinels.primary.kill, f"sk-{uuid.uuid4()}", "failover-session",
                     caplog, monkeypatch)
        assert sentinels.primary_port() == sentinels.replica.port != first

