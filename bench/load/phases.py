"""The three phases (or the hostile-neighbour run) against one mock and the proxies, in one sitting."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import orjson

from bench import hostile
from bench.load.agents import AgentStats, agent
from bench.load.client import closed_loop, session_for, stream_batch
from bench.load.config import AUTH, MAX_REQUESTS_PER_RUN, MODEL, SMALL_MESSAGES
from bench.load.measure import Cpu, pct, rss_kb, rss_sampler, settle, slope_mb_per_min
from bench.load.processes import LoadProcesses
from bench.load.pyspy import profile_proxy, top_frames
from bench.load.traffic import TextPool


async def run_hostile(args: argparse.Namespace, procs: LoadProcesses) -> dict[str, Any]:
    """`--hostile`: only the hostile-neighbour comparison (bench/hostile.py), on one proxy."""
    procs.start_mock()
    proxy_url = await procs.start_healthy_proxy()
    procs.mock_command(cmd="set", delay=args.delay, chunk_delay=args.chunk_delay)
    idle = Cpu(procs)
    idle.start()
    await asyncio.sleep(2.0)
    res: dict[str, Any] = {"idle_check": idle.stop()}
    cfg = {"concurrency": args.hostile_concurrency, "duration": args.hostile_duration, "rounds": args.hostile_rounds}
    small = orjson.dumps({"model": MODEL, "messages": SMALL_MESSAGES})
    res["hostile"] = await hostile.run(proxy_url, AUTH, small, closed_loop, procs, cfg)
    return res


async def _phase1(args: argparse.Namespace, cfg: dict[str, Any], procs: LoadProcesses, small: bytes,
                  direct_url: str, via_proxy: str, proxy_pid: int) -> list[dict[str, Any]]:
    """Closed loops of small requests at each concurrency, direct and through the proxy in adjacent runs."""
    p1: list[dict[str, Any]] = []
    for i, c in enumerate(args.concurrency):
        order = [("direct", direct_url), ("proxy", via_proxy)]
        if i % 2:
            order.reverse()
        for name, url in order:
            print(f"[phase 1] {c:>4} concurrent, {name:<6}: {cfg['warmup']:.0f} s warm-up + "
                  f"{cfg['duration']:.0f} s ...", flush=True)
            r = await closed_loop(url, small, c, cfg["warmup"], cfg["duration"], procs)
            r["target"] = name
            if name == "proxy":
                r["rss_after_mb"] = rss_kb(proxy_pid).get("VmRSS", 0) / 1024
                r["busy_after_s"] = await settle(proxy_pid)
            p1.append(r)
            print(f"           {r['rps']:.0f} req/s, p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms, "
                  f"errors {r['errors']}", flush=True)
            procs.mock_command(cmd="reset")
    return p1


async def _profile(args: argparse.Namespace, cfg: dict[str, Any], procs: LoadProcesses, small: bytes,
                   via_proxy: str, proxy_pid: int) -> dict[str, Any]:
    """py-spy on the proxy under the highest concurrency's load (unrecorded), when py-spy is installed."""
    prof: dict[str, Any] = {}
    c = max(args.concurrency)
    out = os.path.join(procs.tmp, "pyspy.txt")
    proc, cmd = profile_proxy(proxy_pid, cfg["profile_seconds"], out)
    prof["command"] = cmd
    prof["concurrency"] = c
    if proc is None:
        print(f"[profile] skipped: {cmd}", flush=True)
    else:
        print(f"[profile] py-spy on the proxy for {cfg['profile_seconds']:.0f} s at {c} concurrent "
              f"(unrecorded) ...", flush=True)
        await asyncio.sleep(0.5)  # py-spy attaches
        r = await closed_loop(via_proxy, small, c, 0.0, cfg["profile_seconds"] + 1.0, procs)
        prof["load"] = {"rps": r["rps"], "errors": r["errors"], "cpu": r["cpu"],
                        "busy_after_s": await settle(proxy_pid)}
        try:
            text, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate(timeout=5)
        prof["py_spy_output"] = (text or b"").decode(errors="replace")[-1500:]
        if proc.returncode == 0 and os.path.exists(out):
            prof.update(top_frames(out))
            if args.keep_profile:
                shutil.copyfile(out, args.keep_profile)
        else:
            prof["error"] = f"py-spy exited with {proc.returncode}"
    procs.mock_command(cmd="reset")
    return prof


