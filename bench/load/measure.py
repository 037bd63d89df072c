"""What the processes use: CPU (schedstat, /proc/stat), RSS over time and its slope, busy time after load."""

from __future__ import annotations

import asyncio
import os
import time

from bench.overhead.processes import Processes


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (as bench.overhead's p99); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of `pid`, in KB (Linux /proc; empty elsewhere)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    out[line.split(":")[0]] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return out


def proc_sched(pid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for a CPU) over all threads of `pid` (Linux schedstat)."""
    run = wait = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            run += int(fields[0])
            wait += int(fields[1])
    except (OSError, ValueError, IndexError):
        return None
    return run, wait


def machine_busy_ns() -> tuple[int, int] | None:
    """(busy, total) jiffies-as-ns of all CPUs from /proc/stat (busy = all but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    total = sum(vals[:8])  # user nice system idle iowait irq softirq steal
    return total - vals[3] - vals[4], total


class Cpu:
    """CPU used between start() and stop(), % of one core: the proxy, the mock, this process (client),
    the whole machine (so the rest is other processes), and the proxy's time runnable but waiting
    for a CPU (schedstat run-queue wait, all its threads)."""

    def __init__(self, procs: Processes) -> None:
        self.pids = {"proxy": procs.proxy.pid if procs.proxy else 0, "mock": procs.mock.pid if procs.mock else 0}

    def start(self) -> None:
        """Begin measuring."""
        self.t0 = time.monotonic()
        self.c0 = {k: proc_sched(p) for k, p in self.pids.items()}
        self.client0 = time.process_time_ns()
        self.m0 = machine_busy_ns()

    def stop(self) -> dict[str, float]:
        """The CPU shares since `start`, and the wall time."""
        wall = time.monotonic() - self.t0
        nan = float("nan")
        out: dict[str, float] = {}
        for k, p in self.pids.items():
            now, before = proc_sched(p), self.c0.get(k)
            out[k] = (now[0] - before[0]) / 1e9 / wall * 100 if now and before else nan
            if k == "proxy":
                out["proxy_wait"] = (now[1] - before[1]) / 1e9 / wall * 100 if now and before else nan
        out["client"] = (time.process_time_ns() - self.client0) / 1e9 / wall * 100
        m1 = machine_busy_ns()
        if m1 and self.m0 and m1[1] > self.m0[1]:
            out["machine"] = (m1[0] - self.m0[0]) / (m1[1] - self.m0[1]) * 100 * (os.cpu_count() or 1)
            out["others"] = out["machine"] - sum(out[k] for k in ("proxy", "mock", "client"))
        else:
            out["machine"] = out["others"] = nan
        out["wall_s"] = wall
        return out


async def rss_sampler(pid: list[int], samples: list[tuple[float, str, int]], phase: list[str], t0: float,
                      stop: asyncio.Event, max_samples: int) -> None:
    """VmRSS of the process `pid[0]` (the current proxy) once a second, tagged with `phase[0]`."""
    while not stop.is_set() and len(samples) < max_samples:
        r = rss_kb(pid[0])
        if "VmRSS" in r:
            samples.append((time.monotonic() - t0, phase[0], r["VmRSS"]))
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except TimeoutError:
            pass


def slope_mb_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of (seconds, KB) samples, in MB per minute."""
    if len(points) < 2:
        return float("nan")
    xs = [t / 60 for t, _ in points]
    ys = [kb / 1024 for _, kb in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


async def settle(pid: int, max_s: float = 60.0, idle_pct: float = 5.0) -> float:
    """Seconds until the process `pid` uses under `idle_pct`% of a core over half a second (at most
    `max_s`): how long the proxy keeps working after its load has stopped (background writes)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        a = proc_sched(pid)
        await asyncio.sleep(0.5)
        b = proc_sched(pid)
        if a is None or b is None or (b[0] - a[0]) / 0.5e9 * 100 < idle_pct:
            return time.monotonic() - t0
    return time.monotonic() - t0
