"""CPU per request for one config at each history size, and cProfile's view of the largest one."""

from __future__ import annotations

import cProfile
import gc
import json
import logging
import os
import pstats
import statistics
import time
from typing import Any

from bench.scaling.asgi import AsgiApp, passthrough_app
from bench.scaling.config import MODEL, PASSTHROUGH, WINDOW
from bench.scaling.history import body, variant


def percentile(xs: list[float], q: float) -> float:
    """Nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def measure_config(name: str, extra: dict[str, Any], mock_url: str, history: list[dict[str, Any]],
                         tools: list[dict[str, Any]], sizes: list[int], runs: int, warm: int, tmp: str,
                         profile_size: int | None, max_s: float) -> dict[str, Any]:
    """One config (or the pass-through reference) at every size: CPU, wall and in-handler time per request."""
    from proxy.app import create_app
    from proxy.config import build_settings
    from proxy.logs import JsonFormatter

    cfg: dict[str, Any] = {"upstream": {"base_url": mock_url},
                           "store": f"sqlite:///{os.path.join(tmp, name + '.db')}",
                           "models": {MODEL: {"context_window": WINDOW}}, **extra}
    settings = build_settings(cfg, env={})
    log_path = os.path.join(tmp, name + ".log")
    handler = logging.FileHandler(log_path)
    handler.setFormatter(JsonFormatter())
    lg = logging.getLogger("ctxproxy")
    lg.handlers[:] = [handler]  # as `ctxproxy serve` (setup_logging), to a file instead of stderr
    lg.setLevel(logging.INFO)
    lg.propagate = False

    reference = name == PASSTHROUGH
    asgi = AsgiApp(passthrough_app(mock_url) if reference else create_app(settings))
    await asgi.start()

    async def drain() -> None:  # the proxy's deferred accounting write, counted in its request
        if not reference:
            await asgi.app.state.proxy.accounting.drain()

    path = "/v1/chat/completions"
    rows: list[dict[str, Any]] = []
    profiles: dict[str, str] = {}
    try:
        for n in sizes + ([profile_size] if profile_size else []):
            profiling = profile_size is not None and len(rows) == len(sizes)
            key = f"sk-scaling-{name}-{n}{'-profiled' if profiling else ''}"
            # the first n-1 messages, once: the proxy has now seen them
            status, content = await asgi.post(path, body(history[: n - 1], tools), key)
            if status != 200:
                raise SystemExit(f"{name} n={n}: seed request got HTTP {status}: {content[:300]!r}")
            await drain()
            bodies = [body(history[: n - 1] + [variant(history[n - 1], k)], tools) for k in range(warm + runs)]
            cpu, wall = [], []
            prof = cProfile.Profile() if profiling else None
            deadline = time.monotonic() + max_s
            gc.collect()
            for k, payload in enumerate(bodies):
                if time.monotonic() > deadline:
                    print(f"  ({name} n={n}: time budget reached after {k} requests)", flush=True)
                    break
                measured = k >= warm
                if prof is not None and measured:
                    prof.enable()
                c0, w0 = time.process_time_ns(), time.perf_counter_ns()
                status, content = await asgi.post(path, payload, key)
                await drain()
                c1, w1 = time.process_time_ns(), time.perf_counter_ns()
                if prof is not None and measured:
                    prof.disable()
                if status != 200:
                    raise SystemExit(f"{name} n={n}: HTTP {status}: {content[:300]!r}")
                if measured:
                    cpu.append((c1 - c0) / 1e6)
                    wall.append((w1 - w0) / 1e6)
            handler.flush()
            if prof is not None:
                import proxy

                profiles[f"n={n}"] = profile_text(prof, max(1, len(bodies) - warm),
                                                  os.path.dirname(os.path.abspath(proxy.__file__)) + os.sep)
                continue
            # request ids: the proxy's log, in order, for this key's last len(cpu) requests
            recs = []
            with open(log_path, errors="replace") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("msg") == "request" and rec.get("messages") == n:
                        recs.append(rec)
            oh = [float(r["overhead_ms"]) for r in recs[-len(cpu):] if "overhead_ms" in r]
            tokens = state_tokens(history[:n])
            row = {"messages": n, "tokens": tokens, "bytes": len(bodies[0]), "runs": len(cpu),
                   "cpu_ms": {"median": statistics.median(cpu), "p90": percentile(cpu, 0.9), "min": min(cpu)},
                   "wall_ms": {"median": statistics.median(wall), "p90": percentile(wall, 0.9)},
                   "overhead_ms": {"median": statistics.median(oh), "p90": percentile(oh, 0.9)} if oh else None,
                   "cpu_samples_ms": [round(x, 4) for x in cpu]}
            rows.append(row)
            print(f"  {name:<14} n={n:>5} {tokens:>8,} tok  cpu {row['cpu_ms']['median']:8.3f} ms  "
                  f"in-handler {row['overhead_ms']['median'] if oh else float('nan'):8.3f} ms  "
                  f"wall {row['wall_ms']['median']:8.3f} ms", flush=True)
    finally:
        await asgi.stop()
        handler.close()
    errors = []
    with open(log_path, errors="replace") as f:
        for line in f:
            if '"level":"error"' in line or '"level":"warning"' in line:
                errors.append(line.strip()[:300])
    return {"config": name, "proxy_config": cfg | {"store": "sqlite:///<tmp>"}, "rows": rows,
            "profiles": profiles, "log_warnings_or_errors": errors}


_COUNTER: Any = None


def state_tokens(messages: list[dict[str, Any]]) -> int:
    """Tokens of `messages` as the proxy counts them."""
    global _COUNTER
    from proxy.tokens.counter import TokenCounter

    if _COUNTER is None:
        _COUNTER = TokenCounter()
    return _COUNTER.count_messages(messages, MODEL)


def profile_text(prof: cProfile.Profile, requests: int, proxy_dir: str, top: int = 16) -> str:
    """Two tables, ms per request: the top functions by own time (anything), and the proxy's own
    functions by cumulative time (coroutine resumptions count as calls under cProfile)."""
    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append((file, line, func, nc, tt, ct))
    total = sum(r[4] for r in rows)

    def where(file: str, line: int, func: str) -> str:
        if file.startswith(proxy_dir):
            file = "proxy/" + os.path.relpath(file, proxy_dir)
        elif file != "~":
            file = os.path.basename(file)
        return f"{func} ({file}:{line})" if file != "~" else func

    out = [f"profiled total {total * 1000 / requests:.2f} ms per request (cProfile's own overhead included; "
           f"only this thread: the SQLite worker thread is not profiled)",
           f"  {'own ms/req':>10} {'cum ms/req':>10} {'calls/req':>10}  by own time"]
    for file, line, func, nc, tt, ct in sorted(rows, key=lambda r: -r[4])[:top]:
        out.append(f"  {tt * 1000 / requests:>10.3f} {ct * 1000 / requests:>10.3f} {nc / requests:>10.0f}  "
                   f"{where(file, line, func)}")
    out.append(f"  {'own ms/req':>10} {'cum ms/req':>10} {'calls/req':>10}  the proxy's functions by cumulative time")
    mine = [r for r in rows if r[0].startswith(proxy_dir)]
    for file, line, func, nc, tt, ct in sorted(mine, key=lambda r: -r[5])[:top + 8]:
        out.append(f"  {tt * 1000 / requests:>10.3f} {ct * 1000 / requests:>10.3f} {nc / requests:>10.0f}  "
                   f"{where(file, line, func)}")
    return "\n".join(out)
