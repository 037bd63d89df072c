"""Does one client's request of many small items stall everybody else? The worst /healthz meanwhile.

``python -m bench.loop_stall [--items 100000] [--chars 150] [--apis chat,responses,messages] [--rounds 1]``

The mock provider (bench.load's, in its own process) and the proxy (``python -m proxy.cli serve``, a real
uvicorn server, default config, SQLite store) on loopback. For each API in turn, a neighbour sends one
request of ``--items`` messages of ``--chars`` characters each (100,000 of 150: about 18 MB, the shape
that no per-item size rule sees as big), ``--rounds`` times, each a new conversation (no decision
replayed); meanwhile this process polls ``/healthz`` every 10 ms and records each answer's latency. The
proxy parses, checks, hashes, counts and compacts the request; every other request must still be
answered at once (the target: the worst ``/healthz`` under 100 ms). A quiet run first gives the floor.

Bounded: each neighbour request has ``--timeout`` seconds (120), the whole run ``--max-seconds`` (600).
It prints figures and asserts nothing (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import httpx

from bench.load.processes import LoadProcesses
from bench.machine import machine_facts
from bench.paths import ROOT

POLL_EVERY_S = 0.01
QUIET_S = 1.0
TARGET_MS = 100.0
AUTH = {"authorization": "Bearer sk-loop-stall", "content-type": "application/json"}
APIS = ("chat", "responses", "messages")


def neighbour(api: str, items: int, chars: int, seed: int) -> tuple[str, bytes]:
    """The path and body of one request of `items` small alternating user/assistant messages."""
    pad = "x" * max(0, chars - 24)
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{seed}:{i:07d} {pad}"}
             for i in range(items)]
    if turns and turns[-1]["role"] != "user":
        turns.append({"role": "user", "content": f"{seed}: go on"})
    if api == "chat":
        body: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "system", "content": "agent"}, *turns]}
        return "/v1/chat/completions", json.dumps(body).encode()  # json.dumps: the Python SDK's style
    if api == "responses":
        return "/v1/responses", json.dumps({"model": "gpt-4o", "instructions": "agent", "input": turns}).encode()
    body = {"model": "claude-sonnet-4-5", "max_tokens": 256, "system": "agent", "messages": turns}
    return "/v1/messages", json.dumps(body).encode()


class Poller:
    """/healthz every `every` seconds in a thread of its own; the latencies (s) of the polls made while recording."""

    def __init__(self, url: str, every: float = POLL_EVERY_S) -> None:
        self.url, self.every = url, every
        self.latencies: list[float] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                t = time.perf_counter()
                try:
                    ok = c.get(self.url + "/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - t) if ok else None
                self.errors += not ok
                self._stop.wait(self.every)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def figures(latencies: list[float]) -> dict[str, float]:
    """Polls, p50, p99 (nearest rank) and worst latency, in ms."""
    ms = sorted(x * 1000 for x in latencies)
    if not ms:
        return {"polls": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "worst_ms": float("nan")}
    return {"polls": len(ms), "p50_ms": round(ms[len(ms) // 2], 1),
            "p99_ms": round(ms[min(len(ms) - 1, -(-len(ms) * 99 // 100) - 1)], 1), "worst_ms": round(ms[-1], 1)}


def run_api(url: str, api: str, args: argparse.Namespace) -> dict[str, Any]:
    """`--rounds` neighbour requests of one API with /healthz polled throughout."""
    bodies = [neighbour(api, args.items, args.chars, seed=int(time.time() * 1000) + r) for r in range(args.rounds)]
    out: dict[str, Any] = {"api": api, "body_mb": round(len(bodies[0][1]) / 1e6, 1), "statuses": [],
                           "neighbour_s": []}
    with Poller(url) as poller, httpx.Client(timeout=args.timeout) as c:
        time.sleep(0.1)
        for path, body in bodies:
            t = time.perf_counter()
            try:
                status: int | str = c.post(url + path, content=body, headers=AUTH).status_code
            except httpx.HTTPError as e:
                status = type(e).__name__
            out["neighbour_s"].append(round(time.perf_counter() - t, 2))
            out["statuses"].append(status)
        time.sleep(0.1)
    out.update(figures(poller.latencies), poll_errors=poller.errors)
    return out


async def _start(procs: LoadProcesses) -> str:
    procs.start_mock()
    return await procs.start_healthy_proxy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.loop_stall", description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--chars", type=int, default=150)
    ap.add_argument("--apis", default=",".join(APIS))
    ap.add_argument("--rounds", type=int, default=1, help="neighbour requests per API (each a new conversation)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one neighbour request may take")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="the whole run's bound")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    apis = [a.strip() for a in args.apis.split(",") if a.strip()]
    if not set(apis) <= set(APIS) or not 1 <= args.items <= 200_000 or not 1 <= args.rounds <= 10:
        ap.error(f"--apis from {','.join(APIS)}; --items 1..200000; --rounds 1..10")
    # The proxy runs as `python -m proxy.cli` from a temporary directory: it must import this checkout
    # (after whatever PYTHONPATH already puts first, as bench.all's snapshot).
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), ROOT) if p)
    deadline = time.monotonic() + args.max_seconds
    res: dict[str, Any] = {"machine": machine_facts(), "items": args.items, "chars": args.chars, "runs": []}
    with tempfile.TemporaryDirectory(prefix="ctxproxy-loop-stall-") as tmp:
        procs = LoadProcesses(tmp, [sys.executable, "-m", "proxy.cli"])
        try:
            url = asyncio.run(_start(procs))
            with Poller(url) as quiet:
                time.sleep(QUIET_S)
            res["quiet"] = figures(quiet.latencies)
            for api in apis:
                if time.monotonic() > deadline:
                    res["runs"].append({"api": api, "skipped": "--max-seconds reached"})
                    continue
                res["runs"].append(run_api(url, api, args))
        finally:
            procs.stop()
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"neighbour: {args.items:,} items of {args.chars} chars; /healthz every {POLL_EVERY_S * 1000:.0f} ms "
          f"(target: worst under {TARGET_MS:.0f} ms)")
    q = res["quiet"]
    print(f"{'quiet':<10} {'':>8} {q['polls']:>6} polls  p50 {q['p50_ms']:>7.1f} ms  worst {q['worst_ms']:>7.1f} ms")
    for r in res["runs"]:
        if "skipped" in r:
            print(f"{r['api']:<10} skipped: {r['skipped']}")
            continue
        print(f"{r['api']:<10} {r['body_mb']:>5.1f} MB {r['polls']:>6} polls  p50 {r['p50_ms']:>7.1f} ms  "
              f"worst {r['worst_ms']:>7.1f} ms  neighbour {r['statuses']} in {r['neighbour_s']} s"
              + (f"  ({r['poll_errors']} failed polls)" if r["poll_errors"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
