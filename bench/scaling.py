#!/usr/bin/env python3
"""Benchmark: the proxy's CPU time per request as the conversation grows (steady state).

Question: once the earlier messages of a conversation have been through the
proxy, does the next request cost more CPU when the history is longer? It
should stay nearly flat: everything the proxy keeps per message is cached by
digest, so a request with n messages of which n-1 were seen before should cost
about the same at 10 or at 1,000 messages, apart from parsing and re-sending
the bytes.

History: real agent messages, unmodified. The system message and ``tools`` of
the first mini-swe-agent trajectory in /work/shared/traces (override with
``CTXPROXY_TRACES_DIR``), then the non-system messages of the mini-swe-agent
trajectories one after the other, in file order (tool-call ids prefixed per
trajectory so they stay unique): 1,000 messages are about 228k tokens
(o200k_base). For each size n in ``--sizes`` (10, 50, 100, 200, 500, 1000)
and each proxy config:

* a fresh API key (so a fresh tenant and session) sends the first n-1
  messages once, unmeasured: the proxy has now seen them;
* ``--warm`` (3) unmeasured, then ``--runs`` (20) measured requests of n
  messages: the same n-1 plus a new last message each time (message n of the
  history with `` [variant k]`` appended to its text, so tool-call pairing stays
  valid and its digest is new), non-streaming, sequential.

How it is measured: the proxy runs **in this process**, its real app
(``proxy.app.create_app``: lifespan, SQLite store in a temporary directory,
JSON request log to a file, the real upstream client) driven directly through
ASGI, with no HTTP server in front (uvicorn/httptools parse the same request
line and headers whatever the history, so they are a constant, measured by
``overhead.py``). The upstream is the mock provider
(``tests/mock_upstream.py``) in **its own subprocess**, over loopback, so none
of its work is counted. Per request the CPU time is ``time.process_time()``
(all threads of this process: the event loop and the SQLite store's worker
thread) from before the ASGI call to after the response has been received **and
the proxy's background accounting write has finished**
(``accounting.drain()``), so the deferred work after the response is counted
too. The request bodies are encoded before the clock starts. Also reported: the
in-handler time from the proxy's own log (``overhead_ms``: parse, route,
pipeline, until the upstream request is sent) and the wall time.

Configs: ``default`` (built-in defaults: status bar on, append mode; offload,
cache hints, accounting) and ``no-status-bar`` (``status_bar.enabled: false``),
both with ``models: {gpt-4o: {context_window: 1000000}}`` so that nothing
compacts (compaction is an occasional cost, not a per-request one; the mock is
told the same window). Beside them, measured the same way in the same run, the
``passthrough`` reference (``passthrough_app``): a FastAPI route that only does
``orjson.loads`` + ``orjson.dumps`` of the body and forwards it with the
proxy's upstream client, the floor for any proxy that reads and re-sends the
body; the report prints each config's CPU minus the reference's (the proxy's
own added CPU). Then the largest size is run again under cProfile for each
proxy config and the top entries (by own time and by cumulative time) are
printed: where the time goes.

Usage: ``python bench/scaling.py [--sizes 10,50,100,200,500,1000] [--runs 20]
[--proxy-src DIR] [--json PATH] [--no-profile]``. ``--proxy-src DIR`` imports
the ``proxy`` package from DIR (e.g. a ``git archive HEAD proxy`` snapshot).
Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import gc
import glob
import json
import logging
import os
import pstats
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

MODEL = "gpt-4o"
WINDOW = 1_000_000  # the mock's window for gpt-4o (overhead.py's MOCK_WINDOW) and the proxy's
TRACES_DIR = os.environ.get("CTXPROXY_TRACES_DIR", "/work/shared/traces")
SIZES = [10, 50, 100, 200, 500, 1000]
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "no-status-bar": {"defaults": {"status_bar": {"enabled": False}}},
}
# Not a proxy config: the reference floor, see passthrough_app.
PASSTHROUGH = "passthrough"


def _setup_path(proxy_src: str | None) -> None:
    """`proxy` from --proxy-src (before anything imports it); bench/ and the repo for the helpers."""
    for p in (ROOT, HERE):
        if p not in sys.path:
            sys.path.insert(0, p)
    if proxy_src:
        sys.path.insert(0, os.path.abspath(proxy_src))


# --------------------------------------------------------------------------- history

def build_history(n_max: int, traces_dir: str = TRACES_DIR) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools): n_max real messages from the mini-swe-agent trajectories, as described above."""
    import orjson

    paths = sorted(glob.glob(os.path.join(traces_dir, "*mini-swe-agent*.json")))
    if not paths:
        raise SystemExit(f"no mini-swe-agent trajectories in {traces_dir}")
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] = []
    for k, path in enumerate(paths):
        with open(path, "rb") as f:
            data = orjson.loads(f.read())
        msgs = data["messages"]
        if not messages:
            messages.append(msgs[0])
            tools = data.get("tools") or []
        for m in msgs[1:]:
            if m.get("role") == "system":
                continue
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": f"t{k}_{c.get('id')}"} for c in m["tool_calls"]]
            if m.get("role") == "tool" and m.get("tool_call_id"):
                m["tool_call_id"] = f"t{k}_{m['tool_call_id']}"
            messages.append(m)
            if len(messages) >= n_max:
                return messages, tools
    raise SystemExit(f"only {len(messages)} messages in the mini-swe-agent trajectories, {n_max} asked")


