"""The processes: the proxies under test (`serve --workers N` on Redis, as users start them, and the CPU of each
one's processes) and the mock provider."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from bench.overhead.cpu import process_cpu_ns
from bench.overhead.processes import free_port
from bench.paths import PROXY_CLI, ROOT
from bench.scaling.config import MODEL, WINDOW

START_TIMEOUT_S = 60.0


class Proxy:
    """One `ctxproxy serve --workers N`: its URL, its parent and worker pids, their CPU so far."""

    def __init__(self, tmp: str, mock_url: str, store: str, workers: int) -> None:
        self.workers = workers
        self.name = f"{workers} worker" + ("s" if workers > 1 else "")
        work = os.path.join(tmp, f"workers-{workers}")
        os.makedirs(work, exist_ok=True)
        config = os.path.join(work, "config.yaml")
        with open(config, "w") as f:  # JSON is YAML
            json.dump({"upstream": {"base_url": mock_url}, "store": store,
                       "models": {MODEL: {"context_window": WINDOW}},
                       "defaults": {"status_bar": {"enabled": False}}}, f)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(work, "proxy.log")
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
        env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
                   PYTHONPATH=os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p))
        self.command = [sys.executable, "-m", PROXY_CLI, "serve", "--config", config, "--port", str(port),
                        "--workers", str(workers)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command, cwd=work, env=env, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.pids: list[int] = []  # the parent and its children that are not workers
        self.worker_pids: list[int] = []

    def wait_started(self) -> None:
        """Until every worker has started (each logs it); then the pids to measure are known."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                text = f.read()
            if text.count("Application startup complete") == self.workers:
                if self.workers == 1:
                    self.pids, self.worker_pids = [self.proc.pid], [self.proc.pid]
                    return
                self.worker_pids = sorted(int(x) for x in re.findall(r"Started server process \[(\d+)\]", text))
                self.pids = [self.proc.pid, *(p for p in _children(self.proc.pid) if p not in self.worker_pids)]
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name}: ctxproxy serve exited with {self.proc.returncode}:\n{text[-2000:]}")
            time.sleep(0.1)
        raise SystemExit(f"{self.name}: not started after {START_TIMEOUT_S:.0f} s; see {self.log_path}")

    def cpu_ns(self) -> list[int]:
        """CPU time so far, ns: of the parent and its other children (uvicorn's supervisor, multiprocessing's
        resource tracker) together, then of each worker; one entry, the process, with 1 worker."""
        workers = [process_cpu_ns(pid) or 0 for pid in self.worker_pids]
        if self.workers == 1:
            return workers
        return [sum(process_cpu_ns(pid) or 0 for pid in self.pids), *workers]

    def stop(self) -> None:
        stop(self.proc)  # SIGTERM: drains every worker


def start_mock() -> subprocess.Popen[str]:
    """The cheap mock provider (bench/workers/mock.py); it prints its URL on its first line."""
    return subprocess.Popen([sys.executable, "-m", "bench.workers.mock"], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within a minute."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, from /proc/*/stat (uvicorn's workers; its resource tracker, if any,
    is a process too and is measured with them)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry))
    return sorted(out)
