"""Real local Redis topologies for the store tests: a Redis Cluster (three primaries, one replica each)
and a Sentinel set (a primary, a replica, three sentinels), each started in a temporary directory on free
ports and stopped afterwards.

`redis-server` and `redis-cli` must be on PATH. Without them the tests that need a topology skip with the
install command, except under CI=true, where they fail (.ci/run checks for both before the suite runs), as
they do whenever a topology does not come up.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
import redis

BINARIES = ("redis-server", "redis-cli")
INSTALL = "apt-get install -y redis-server redis-tools"
HOST = "127.0.0.1"
NODE_TIMEOUT_MS = 1000  # cluster: a primary silent this long is suspected; its replica takes over soon after
DOWN_AFTER_MS = 500  # sentinel: a primary silent this long is subjectively down
FAILOVER_TIMEOUT_MS = 2000
SERVICE = "ctxproxy"
UP_WITHIN_S = 30.0  # generous: a loaded 2-core machine; a healthy start takes 1-3 s
POLL_S = 0.05
BUS_PORT_OFFSET = 10000  # a cluster node's bus port is its port + 10000


def binaries_or_skip() -> None:
    """Skip (fail under CI=true) when the Redis binaries are missing."""
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        why = f"{' and '.join(missing)} not on PATH (install: {INSTALL})"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: {why}; the cluster and sentinel store tests need them", pytrace=False)
        pytest.skip(why)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_ports(n: int, bus: bool = False) -> list[int]:
    """``n`` ports free now (and their bus ports, for cluster nodes), from a random range so parallel runs differ."""
    rng = random.Random()
    while True:
        base = rng.randrange(20000, 29000)
        ports = list(range(base, base + n))
        if all(_free(p) and (not bus or _free(p + BUS_PORT_OFFSET)) for p in ports):
            return ports


def _until(what: str, ok: object, within: float = UP_WITHIN_S) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if callable(ok) and ok():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {within:g}s")
        time.sleep(POLL_S)


def client(port: int) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, socket_timeout=2, socket_connect_timeout=2)


class Server:
    """One redis-server process (a data node or a sentinel) that this module started."""

    def __init__(self, port: int, home: Path, args: list[str], sentinel: bool = False) -> None:
        self.port, self.home, self.args, self.sentinel = port, home, args, sentinel
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        if self.sentinel:
            conf = self.home / "sentinel.conf"
            conf.write_text("\n".join(self.args) + "\n")
            argv = ["redis-server", str(conf), "--sentinel", "--port", str(self.port), "--bind", HOST]
        else:
            argv = ["redis-server", "--port", str(self.port), "--bind", HOST, "--dir", str(self.home),
                    "--save", "", "--appendonly", "no", "--repl-diskless-sync-delay", "0", *self.args]
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - the process owns it while it runs
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.home)
        log.close()
        _until(f"redis-server on port {self.port} answering", lambda: client(self.port).ping())

    def kill(self) -> None:
        """SIGKILL: the node vanishes mid-flight, as a crashed host does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """SIGSTOP for the block: the process holds its connections and answers nothing, as a stalled host does."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        path = self.home / ("sentinel.log" if self.sentinel else "server.log")
        return path.read_text(errors="replace") if path.exists() else ""


def crossslot_errors(ports: list[int]) -> int:
    """CROSSSLOT errors the nodes answered since they started (INFO errorstats); nodes that are down count 0."""
    total = 0
    for port in ports:
        try:
            stats = client(port).info("errorstats")
        except (redis.RedisError, OSError):
            continue
        total += int(stats.get("errorstat_CROSSSLOT", {}).get("count", 0))
    return total


class Cluster:
    """Six cluster nodes: three primaries, one replica each, covering every slot."""

    def __init__(self, home: Path) -> None:
        self.ports = free_ports(6, bus=True)
        self.nodes = [Server(p, home / f"node-{p}", ["--cluster-enabled", "yes", "--cluster-config-file",
                                                     "nodes.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS)])
                      for p in self.ports]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in self.ports[:3]) + "/"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(["redis-cli", "--cluster", "create", *(f"{HOST}:{p}" for p in self.ports),
                        "--cluster-replicas", "1", "--cluster-yes"],
                       check=True, capture_output=True, timeout=UP_WITHIN_S)
        _until("cluster_state:ok on every node, three replicas in sync",
               lambda: all(client(p).cluster("info")["cluster_state"] == "ok" for p in self.ports)
               and len(self.replicas()) == 3
               and all(client(r).info("replication")["master_link_status"] == "up" for r in self.replicas()))

    def _nodes(self, port: int) -> dict[str, dict[str, object]]:
        return client(port).cluster("nodes")  # type: ignore[no-any-return]

    def replicas(self) -> list[int]:
        return [int(addr.split("@")[0].split(":")[1]) for addr, info in self._nodes(self.ports[0]).items()
                if "slave" in str(info["flags"]) and "fail" not in str(info["flags"])]

    def primary_of(self, name: bytes) -> int:
        """The port of the live primary that holds the slot of a stored name."""
        slot = int(client(self.ports[0]).cluster("keyslot", name))
        for port in self.live_ports():
            shards = client(port).cluster("slots")
            for start, end, primary, *_ in shards:
                if start <= slot <= end:
                    return int(primary[1])
        raise RuntimeError(f"no live node holds slot {slot}")

    def replica_of(self, primary: int) -> int:
        me = client(primary).cluster("myid").decode()
        for addr, info in self._nodes(primary).items():
            if info.get("master_id") == me:
                return int(addr.split("@")[0].split(":")[1])
        raise RuntimeError(f"primary {primary} has no replica")

    def node(self, port: int) -> Server:
        return next(n for n in self.nodes if n.port == port)

    def live_ports(self) -> list[int]:
        return [n.port for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def crossslot_errors(self) -> int:
        return crossslot_errors(self.live_ports())

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelSet:
    """A primary, its replica, and three sentinels that promote the replica when the primary dies."""

    def __init__(self, home: Path) -> None:
        primary, replica, *sentinels = free_ports(5)
        self.primary = Server(primary, home / f"primary-{primary}", [])
        self.replica = Server(replica, home / f"replica-{replica}", ["--replicaof", HOST, str(primary)])
        ids = {p: os.urandom(20).hex() for p in sentinels}
        # Each sentinel is told its id and its peers' (and the replica) up front: discovering them by their
        # hello messages takes a 2 s round, and a failover needs a majority of sentinels that know each other.
        self.sentinels = [Server(p, home / f"sentinel-{p}", [
            f"sentinel myid {ids[p]}",
            f"sentinel monitor {SERVICE} {HOST} {primary} 2",
            *(f"sentinel known-sentinel {SERVICE} {HOST} {q} {ids[q]}" for q in sentinels if q != p),
            f"sentinel known-replica {SERVICE} {HOST} {replica}",
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {SERVICE} 1",
            f"logfile {home / f'sentinel-{p}' / 'sentinel.log'}",
        ], sentinel=True) for p in sentinels]

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"{HOST}:{s.port}" for s in self.sentinels) + f"/{SERVICE}/0"

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        _until("the sentinel replica in sync",
               lambda: client(self.replica.port).info("replication")["master_link_status"] == "up")
        for s in self.sentinels:
            s.start()
        _until("every sentinel knowing the replica and the two other sentinels", self._sentinels_ready)

    def _sentinels_ready(self) -> bool:
        for s in self.sentinels:
            c = client(s.port)
            master = c.sentinel_master(SERVICE)
            if int(master["num-other-sentinels"]) < 2 or not c.sentinel_slaves(SERVICE):
                return False
        return True

    def primary_port(self) -> int:
        host, port = client(self.sentinels[0].port).sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def data_ports(self) -> list[int]:
        return [self.primary.port, self.replica.port]

    def stop(self) -> None:
        for s in (*self.sentinels, self.replica, self.primary):
            s.stop()


@contextmanager
def running(topology: Cluster | SentinelSet) -> Iterator[Cluster | SentinelSet]:
    """The topology up for the block, down after it (every process it started, whatever happened)."""
    with ExitStack() as stack:
        stack.callback(topology.stop)
        try:
            topology.start()
        except (RuntimeError, subprocess.SubprocessError, redis.RedisError, OSError) as e:
            pytest.fail(f"local Redis {type(topology).__name__} did not come up: {e}", pytrace=False)
        yield topology


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the session's store tests (the failover tests start their own: they kill a node)."""
    binaries_or_skip()
    with running(Cluster(tmp_path_factory.mktemp("redis-cluster"))) as c:
        assert isinstance(c, Cluster)
        yield c


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSet]:
    binaries_or_skip()
    with running(SentinelSet(tmp_path_factory.mktemp("redis-sentinel"))) as s:
        assert isinstance(s, SentinelSet)
        yield s