async def _phase2(args: argparse.Namespace, cfg: dict[str, Any], procs: LoadProcesses, direct_url: str,
                  via_proxy: str) -> dict[str, list[dict[str, Any]]]:
    """Batches of concurrent streams, all sent at once, direct and proxied alternating."""
    sbody = orjson.dumps({"model": MODEL, "messages": SMALL_MESSAGES, "stream": True,
                          "stream_options": {"include_usage": True}})
    p2: dict[str, list[dict[str, Any]]] = {"direct": [], "proxy": []}
    for i in range(cfg["stream_rounds"]):
        order = [("direct", direct_url), ("proxy", via_proxy)]
        if i % 2:
            order.reverse()
        for name, url in order:
            print(f"[phase 2] {args.streams} concurrent streams, {name} (round {i + 1}) ...", flush=True)
            b = await stream_batch(url, sbody, args.streams, procs)
            p2[name].append(b)
            print(f"           completed {b['completed']}/{b['streams']} in {b['batch_s']:.2f} s, "
                  f"errors {b['errors']}", flush=True)
            procs.mock_command(cmd="reset")
    return p2


async def _phase3(args: argparse.Namespace, cfg: dict[str, Any], procs: LoadProcesses, via_proxy: str,
                  phase: list[str], samples: list[tuple[float, str, int]],
                  mark: Callable[[str], None]) -> dict[str, Any]:
    """Agent-like mixed traffic through the (fresh) proxy while its RSS is sampled; the figures of the run."""
    pool = TextPool()
    stats = AgentStats()
    cpu = Cpu(procs)
    print(f"[phase 3] {args.agents} agents, mixed traffic: {cfg['long_warmup']:.0f} s warm-up + "
          f"{cfg['long_duration']:.0f} s, proxy RSS sampled every second ...", flush=True)
    async with session_for(args.agents + 8) as session:
        phase[0] = "phase3-warmup"
        t_warm = time.monotonic()
        deadline = t_warm + cfg["long_warmup"] + cfg["long_duration"]
        max_req = MAX_REQUESTS_PER_RUN

        async def flip() -> None:
            await asyncio.sleep(cfg["long_warmup"])
            phase[0] = "phase3"
            stats.recording = True
            stats.requests_at_start = stats.requests
            stats.sessions_at_start = stats.sessions
            cpu.start()

        flipper = asyncio.create_task(flip())
        await asyncio.gather(*(agent(i, session, via_proxy, deadline, pool, stats, max_req)
                               for i in range(args.agents)))
        await flipper
        usage = cpu.stop()
    phase[0] = "after"
    mark("phase3")
    n_rec = stats.requests - stats.requests_at_start
    pts = [(t, kb) for t, ph, kb in samples if ph == "phase3"]
    third = max(1, len(pts) // 3)
    first_mean = sum(kb for _, kb in pts[:third]) / third / 1024 if pts else float("nan")
    last_mean = sum(kb for _, kb in pts[-third:]) / third / 1024 if pts else float("nan")
    return {
        "agents": args.agents, "seconds": usage.get("wall_s", 0.0), "requests": n_rec,
        "rps": n_rec / usage["wall_s"] if usage.get("wall_s") else 0.0,
        "sessions_started": stats.sessions, "sessions_recorded": stats.sessions - stats.sessions_at_start,
        "tool_results": stats.tool_results,
        "big_tool_results": stats.big_results, "max_messages": stats.max_messages,
        "errors": sum(stats.errors.values()), "error_kinds": dict(stats.errors),
        "latency": {k: {"n": len(v), "p50": pct(v, 0.5), "p99": pct(v, 0.99)} for k, v in stats.lat.items()},
        "cpu": usage, "rss_samples": len(pts),
        "rss_first_third_mb": first_mean, "rss_last_third_mb": last_mean,
        "rss_slope_mb_per_min": slope_mb_per_min(pts),
        "rss_min_mb": min((kb for _, kb in pts), default=0) / 1024,
        "rss_max_mb": max((kb for _, kb in pts), default=0) / 1024,
    }


async def run(args: argparse.Namespace, procs: LoadProcesses, cfg: dict[str, Any]) -> dict[str, Any]:
    """The three phases: throughput, concurrent streams, then memory under agent traffic on a fresh proxy."""
    res: dict[str, Any] = {}
    mock_url = procs.start_mock()
    proxy_url = await procs.start_healthy_proxy()
    assert procs.proxy is not None
    proxy_pid = procs.proxy.pid
    direct_url = mock_url.rstrip("/") + "/chat/completions"
    via_proxy = proxy_url + "/v1/chat/completions"
    procs.mock_command(cmd="set", delay=args.delay, chunk_delay=args.chunk_delay)
    res["rss_at_start_mb"] = rss_kb(proxy_pid).get("VmRSS", 0) / 1024
    idle = Cpu(procs)
    idle.start()
    await asyncio.sleep(2.0)
    res["idle_check"] = idle.stop()  # before any load: what the rest of the machine is doing
    if res["idle_check"].get("others", 0) > 25:
        print(f"warning: other processes use {res['idle_check']['others']:.0f}% of a core before the start;"
              " the figures will be lower than on a quiet machine", flush=True)
    with open(f"/proc/{proxy_pid}/cmdline", "rb") as f:
        res["proxy_pid_cmdline"] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    gc.collect()
    gc.freeze()

    t_start = time.monotonic()
    samples: list[tuple[float, str, int]] = []
    phase = ["setup"]
    stop = asyncio.Event()
    pid = [proxy_pid]
    sampler = asyncio.create_task(rss_sampler(pid, samples, phase, t_start, stop, 3600))
    rss_after: dict[str, float] = {}
    proxies: list[dict[str, Any]] = [{"role": "phases 1-2", "start_mb": res["rss_at_start_mb"]}]
    res["proxies"] = proxies

    def mark(name: str) -> None:
        rss_after[name] = rss_kb(pid[0]).get("VmRSS", 0) / 1024

    def close_record() -> None:
        r = rss_kb(pid[0])
        proxies[-1].update(end_mb=r.get("VmRSS", 0) / 1024, vmhwm_mb=r.get("VmHWM", 0) / 1024)

    try:
        phase[0] = "phase1"
        small = orjson.dumps({"model": MODEL, "messages": SMALL_MESSAGES})
        res["phase1"] = await _phase1(args, cfg, procs, small, direct_url, via_proxy, proxy_pid)
        mark("phase1")
        res["profile"] = {} if args.no_profile else await _profile(args, cfg, procs, small, via_proxy, proxy_pid)

        phase[0] = "phase2"
        res["phase2"] = await _phase2(args, cfg, procs, direct_url, via_proxy)
        mark("phase2")

        # ---- a fresh proxy (and store) for phase 3: what phases 1-2 allocated neither hides nor adds growth
        close_record()
        phase[0] = "restart"
        via_proxy = await procs.start_healthy_proxy(restart=True) + "/v1/chat/completions"
        assert procs.proxy is not None
        pid[0] = procs.proxy.pid
        start_mb = rss_kb(pid[0]).get("VmRSS", 0) / 1024
        proxies.append({"role": "phase 3", "start_mb": start_mb})
        res["phase3"] = await _phase3(args, cfg, procs, via_proxy, phase, samples, mark)
    finally:
        stop.set()
        await sampler
    close_record()
    res["rss"] = {"after": rss_after, "peak_sampled_mb": max((kb for *_, kb in samples), default=0) / 1024,
                  "vmhwm_mb": max(p.get("vmhwm_mb", 0) for p in proxies),
                  "samples": [(round(t, 1), ph, kb) for t, ph, kb in samples]}
    res["total_seconds"] = time.monotonic() - t_start
    return res
