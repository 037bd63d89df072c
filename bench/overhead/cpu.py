"""CPU time the processes spend over the recorded loops (Linux schedstat), and the loops' noise control."""

from __future__ import annotations

import gc
import os
import time
from typing import Any

from bench.overhead.config import FLOOR, LITELLM, PROXY
from bench.overhead.processes import Processes


def process_cpu_ns(pid: int) -> int | None:
    """CPU time of all threads of `pid` so far, ns (Linux schedstat; None elsewhere)."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


class CpuMeter:
    """CPU consumed by the proxy, the mock, the floor and LiteLLM (those running) over the recorded part of a
    scenario, and by this process (the client)."""

    def __init__(self, procs: Processes) -> None:
        self.pids = {PROXY: procs.proxy.pid if procs.proxy else 0,
                     "mock": procs.mock.pid if procs.mock else 0}
        for name, proc in ((FLOOR, procs.floor), (LITELLM, procs.litellm)):
            if proc is not None and proc.poll() is None:
                self.pids[name] = proc.pid
        self.used: dict[str, float] = {k: 0.0 for k in self.pids}
        self.used["client"] = 0.0
        self._t0: dict[str, int | None] = {}

    def start(self) -> None:
        """Begin (or resume) the recorded part."""
        self._t0 = {k: process_cpu_ns(pid) for k, pid in self.pids.items()}
        self._t0["client"] = time.process_time_ns()

    def stop(self) -> None:
        """End the recorded part; the CPU used since `start` is added up."""
        for k, pid in self.pids.items():
            now, before = process_cpu_ns(pid), self._t0.get(k)
            if now is not None and before is not None:
                self.used[k] += (now - before) / 1e6
        self.used["client"] += (time.process_time_ns() - (self._t0["client"] or 0)) / 1e6

    def per_request(self, samples: dict[str, list[Any]]) -> dict[str, float]:
        """ms per request, from the recorded samples per target: proxy CPU per proxied request (the floor's
        per floor request, LiteLLM's per LiteLLM request), mock and client per request of any kind."""
        n = {k: len(v) for k, v in samples.items()}
        n_all = max(1, sum(n.values()))
        out = {"proxy_ms_per_proxied_request": self.used[PROXY] / max(1, n.get(PROXY, 0)),
               "mock_ms_per_request": self.used["mock"] / n_all,
               "client_ms_per_request": self.used["client"] / n_all}
        for name in (FLOOR, LITELLM):
            if name in self.used and n.get(name):
                out[f"{name}_ms_per_{name}_request"] = self.used[name] / n[name]
        return out


class timed_section:
    """Around each recorded loop: the client's collector off (a pause of ours would land on
    whichever request happens to be in flight; memory is bounded by the request counts),
    and the CPU meter running."""

    def __init__(self, meter: CpuMeter) -> None:
        self.meter = meter

    def __enter__(self) -> None:
        gc.collect()
        gc.disable()
        self.meter.start()

    def __exit__(self, *exc: object) -> None:
        self.meter.stop()
        gc.enable()
        gc.collect()
