"""`ctxproxy serve --workers 2` as users run it: the same bytes upstream and the same figures whichever worker answers.

Every request goes over a fresh connection, which first asks /healthz: one
connection is served by one worker, so the `worker` /healthz names is the
worker that answered the request after it on that connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import crafted
import httpx
import pytest
from cli_main import run_main
from test_figures import metric
from test_serve import free_port

from proxy.accounting.stats import stats
from proxy.config import build_settings
from proxy.engine.routing import tenant_id
from proxy.store.sqlite import SqliteStore

# A socket per worker (proxy/cli/worker_sockets.py): the kernel hashes each connection to one, so 32 split
# about evenly; fewer than 4 on a worker has a chance of 3 in a million (on one shared socket, whichever
# worker is awake takes them: often all of them).
SPLIT_CONNECTIONS, SPLIT_AT_LEAST = 32, 4
MAX_CONNECTIONS = 64  # connections opened, and held open, until both workers have accepted one
REDIS = "redis://127.0.0.1:6379/11"


class Workers:
    """A running `ctxproxy serve --workers 2`."""

    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    @contextmanager
    def a_connection_to_each(self) -> Iterator[dict[int, httpx.Client]]:
        """One open connection to each worker: connections are opened (and kept open) until both workers hold one.

        Which worker accepts a fresh connection is the kernel's choice, so sending on fresh connections until
        both have answered may take any number of tries; connections kept open stay with their worker."""
        opened: list[httpx.Client] = []
        chosen: dict[int, httpx.Client] = {}
        try:
            while len(chosen) < 2 and len(opened) < MAX_CONNECTIONS:
                c = httpx.Client(base_url=self.url, timeout=30)
                opened.append(c)
                chosen.setdefault(c.get("/healthz").json()["worker"], c)
            assert len(chosen) == 2, f"{len(opened)} connections all went to one worker"
            yield chosen
        finally:
            for c in opened:
                c.close()

    def split_of(self, n: int) -> dict[int, int]:
        """How many of `n` connections, opened one after another and all held open, each worker accepted."""
        opened = [httpx.Client(base_url=self.url, timeout=30) for _ in range(n)]
        try:
            return Counter(c.get("/healthz").json()["worker"] for c in opened)
        finally:
            for c in opened:
                c.close()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


@pytest.fixture
def workers(tmp_path: Path, upstream, request: pytest.FixtureRequest) -> Iterator[Workers]:
    store = request.param if request.param != "sqlite" else f"sqlite:///{tmp_path}/shared.db"
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"upstream": {"base_url": upstream.base_url}, "store": store,
                               "models": {crafted.MODEL: {"context_window": crafted.WINDOW}},
                               "defaults": {**crafted.DEFAULTS, "status_bar": {"enabled": False}}}))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    log = tmp_path / "proxy.log"
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--config", str(cfg), "--port", str(port),
                             "--workers", "2"], cwd=tmp_path, env=env, stdout=(tmp_path / "stdout").open("w"),
                            stderr=log.open("w"))
    served = Workers(proc, f"http://127.0.0.1:{port}", log)
    try:
        _wait_for_both(served)
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def _wait_for_both(w: Workers) -> None:
    """Until both workers have finished starting (each logs it), so that either may take a connection."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if w.log.read_text().count("Application startup complete") == 2:
            return
        if w.proc.poll() is not None:
            raise AssertionError(f"ctxproxy serve exited: {w.log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"both workers did not start: {w.log.read_text()}")


def _listening_sockets(pid: int, port: int) -> set[str]:
    """The inodes of the sockets listening on `port` that process `pid` holds (/proc/net/tcp, /proc/<pid>/fd)."""
    listening = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(name).read_text().splitlines()[1:]:
            f = row.split()
            if int(f[1].rsplit(":", 1)[1], 16) == port and f[3] == "0A":  # 0A: LISTEN
                listening.add(f[9])
    held = {os.readlink(fd).removeprefix("socket:[").rstrip("]") for fd in Path(f"/proc/{pid}/fd").iterdir()
            if os.readlink(fd).startswith("socket:[")}
    return listening & held


def _log(w: Workers) -> list[dict]:
    return [json.loads(x) for x in w.log.read_text().splitlines() if x.startswith("{")]


def _figures_until(w: Workers, key: str, session: str, sent: int) -> list[tuple[int, float, int, int]]:
    """(worker, /metrics 200 answers, /ctx/v1/stats requests, timeline length), asked on a connection to each
    until each worker has answered twice with every request counted. A worker writes its requests' figures to
    the store within a flush of its accounting (proxy/accounting/accountant.py FLUSH_DELAY) after each response,
    so a figure read on the other worker may first lag; it never exceeds what was sent."""
    auth = {"authorization": f"Bearer {key}"}
    seen: list[tuple[int, float, int, int]] = []
    deadline = time.monotonic() + 30
    with w.a_connection_to_each() as each:
        while time.monotonic() < deadline and len(seen) < 4:
            for pid, c in each.items():
                m = c.get("/metrics")
                stats = c.get("/ctx/v1/stats", headers=auth)
                timeline = c.get(f"/ctx/v1/sessions/{session}", headers=auth)
                row = (pid, metric(m.text, "ctxproxy_requests_total", status="200"),
                       stats.json()["totals"]["all"]["requests"], len(timeline.json()["requests"]))
                assert max(row[1:]) <= sent, row
                if row[1:] == (sent, sent, sent) and sum(p == pid for p, *_ in seen) < 2:
                    seen.append(row)
            if len(seen) == 4:
                return seen
    raise AssertionError(f"figures never reached {sent} on both workers: {seen}")


@pytest.mark.parametrize("workers", ["sqlite", REDIS], indirect=True)
def test_two_workers_send_the_same_bytes_and_report_the_same_figures(workers, upstream):
    key, session = f"sk-{uuid.uuid4().hex[:8]}", f"workers-{uuid.uuid4().hex[:8]}"
    upstream.windows[crafted.MODEL] = crafted.WINDOW
    headers = {"authorization": f"Bearer {key}", "x-session-id": session}
    bodies: dict[int, list[tuple[int, bytes]]] = defaultdict(list)  # request of the session -> (worker, upstream body)
    sent = 0
    split = workers.split_of(SPLIT_CONNECTIONS)
    assert min(split.values()) >= SPLIT_AT_LEAST
    listening = [_listening_sockets(pid, int(workers.url.rsplit(":", 1)[1])) for pid in split]
    assert all(len(x) == 1 for x in listening) and listening[0] != listening[1]  # a socket each, not one shared
    with workers.a_connection_to_each() as each:
        for i, msgs in enumerate(crafted.requests()):
            for pid, c in each.items():  # the session's request i on one worker, then the same on the other
                r = c.post("/v1/chat/completions", headers=headers,
                           json={"model": crafted.MODEL, "messages": msgs, "tools": crafted.TOOLS})
                assert r.status_code == 200, r.text
                assert c.get("/healthz").json()["worker"] == pid  # still the same connection, the same worker
                sent += 1
                bodies[i].append((pid, upstream.requests[-1].body))
    for i, b in bodies.items():
        assert len({p for p, _ in b}) == 2, f"request {i} was only ever answered by one worker"
        assert len({body for _, body in b}) == 1, f"request {i} reached the upstream in different bytes"
    first = [json.loads(bodies[i][0][1]) for i in range(3)]
    assert crafted.expected({"messages": crafted.requests()[2], "tools": crafted.TOOLS}, first[2]).compress > 0
    assert all(crafted.expected({"messages": m, "tools": crafted.TOOLS}, f).offload > 0
               for m, f in zip(crafted.requests(), first))  # rewritten, not passed through: offloads, a compaction

    assert f"{workers.url.split('//')[1]} with 2 workers;" in (workers.log.parent / "stdout").read_text()
    _figures_until(workers, key, session, sent)
    served = {line["worker"] for line in _log(workers) if line.get("msg") == "request"}
    assert len(served) == 2
    assert workers.stop() == 0
    assert "Traceback" not in workers.log.read_text()


@pytest.mark.parametrize("workers", ["sqlite"], indirect=True)
def test_sigterm_to_the_parent_lets_every_worker_finish_its_requests(workers, upstream, tmp_path):
    upstream.delay = 1.0  # each request is in flight on its worker when the signal comes
    key = f"sk-{uuid.uuid4().hex[:8]}"
    answers: dict[int, int] = {}
    taken = threading.Lock()

    def one_slow_request_per_worker() -> None:
        for _ in range(50):
            with httpx.Client(base_url=workers.url, timeout=30) as c:
                pid = c.get("/healthz").json()["worker"]
                with taken:
                    if pid in answers:
                        continue
                    answers[pid] = 0
                r = c.post("/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                           json={"model": crafted.MODEL, "messages": [{"role": "user", "content": "hi"}]})
                answers[pid] = r.status_code
                return

    threads = [threading.Thread(target=one_slow_request_per_worker) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while len(upstream.requests) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(upstream.requests) == 2 and len(answers) == 2  # one request in flight on each worker
    assert workers.stop() == 0
    for t in threads:
        t.join(timeout=30)
    assert sorted(answers.values()) == [200, 200]
    log = _log(workers)
    assert sorted(line["worker"] for line in log if line.get("msg") == "request") == sorted(answers)
    assert sum(line.get("msg") == "Application shutdown complete." for line in log) == 2
    assert asyncio.run(_requests_stored(tmp_path / "shared.db", key)) == 2  # each worker wrote its figures first


async def _requests_stored(db: Path, key: str) -> int:
    store = SqliteStore(db)
    try:
        return (await stats(store, tenant_id(key, build_settings({}, env={}).tenant_salt)))["totals"]["all"]["requests"]
    finally:
        await store.close()


@pytest.mark.parametrize("value, says", [("0", "greater than or equal to 1"), ("two", "valid integer"),
                                         ("1.5", "valid integer")])
def test_a_bad_worker_count_is_refused_in_one_line(value, says):
    r = run_main("serve", "--workers", value)  # it stops before serving: main in process
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("ctxproxy: invalid configuration:") and "server.workers" in line and says in line


@pytest.mark.parametrize("workers", ["sqlite"], indirect=True)
def test_a_worker_that_dies_is_replaced_on_its_own_socket(workers):
    port = int(workers.url.rsplit(":", 1)[1])
    before = {pid: _listening_sockets(pid, port) for pid in workers.split_of(SPLIT_CONNECTIONS)}
    dead, alive = sorted(before)
    os.kill(dead, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # uvicorn's supervisor checks its workers every 0.5 s
        now = set(workers.split_of(SPLIT_CONNECTIONS))
        if dead not in now and len(now) == 2:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"no worker replaced {dead}: {workers.log.read_text()[-2000:]}")
    (new,) = now - {alive}
    assert _listening_sockets(new, port) == before[dead]  # the dead worker's socket, kept open by the parent
    assert _listening_sockets(alive, port) == before[alive]
    assert workers.stop() == 0
