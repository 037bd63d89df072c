"""``python -m bench.workers``: arguments, the processes, the interleaved rounds, the report."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shlex
import sys
import tempfile
import time
import uuid
from typing import Any

from bench import workers as package
from bench.machine import git_state, machine_facts
from bench.overhead.cpu import process_cpu_ns
from bench.scaling.history import build_history
from bench.workers.proxies import Proxy, start_mock, stop
from bench.workers.report import print_report, summary
from bench.workers.traffic import Agents

WORKER_COUNTS = (1, 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(package.__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (each: one batch to each proxy)")
    ap.add_argument("--warm", type=int, default=1, help="unmeasured rounds first")
    ap.add_argument("--requests", type=int, default=400, help="requests per batch")
    ap.add_argument("--concurrency", type=int, default=16, help="agents sending at once")
    ap.add_argument("--messages", type=int, default=100, help="messages in each request's history")
    ap.add_argument("--store", default="redis://127.0.0.1:6379/12", help="the Redis both proxies use")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    if min(args.rounds, args.requests, args.concurrency) < 1 or args.warm < 0 or args.messages < 2:
        ap.error("--rounds, --requests and --concurrency must be at least 1, --warm at least 0, --messages 2")
    if not args.store.startswith(("redis://", "rediss://")):
        ap.error("--store: a redis:// URL (the question is several workers sharing Redis)")
    history, tools = build_history(args.messages)
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        mock = start_mock()
        proxies: list[Proxy] = []
        try:
            assert mock.stdout is not None
            mock_url = mock.stdout.readline().strip()  # printed once listening
            if not mock_url.startswith("http://"):
                raise SystemExit(f"the mock provider did not start (it printed {mock_url!r})")
            proxies = [Proxy(tmp, mock_url, args.store, n) for n in WORKER_COUNTS]
            for p in proxies:
                p.wait_started()
            rounds = asyncio.run(_rounds(args, proxies, Agents(history, tools, args.concurrency), mock.pid))
        finally:
            for p in proxies:
                p.stop()
            stop(mock)
    res: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.workers", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "git": git_state(), "machine": machine_facts(), "rounds": rounds,
        "settings": {k: getattr(args, k) for k in ("rounds", "warm", "requests", "concurrency", "messages")},
        "proxy_commands": {p.name: shlex.join(p.command) for p in proxies},
    }
    res["summary"] = summary(rounds, [p.name for p in proxies], args.requests)
    print_report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


async def _rounds(args: argparse.Namespace, proxies: list[Proxy], agents: Agents, mock_pid: int) -> list[Any]:
    """Warm rounds, then measured ones, each a batch to every proxy, the first proxy alternating."""
    import aiohttp

    keys = {p.name: f"sk-bench-workers-{uuid.uuid4().hex[:8]}" for p in proxies}  # a tenant of its own each
    sessions = {p.name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency),
                                              timeout=aiohttp.ClientTimeout(total=120)) for p in proxies}
    out: list[Any] = []
    try:
        for i in range(args.warm + args.rounds):
            order = proxies if i % 2 == 0 else proxies[::-1]
            measured: dict[str, Any] = {}
            for p in order:
                cpu0, mock0, me0 = p.cpu_ns(), process_cpu_ns(mock_pid) or 0, time.process_time_ns()
                wall = await agents.batch(sessions[p.name], p.url, keys[p.name], args.requests)
                cpu1, mock1, me1 = p.cpu_ns(), process_cpu_ns(mock_pid) or 0, time.process_time_ns()
                measured[p.name] = {"wall_s": wall, "cpu_ms": [(b - a) / 1e6 for a, b in zip(cpu0, cpu1)],
                                    "mock_cpu_ms": (mock1 - mock0) / 1e6, "client_cpu_ms": (me1 - me0) / 1e6}
            if i >= args.warm:
                out.append(measured)
            print(f"  round {i + 1}/{args.warm + args.rounds}{' (warm)' if i < args.warm else ''}: " + ", ".join(
                f"{name} {args.requests / m['wall_s']:.0f} req/s" for name, m in measured.items()), flush=True)
    finally:
        for s in sessions.values():
            await s.close()
    return out
