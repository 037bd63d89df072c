"""The client: closed loops of small requests, batches of concurrent streams, each request timed."""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from typing import Any

from bench.load.config import AUTH, MAX_REQUESTS_PER_RUN, REQUEST_TIMEOUT, STREAM_DATA_CHUNKS
from bench.load.measure import Cpu, pct
from bench.overhead.processes import Processes


class Run:
    """What one closed-loop run recorded."""

    def __init__(self) -> None:
        self.lat: list[float] = []  # ms, successful requests
        self.errors: collections.Counter[str] = collections.Counter()
        self.per_second: collections.Counter[int] = collections.Counter()
        self.t0 = 0.0
        self.recording = False

    def ok(self, ms: float) -> None:
        """A successful request's latency, while recording."""
        if self.recording:
            self.lat.append(ms)
            self.per_second[int(time.monotonic() - self.t0)] += 1

    def error(self, kind: str) -> None:
        """A failed request, by kind, while recording."""
        if self.recording:
            self.errors[kind] += 1


def error_kind(e: BaseException) -> str:
    """The name an error is counted under (its exception type)."""
    return type(e).__name__


async def post_small(session: Any, url: str, body: bytes, run: Run) -> None:
    """One small non-streaming request, recorded in `run` as a latency or an error."""
    import aiohttp

    t0 = time.perf_counter_ns()
    try:
        async with session.post(url, data=body, headers=AUTH) as r:
            data = await r.read()
            t1 = time.perf_counter_ns()
            if r.status != 200:
                run.error(f"HTTP {r.status}")
            elif b'"chat.completion"' not in data:
                run.error("malformed body")
            elif "x-ctxproxy-degraded" in r.headers:  # forwarded unmodified: the proxy skipped its work
                run.error(f"degraded ({r.headers['x-ctxproxy-degraded']})")
            else:
                run.ok((t1 - t0) / 1e6)
                return
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        run.error(error_kind(e))
    await asyncio.sleep(0.01)  # after an error: no hot loop against a failing server


def session_for(limit: int) -> Any:
    """A client session whose connection pool holds `limit` keep-alive connections."""
    import aiohttp

    conn = aiohttp.TCPConnector(limit=limit, limit_per_host=limit, keepalive_timeout=600, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
                                 auto_decompress=False, skip_auto_headers=("User-Agent",))


async def closed_loop(url: str, body: bytes, concurrency: int, warmup: float, duration: float,
                      procs: Processes, keep: bool = False) -> dict[str, Any]:
    """`concurrency` workers, each sending the next request when its last one is answered.

    `keep`: the result also carries every latency (ms) under "latencies"."""
    run = Run()
    cpu = Cpu(procs)
    count = 0
    async with session_for(concurrency) as session:
        end_warm = time.monotonic() + warmup
        end = end_warm + duration

        async def worker() -> None:
            nonlocal count
            while count < MAX_REQUESTS_PER_RUN:
                now = time.monotonic()
                if now >= end:
                    return
                if now >= end_warm and not run.recording:
                    run.recording, run.t0 = True, end_warm
                    cpu.start()
                count += 1
                await post_small(session, url, body, run)

        gc.collect()
        gc.disable()  # the client's own pauses would land on requests in flight
        try:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        finally:
            gc.enable()
        elapsed = min(duration, time.monotonic() - end_warm)
        usage = cpu.stop() if run.recording else {}
    gc.collect()
    full_seconds = [run.per_second.get(s, 0) for s in range(int(duration))]
    n = len(run.lat)
    return {"concurrency": concurrency, "seconds": elapsed, "requests": n, "rps": n / elapsed if elapsed else 0,
            "min_1s_rps": min(full_seconds) if full_seconds else 0, "max_1s_rps": max(full_seconds, default=0),
            "errors": sum(run.errors.values()), "error_kinds": dict(run.errors),
            "p50": pct(run.lat, 0.5), "p99": pct(run.lat, 0.99), "max": max(run.lat, default=float("nan")),
            "cpu": usage, **({"latencies": run.lat} if keep else {})}


async def one_stream(session: Any, url: str, body: bytes) -> dict[str, Any]:
    """One streamed request: time to first data chunk, total time, chunk count, [DONE] seen."""
    import aiohttp

    t0 = time.perf_counter_ns()
    first = 0
    chunks = 0
    done = False
    try:
        async with session.post(url, data=body, headers=AUTH) as r:
            if r.status != 200:
                await r.read()
                return {"error": f"HTTP {r.status}"}
            async for line in r.content:
                if line.startswith(b"data: "):
                    if not first:
                        first = time.perf_counter_ns()
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    else:
                        chunks += 1
            t1 = time.perf_counter_ns()
    except (TimeoutError, aiohttp.ClientError, OSError) as e:
        return {"error": error_kind(e)}
    if not done or chunks != STREAM_DATA_CHUNKS:
        return {"error": f"incomplete stream ({chunks}/{STREAM_DATA_CHUNKS} chunks, [DONE] {done})"}
    return {"ttfc": (first - t0) / 1e6, "total": (t1 - t0) / 1e6, "chunks": chunks}


async def stream_batch(url: str, body: bytes, n: int, procs: Processes) -> dict[str, Any]:
    """`n` streamed requests all at once; their first-chunk and total times, errors and the CPU used."""
    cpu = Cpu(procs)
    async with session_for(n + 8) as session:
        cpu.start()
        t0 = time.perf_counter()
        res = await asyncio.gather(*(one_stream(session, url, body) for _ in range(n)))
        wall = time.perf_counter() - t0
        usage = cpu.stop()
    oks = [r for r in res if "error" not in r]
    errors = collections.Counter(r["error"] for r in res if "error" in r)
    return {"streams": n, "completed": len(oks), "errors": sum(errors.values()), "error_kinds": dict(errors),
            "ttfc": [r["ttfc"] for r in oks], "total": [r["total"] for r in oks], "batch_s": wall, "cpu": usage}