def variant(message: dict[str, Any], k: int) -> dict[str, Any]:
    """The same message with new text (a new digest), role and tool-call ids unchanged."""
    m = dict(message)
    c = m.get("content")
    if isinstance(c, str) or c is None:
        m["content"] = (c or "") + f" [variant {k}]"
    elif isinstance(c, list):
        m["content"] = [*c, {"type": "text", "text": f"[variant {k}]"}]
    return m


def body(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bytes:
    import orjson

    b: dict[str, Any] = {"model": MODEL, "messages": messages}
    if tools:
        b["tools"] = tools
    return orjson.dumps(b)


# --------------------------------------------------------------------------- ASGI driver

class AsgiApp:
    """The proxy's app in this process: lifespan started/stopped by hand, requests sent as ASGI calls."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lifespan: asyncio.Task[Any] | None = None
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def start(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._lifespan = asyncio.create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        msg = await asyncio.wait_for(self._from_app.get(), 60)
        if msg["type"] != "lifespan.startup.complete":
            raise SystemExit(f"proxy lifespan failed to start: {msg}")

    async def stop(self) -> None:
        await self._to_app.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self._from_app.get(), 60)
        if self._lifespan is not None:
            await asyncio.wait_for(self._lifespan, 60)

    async def post(self, path: str, payload: bytes, api_key: str) -> tuple[int, bytes]:
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080), "state": {},
            "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                        (b"authorization", f"Bearer {api_key}".encode()),
                        (b"content-length", str(len(payload)).encode())],
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await asyncio.sleep(3600)  # never: the client does not disconnect
            return {"type": "http.disconnect"}

        status = 0
        chunks: list[bytes] = []

        async def send(msg: dict[str, Any]) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            elif msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


def passthrough_app(mock_url: str) -> Any:
    """The reference: what any proxy that reads the body and re-sends it pays, and nothing more.

    A FastAPI app with one route: ``orjson.loads`` of the body, ``orjson.dumps``
    of it, sent upstream with the proxy's own upstream client (same transport,
    same header handling), the answer read whole and returned. No route, tenant,
    session, pipeline, store, accounting or log. Measured like the proxy, the
    difference is the CPU ctxproxy adds on top of parsing, re-serialising and
    sending the bytes.
    """
    from contextlib import asynccontextmanager

    import orjson
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

    from proxy.config import UpstreamSettings
    from proxy.upstream.client import Upstream, read_body, request_headers

    settings = UpstreamSettings(base_url=mock_url)
    url = mock_url.rstrip("/") + "/chat/completions"
    held: dict[str, Upstream] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        held["upstream"] = Upstream()
        try:
            yield
        finally:
            await held["upstream"].aclose()

    async def chat(request: Request) -> Response:
        payload = orjson.dumps(orjson.loads(await request.body()))
        headers = request_headers(request.headers.items(), settings, identity_encoding=True)
        resp = await held["upstream"].send("POST", url, headers, payload, settings)
        content = await read_body(resp, url)
        return Response(content, status_code=resp.status_code, media_type="application/json")

    chat.__annotations__ = {"request": Request, "return": Response}  # real types, for FastAPI (future annotations)
    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])  # as the proxy's own route
    return app


# --------------------------------------------------------------------------- measurement

def _p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


async def measure_config(name: str, extra: dict[str, Any], mock_url: str, history: list[dict[str, Any]],
                         tools: list[dict[str, Any]], sizes: list[int], runs: int, warm: int, tmp: str,
                         profile_size: int | None, max_s: float) -> dict[str, Any]:
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
            cpu, wall, ids = [], [], []
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
                   "cpu_ms": {"median": statistics.median(cpu), "p90": _p(cpu, 0.9), "min": min(cpu)},
                   "wall_ms": {"median": statistics.median(wall), "p90": _p(wall, 0.9)},
                   "overhead_ms": {"median": statistics.median(oh), "p90": _p(oh, 0.9)} if oh else None,
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
    for (file, line, func), (cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
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


# --------------------------------------------------------------------------- report

def print_report(res: dict[str, Any]) -> None:
    print()
    print(f"command:  {res['command']}")
    print(f"date:     {res['date']}; repo {res['git']}; proxy from {res['proxy_from']}")
    m = res["machine"]
    print(f"machine:  {m['cpu_count']} CPUs ({m['cpu_model']}), {m['implementation']} {m['python']}, {m['platform']}")
    print(f"history:  {res['history']}")
    print()
    confs = res["configs"]
    names = [c["config"] for c in confs]
    hdr = f"{'messages':>8} {'tokens':>9} {'KB':>6}"
    for n in names:
        hdr += f" | {n + ' cpu med':>22} {'p90':>7} {'in-handler':>10} {'x n=' + str(confs[0]['rows'][0]['messages']):>7}"
    print(hdr)
    print("-" * len(hdr))
    base = {c["config"]: c["rows"][0]["cpu_ms"]["median"] for c in confs if c["rows"]}
    for i, r0 in enumerate(confs[0]["rows"]):
        line = f"{r0['messages']:>8} {r0['tokens']:>9,} {r0['bytes'] / 1024:>6.0f}"
        for c in confs:
            r = c["rows"][i]
            oh = r["overhead_ms"]["median"] if r["overhead_ms"] else float("nan")
            line += (f" | {r['cpu_ms']['median']:>22.3f} {r['cpu_ms']['p90']:>7.3f} {oh:>10.3f} "
                     f"{r['cpu_ms']['median'] / base[c['config']]:>7.2f}")
        print(line)
    print("(ms per request, median and p90 over the measured requests; cpu = process CPU time of the whole "
          "request path incl. the deferred accounting write; in-handler = the proxy log's overhead_ms; "
          "x = cpu median / the smallest size's)")
    for c in confs:
        rows = c["rows"]
        if len(rows) >= 2:
            a, b = rows[0], rows[-1]
            per_msg = (b["cpu_ms"]["median"] - a["cpu_ms"]["median"]) / (b["messages"] - a["messages"])
            per_kb = (b["cpu_ms"]["median"] - a["cpu_ms"]["median"]) / ((b["bytes"] - a["bytes"]) / 1024)
            print(f"  {c['config']}: {a['messages']} -> {b['messages']} messages: "
                  f"{a['cpu_ms']['median']:.2f} -> {b['cpu_ms']['median']:.2f} ms "
                  f"(+{per_msg * 1000:.1f} us per message, {per_kb * 1000:.1f} us per KB of request)")
        if c["log_warnings_or_errors"]:
            print(f"  {c['config']}: {len(c['log_warnings_or_errors'])} warning/error lines in the proxy log, "
                  f"first: {c['log_warnings_or_errors'][0]}")
    ref = next((c for c in confs if c["config"] == PASSTHROUGH), None)
    proxies = [c for c in confs if c["config"] != PASSTHROUGH]
    if ref is not None and proxies:
        print()
        print(f"The proxy's own CPU: its cpu median minus the {PASSTHROUGH} reference's (orjson loads + dumps of the "
              f"body, sent upstream and the answer returned; same app framework, upstream client and mock)")
        hdr = f"{'messages':>8} {PASSTHROUGH + ' ms':>16}" + "".join(f" | {c['config'] + ' own ms':>22}" for c in proxies)
        print(hdr)
        print("-" * len(hdr))
        for i, r in enumerate(ref["rows"]):
            line = f"{r['messages']:>8} {r['cpu_ms']['median']:>16.3f}"
            for c in proxies:
                line += f" | {c['rows'][i]['cpu_ms']['median'] - r['cpu_ms']['median']:>22.3f}"
            print(line)
    for c in confs:
        for label, text in c["profiles"].items():
            print()
            print(f"cProfile, {c['config']}, {label}, {res['runs']} requests (the process's whole request path):")
            print(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="history sizes (messages)")
    ap.add_argument("--runs", type=int, default=20, help="measured requests per size and config")
    ap.add_argument("--warm", type=int, default=3, help="unmeasured requests per size and config first")
    ap.add_argument("--configs", default=",".join([*CONFIGS, PASSTHROUGH]),
                    help=f"from: {', '.join(CONFIGS)}, {PASSTHROUGH} (the reference floor)")
    ap.add_argument("--proxy-src", help="directory holding the `proxy` package to import (e.g. a git archive)")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile pass at the largest size")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="time budget per size and config")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    _setup_path(args.proxy_src)
    sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    names = [x.strip() for x in args.configs.split(",") if x.strip()]
    unknown = [n for n in names if n not in CONFIGS and n != PASSTHROUGH]
    if unknown or not sizes or sizes[0] < 2:
        ap.error(f"unknown config(s) {unknown} or bad sizes {sizes}")

    import proxy
    from overhead import Processes, git_state, machine_facts

    try:
        import uvloop
        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"

    history, tools = build_history(max(sizes))
    res: dict[str, Any] = {
        "command": shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]]) if argv is None else argv,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "git": git_state(), "machine": machine_facts(), "loop": loop_name, "runs": args.runs, "warm": args.warm,
        "proxy_from": os.path.dirname(os.path.abspath(proxy.__file__)),
        "history": f"{len(history)} messages from the mini-swe-agent trajectories, {len(tools)} tool(s); "
                   f"{args.warm} warm + {args.runs} measured requests per size, each n-1 seen + 1 new",
    }
    with tempfile.TemporaryDirectory(prefix="ctxproxy-scaling-") as tmp:
        procs = Processes(tmp, None)
        try:
            mock_url = procs.start_mock()

            async def go() -> list[dict[str, Any]]:
                out = []
                for n in names:
                    print(f"config {n} ...", flush=True)
                    out.append(await measure_config(n, CONFIGS.get(n, {}), mock_url, history, tools, sizes, args.runs,
                                                    args.warm, tmp,
                                                    None if args.no_profile or n == PASSTHROUGH else max(sizes),
                                                    args.max_seconds))
                return out

            res["configs"] = asyncio.run(go())
        finally:
            procs.stop()
    print_report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
