#!/usr/bin/env python3
"""Benchmark: what ctxproxy adds on the wire, direct-to-mock versus through the proxy.

Three processes, all on 127.0.0.1:

* the mock provider (``tests/mock_upstream.py``) in its own subprocess
  (``overhead.py --serve-mock``), so it shares no GIL with anything else;
* the proxy exactly as users run it: ``ctxproxy serve --port P`` (uvloop +
  httptools, one worker), ``CTXPROXY_UPSTREAM`` pointing at the mock and its
  store in a temporary directory; its JSON request log goes to a file there;
* this process, the client: one aiohttp ``ClientSession`` per target with
  persistent keep-alive connections (uvloop if available).

Every scenario runs direct and proxied side by side in one run, after a
warm-up, interleaved request by request (sequential scenarios, alternating
which goes first) or in alternating batches (the concurrent one), so machine
noise hits both alike. Figures (milliseconds unless stated):

1. small      - a small non-streaming chat request (system + user message):
                latency median and p99, sequential.
2. stream     - the same request with ``stream: true``: time to the first SSE
                ``data:`` line (TTFC) and to the end of the stream (TTLC).
3. c16        - 16 concurrent workers sending small non-streaming requests:
                requests/s and latency under that load.
4. long       - a 200-message, ~150k-token agent conversation (real traces,
                see ``bench/token_count.py``) whose last message is new on
                every request, non-streaming, sequential; then the same with
                the agent's ``tools`` array, as agents send it (the proxy then
                adds its ``context_read`` tool, so it re-serializes the body).

"added" = proxy minus direct, for the median and for the p99 separately (each
percentile of its own distribution, not of paired differences); "ratio" =
proxy / direct (for requests/s: proxy / direct throughput). p99 is nearest
rank, so with few samples it is close to the slowest one. After the run the
proxy's own log is joined on ``x-ctxproxy-request-id`` to split the added time
into in-handler time (``overhead_ms``: parse, route, pipeline, until the
upstream request is sent) and everything else (ASGI server, upstream client,
one more loopback hop), and the CPU time the proxy process spends per proxied
request is read from /proc (Linux) over the recorded loops.

Noise control: the client's garbage collector is off during each recorded loop
(collected between loops), and the mock freezes its start-up heap, so neither
of them pauses in the middle of a measurement; the proxy runs untouched. The
mock is told ``gpt-4o`` has a 1M-token window (its default 128k would reject
the long conversation; the proxy enforces no window of its own).

Timings are printed, never asserted. Target, for context: added median under
2 ms for a small request.

With ``--litellm`` a third target joins the same run: LiteLLM's proxy
(``litellm[proxy]``, pinned, see ``LITELLM_REQUIREMENT``), pip-installed by the
benchmark into its own virtualenv ``bench/.venvs/litellm`` (gitignored) the first
time and reused after, started as its users run it (``litellm --config FILE
--host --port``: uvicorn, one worker) with a config that makes it a plain
pass-through to the same mock (``model_name: "*"`` -> ``openai/*`` at the mock's
URL; no database, no callbacks, telemetry off, the cost map read from the
package, a master key equal to the benchmark's bearer token because LiteLLM
refuses to start without one). Every scenario then interleaves direct /
ctxproxy / LiteLLM (rotating which goes first), and a second table gives each
proxy's added latency and ratio against direct. When LiteLLM cannot be installed
or started, the exact error is printed and the run goes on without it.

Usage: ``python bench/overhead.py [--quick] [--litellm] [--json PATH]`` from the
repo root (``--proxy-cmd``, ``--keep-log``, ``--max-seconds``: see ``--help``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for p in (ROOT, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

MODEL = "gpt-4o"
# The long conversation is ~150k tokens; the mock's gpt-4o window is 128k, so the
# mock process is told this model has a larger one.
MOCK_WINDOW = 1_000_000
AUTH = {"authorization": "Bearer sk-bench-overhead", "content-type": "application/json"}
SMALL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say ok."},
]
CONCURRENCY = 16
TARGET_ADDED_MEDIAN_MS = 2.0
# LiteLLM's proxy, pinned. Newer releases do not install from the package index here:
# 1.110.x's `proxy` extra pins `litellm-proxy==<same version>`, 1.108.8-1.108.14 pin
# `litellm-enterprise==0.1.79.post2` / `litellm-proxy-extras==0.4.110.post1`, none of
# which the index has; 1.108.4 installs on CPython 3.11 (`pip install --dry-run`).
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.4"
LITELLM_START_TIMEOUT = 120.0

FULL = dict(small=1000, small_warm=200, stream=500, stream_warm=50, c16=3000, c16_batches=6,
            c16_warm=320, long=50, long_warm=5)
QUICK = dict(small=200, small_warm=50, stream=100, stream_warm=20, c16=600, c16_batches=2,
             c16_warm=64, long=10, long_warm=2)


# --------------------------------------------------------------------------- mock subprocess

def serve_mock() -> int:
    """`--serve-mock`: start MockUpstream, print its URL, live until stdin closes."""
    from tests.mock_upstream import MockUpstream

    mock = MockUpstream()
    mock.windows[MODEL] = MOCK_WINDOW
    url = mock.start()
    # Startup objects (tiktoken, Starlette, uvicorn) out of the collector's way, so the
    # mock's own full collections stay short: its pauses would be noise on both paths.
    gc.collect()
    gc.freeze()
    print(url, flush=True)

    # The mock records every request (raw body included); drop them now and then so a
    # long run does not grow without bound. list.clear() is atomic under the GIL.
    stop = threading.Event()

    def trim() -> None:
        while not stop.wait(2.0):
            mock.requests.clear()
            mock.errors.clear()

    threading.Thread(target=trim, daemon=True).start()
    try:
        sys.stdin.read()  # EOF when the parent exits or closes the pipe
    except KeyboardInterrupt:
        pass
    stop.set()
    mock.stop()
    return 0


# --------------------------------------------------------------------------- helpers

def _ms(ns: int) -> float:
    return ns / 1e6


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "median": statistics.median(xs), "p99": p99(xs),
            "mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_facts() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for mod in ("uvicorn", "uvloop", "httptools", "aiohttp", "httpx", "starlette", "fastapi"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = "?"
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpu_count": os.cpu_count(), "git": git_state(), "cpu_model": cpu, "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "loadavg_at_start": [round(x, 2) for x in load], "versions": versions}


def git_state() -> str:
    """`<short commit>` plus how many files under proxy/ differ from it (read-only git calls)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "proxy"],
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "?"
    if not head:
        return "?"
    return head + (f" + {len(dirty)} uncommitted file(s) under proxy/" if dirty else " (proxy/ clean)")


def chat_body(messages: list[dict[str, Any]], *, stream: bool = False,
              tools: list[dict[str, Any]] | None = None) -> bytes:
    import orjson

    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if tools:
        body["tools"] = tools
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


# --------------------------------------------------------------------------- processes

class Processes:
    """The mock and the proxy subprocesses, and their cleanup."""

    def __init__(self, tmp: str, proxy_cmd: list[str] | None) -> None:
        self.tmp = tmp
        self.mock: subprocess.Popen[str] | None = None
        self.proxy: subprocess.Popen[bytes] | None = None
        self.proxy_cmd = proxy_cmd
        self.proxy_log = os.path.join(tmp, "proxy.log")
        self.mock_url = ""
        self.proxy_url = ""
        self.litellm: subprocess.Popen[bytes] | None = None
        self.litellm_log = os.path.join(tmp, "litellm.log")
        self.litellm_info: dict[str, Any] = {}

    def start_mock(self) -> str:
        self.mock = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-mock"],
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                         filter(None, [ROOT, os.environ.get("PYTHONPATH")]))})
        assert self.mock.stdout is not None
        line = self.mock.stdout.readline().strip()  # the mock prints its URL once started
        if not line.startswith("http://127.0.0.1:"):
            raise SystemExit(f"mock upstream did not start (got {line!r})")
        self.mock_url = line
        return line

    def start_proxy(self) -> str:
        port = free_port()
        exe = shutil.which("ctxproxy")
        cmd = self.proxy_cmd or ([exe] if exe else [sys.executable, "-m", "proxy.cli"])
        cmd = cmd + ["serve", "--host", "127.0.0.1", "--port", str(port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
        env.update(CTXPROXY_UPSTREAM=self.mock_url,
                   CTXPROXY_STORE=f"sqlite:///{os.path.join(self.tmp, 'b.db')}",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        self.proxy_cmd_run = [f"CTXPROXY_UPSTREAM={self.mock_url}",
                              f"CTXPROXY_STORE={env['CTXPROXY_STORE']}", *cmd]
        log = open(self.proxy_log, "wb")
        self.proxy = subprocess.Popen(cmd, cwd=self.tmp, env=env, stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.proxy_url = f"http://127.0.0.1:{port}"
        return self.proxy_url

    def start_litellm(self, requirement: str) -> str:
        """LiteLLM's proxy in its own venv (installed on first use) as a pass-through to the mock.

        Returns its base URL (without /v1); raises ExternalUnavailable with the exact error text."""
        import yaml
        import external_proxies as ext

        spec = ext.External("litellm", requirement, "litellm", lambda *a: [])
        self.litellm_info["requirement"] = requirement
        self.litellm_info.update(ext.ensure_installed(
            spec, log=lambda m: print(f"  litellm: {m} (one-off, about a minute)", flush=True)))
        port = free_port()
        config = {
            "model_list": [{"model_name": "*", "litellm_params": {
                "model": "openai/*", "api_base": self.mock_url, "api_key": "sk-bench-upstream"}}],
            "litellm_settings": {"callbacks": [], "success_callback": [], "failure_callback": [],
                                 "num_retries": 0, "request_timeout": 120},
            "general_settings": {"master_key": AUTH["authorization"].split(" ", 1)[1],
                                 "disable_spend_logs": True, "disable_error_logs": True,
                                 "background_health_checks": False},
        }
        path = os.path.join(self.tmp, "litellm.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        cmd = [spec.bin, "--config", path, "--host", "127.0.0.1", "--port", str(port)]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("LITELLM_", "OPENAI_", "CTXPROXY_", "PYTHON", "DATABASE_URL"))}
        home = os.path.join(self.tmp, "litellm-home")
        os.makedirs(home, exist_ok=True)
        env.update(HOME=home, LITELLM_TELEMETRY_DISABLED="true", LITELLM_LOCAL_MODEL_COST_MAP="True",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        self.litellm_info["command"] = " ".join(
            ["LITELLM_TELEMETRY_DISABLED=true", "LITELLM_LOCAL_MODEL_COST_MAP=True", *cmd])
        self.litellm_info["config"] = config
        log = open(self.litellm_log, "wb")
        self.litellm = subprocess.Popen(cmd, cwd=self.tmp, env=env, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        if self.litellm is not None and self.litellm.poll() is None:
            self.litellm.send_signal(signal.SIGINT)
            try:
                self.litellm.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.litellm.kill()
                self.litellm.wait(timeout=5)
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.send_signal(signal.SIGINT)
            try:
                self.proxy.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait(timeout=5)
        if self.mock is not None and self.mock.poll() is None:
            try:
                assert self.mock.stdin is not None
                self.mock.stdin.close()
                self.mock.wait(timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                self.mock.kill()
                self.mock.wait(timeout=5)


class NotHealthy(SystemExit):
    """A proxy exited or did not answer its health check in time (message: the reason and its log's tail).
    A SystemExit, as before, for the scripts that reuse `wait_healthy` (bench/load.py)."""


async def wait_healthy(session: Any, url: str, proc: subprocess.Popen[bytes], log_path: str,
                       timeout: float = 30.0, path: str = "/healthz", what: str = "proxy") -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-2000:]
            raise NotHealthy(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            async with session.get(url + path) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:]
    raise NotHealthy(f"{what} not healthy after {timeout:.0f} s:\n{tail}")


# --------------------------------------------------------------------------- CPU accounting

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
    """CPU consumed by the proxy and the mock processes over the recorded part of a scenario."""

    def __init__(self, procs: Processes) -> None:
        self.pids = {"proxy": procs.proxy.pid if procs.proxy else 0,
                     "mock": procs.mock.pid if procs.mock else 0}
        if procs.litellm is not None and procs.litellm.poll() is None:
            self.pids["litellm"] = procs.litellm.pid
        self.used: dict[str, float] = {k: 0.0 for k in self.pids}
        self.used["client"] = 0.0
        self._t0: dict[str, int | None] = {}

    def start(self) -> None:
        self._t0 = {k: process_cpu_ns(pid) for k, pid in self.pids.items()}
        self._t0["client"] = time.process_time_ns()

    def stop(self) -> None:
        for k, pid in self.pids.items():
            now, before = process_cpu_ns(pid), self._t0.get(k)
            if now is not None and before is not None:
                self.used[k] += (now - before) / 1e6
        self.used["client"] += (time.process_time_ns() - (self._t0["client"] or 0)) / 1e6

    def per_request(self, n_proxied: int, n_direct: int, n_litellm: int = 0) -> dict[str, float]:
        """ms per request: proxy CPU per proxied request (LiteLLM's per LiteLLM request), mock and
        client per request of any kind."""
        n_all = max(1, n_proxied + n_direct + n_litellm)
        out = {"proxy_ms_per_proxied_request": self.used["proxy"] / max(1, n_proxied),
               "mock_ms_per_request": self.used["mock"] / n_all,
               "client_ms_per_request": self.used["client"] / n_all}
        if "litellm" in self.used and n_litellm:
            out["litellm_ms_per_litellm_request"] = self.used["litellm"] / n_litellm
        return out


# --------------------------------------------------------------------------- client

class Target:
    """One endpoint (direct or proxied) with its own keep-alive session."""

    def __init__(self, name: str, base: str, session: Any) -> None:
        self.name = name
        self.url = base.rstrip("/") + "/chat/completions"
        self.session = session
        self.request_ids: dict[str, list[str]] = {}

    def _note(self, scenario: str | None, headers: Any) -> None:
        if scenario:
            rid = headers.get("x-ctxproxy-request-id")
            if rid:
                self.request_ids.setdefault(scenario, []).append(rid)

    async def post(self, body: bytes, scenario: str | None = None) -> float:
        """Whole non-streamed exchange, ms (request sent to body fully read)."""
        t0 = time.perf_counter_ns()
        async with self.session.post(self.url, data=body, headers=AUTH) as r:
            data = await r.read()
            t1 = time.perf_counter_ns()
            if r.status != 200 or b'"chat.completion"' not in data:
                raise RuntimeError(f"{self.name}: HTTP {r.status}: {data[:300]!r}")
            self._note(scenario, r.headers)
        return _ms(t1 - t0)

    async def stream(self, body: bytes, scenario: str | None = None) -> tuple[float, float]:
        """(time to the first SSE `data:` line, time to the end of the stream), ms."""
        t0 = time.perf_counter_ns()
        first = 0
        done = False
        async with self.session.post(self.url, data=body, headers=AUTH) as r:
            if r.status != 200:
                raise RuntimeError(f"{self.name}: HTTP {r.status}: {(await r.read())[:300]!r}")
            async for line in r.content:
                if not first and line.startswith(b"data: "):
                    first = time.perf_counter_ns()
                if line.startswith(b"data: [DONE]"):
                    done = True
            t1 = time.perf_counter_ns()
            self._note(scenario, r.headers)
        if not first or not done:
            raise RuntimeError(f"{self.name}: incomplete SSE stream")
        return _ms(first - t0), _ms(t1 - t0)


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


def _round_order(targets: list[Target], i: int) -> list[Target]:
    """Round `i`'s order: the targets rotated by i (two targets: alternating which goes first)."""
    k = i % len(targets)
    return targets[k:] + targets[:k]


async def interleaved(targets: list[Target], n: int, warm: int, max_s: float,
                      call: Callable[[Target, bool], Awaitable[Any]],
                      meter: CpuMeter) -> dict[str, list[Any]]:
    """`warm` unrecorded then up to `n` recorded rounds; each round one call per target
    (direct, proxy[, litellm]), rotating which goes first. Stops early after `max_s` seconds."""
    for i in range(warm):
        for t in _round_order(targets, i):
            await call(t, False)
    out: dict[str, list[Any]] = {t.name: [] for t in targets}
    with timed_section(meter):
        await _recorded(targets, n, max_s, call, out)
    return out


async def _recorded(targets: list[Target], n: int, max_s: float,
                    call: Callable[[Target, bool], Awaitable[Any]], out: dict[str, list[Any]]) -> None:
    deadline = time.monotonic() + max_s
    for i in range(n):
        if time.monotonic() > deadline:
            print(f"  (time budget of {max_s:.0f} s reached after {i} of {n} rounds)", flush=True)
            break
        for t in _round_order(targets, i):
            out[t.name].append(await call(t, True))


async def concurrent_batch(target: Target, body: bytes, count: int, workers: int,
                           scenario: str | None, max_s: float) -> tuple[float, list[float]]:
    """`count` requests by `workers` concurrent loops; (elapsed s, latencies ms)."""
    remaining = count
    lat: list[float] = []
    deadline = time.monotonic() + max_s

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.monotonic() < deadline:
            remaining -= 1
            lat.append(await target.post(body, scenario))

    t0 = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return (time.perf_counter_ns() - t0) / 1e9, lat


# --------------------------------------------------------------------------- scenarios

def long_bodies(count: int) -> tuple[list[bytes], list[bytes], dict[str, Any]]:
    """`count` request bodies: the same 199 messages of ~150k tokens plus a new last one;
    the same again with the agent's `tools` array (as agents send it), and the facts."""
    import orjson
    from token_count import N_MESSAGES, TOOLS, build_conversation
    from proxy.tokens.counter import TokenCounter

    conversation, pool = build_conversation()
    head = conversation[: N_MESSAGES - 1]
    bodies, with_tools = [], []
    for r in range(count):
        last = {"role": "tool", "tool_call_id": f"call_bench_{r}",
                "content": f"run {r}\n" + pool[(r * 7) % len(pool)][:4000]}
        bodies.append(chat_body(head + [last]))
        with_tools.append(chat_body(head + [last], tools=TOOLS))
    tokens = TokenCounter().count_messages(orjson.loads(bodies[0])["messages"], MODEL)
    return bodies, with_tools, {"messages": N_MESSAGES, "tokens": tokens, "bytes": len(bodies[0])}


async def run(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    import aiohttp

    cfg = QUICK if args.quick else FULL
    max_s = args.max_seconds
    result: dict[str, Any] = {"mode": "quick" if args.quick else "full", "counts": cfg,
                              "concurrency": CONCURRENCY, "scenarios": {}, "samples_ms": {}}
    samples = result["samples_ms"]  # every recorded latency, in order, for the JSON file
    cpu = result["cpu_ms_per_request"] = {}

    print("building the long conversation ...", flush=True)
    n_long = cfg["long"] + cfg["long_warm"]
    bodies, bodies_tools, long_facts = long_bodies((3 if args.litellm else 2) * n_long)
    result["long_conversation"] = long_facts

    mock_url = procs.start_mock()
    proxy_url = procs.start_proxy()
    litellm_url = ""
    if args.litellm:
        import external_proxies as ext

        print(f"starting LiteLLM ({args.litellm_requirement}) ...", flush=True)
        try:
            litellm_url = procs.start_litellm(args.litellm_requirement)
        except ext.ExternalUnavailable as err:
            result["litellm_unavailable"] = {"stage": "install", "error": str(err)}
    timeout = aiohttp.ClientTimeout(total=120)

    def session() -> aiohttp.ClientSession:
        conn = aiohttp.TCPConnector(limit=2 * CONCURRENCY, limit_per_host=2 * CONCURRENCY,
                                    keepalive_timeout=600, force_close=False)
        return aiohttp.ClientSession(connector=conn, timeout=timeout, auto_decompress=False,
                                     skip_auto_headers=("User-Agent",))

    async with session() as s_direct, session() as s_proxy, session() as s_litellm:
        assert procs.proxy is not None
        await wait_healthy(s_proxy, proxy_url, procs.proxy, procs.proxy_log)
        direct = Target("direct", mock_url, s_direct)
        proxy = Target("proxy", proxy_url + "/v1", s_proxy)
        targets = [direct, proxy]
        if litellm_url:
            assert procs.litellm is not None
            t0 = time.monotonic()
            try:
                await wait_healthy(s_litellm, litellm_url, procs.litellm, procs.litellm_log,
                                   timeout=LITELLM_START_TIMEOUT, path="/health/liveliness", what="LiteLLM")
                probe = Target("litellm", litellm_url + "/v1", s_litellm)
                await probe.post(chat_body(SMALL_MESSAGES))  # the pass-through works end to end
                await probe.stream(chat_body(SMALL_MESSAGES, stream=True))
                targets.append(probe)
                procs.litellm_info["start_s"] = round(time.monotonic() - t0, 1)
            except (NotHealthy, RuntimeError, aiohttp.ClientError, asyncio.TimeoutError) as err:
                result["litellm_unavailable"] = {"stage": "start", "error": f"{type(err).__name__}: {err}"}
        if "litellm_unavailable" in result:
            u = result["litellm_unavailable"]
            print(f"LiteLLM not run ({u['stage']} failed), going on without it:\n{u['error']}", flush=True)
        result["targets"] = [t.name for t in targets]
        result["litellm"] = {k: v for k, v in procs.litellm_info.items()}
        gc.collect()
        gc.freeze()  # the setup's objects are never rescanned

        # 1. small non-streaming, sequential
        small = chat_body(SMALL_MESSAGES)
        print(f"[1/5] small non-streaming: {cfg['small']} sequential requests each ...", flush=True)
        meter = CpuMeter(procs)
        r = await interleaved(targets, cfg["small"], cfg["small_warm"], max_s,
                              lambda t, rec: t.post(small, "small" if rec else None), meter)
        cpu["small"] = meter.per_request(len(r["proxy"]), len(r["direct"]), len(r.get("litellm", ())))
        result["scenarios"]["small"] = {k: summary(v) for k, v in r.items()}
        result["scenarios"]["small"]["bytes"] = len(small)
        samples["small"] = r

        # 2. streaming
        sbody = chat_body(SMALL_MESSAGES, stream=True)
        print(f"[2/5] streaming: {cfg['stream']} sequential requests each ...", flush=True)
        meter = CpuMeter(procs)
        r = await interleaved(targets, cfg["stream"], cfg["stream_warm"], max_s,
                              lambda t, rec: t.stream(sbody, "stream" if rec else None), meter)
        cpu["stream"] = meter.per_request(len(r["proxy"]), len(r["direct"]), len(r.get("litellm", ())))
        result["scenarios"]["stream_first"] = {k: summary([x[0] for x in v]) for k, v in r.items()}
        result["scenarios"]["stream_last"] = {k: summary([x[1] for x in v]) for k, v in r.items()}
        samples["stream_first"] = {k: [x[0] for x in v] for k, v in r.items()}
        samples["stream_last"] = {k: [x[1] for x in v] for k, v in r.items()}

        # 3. 16 concurrent, alternating batches D P P D D P ...
        # (three targets: D P L L P D D P L ...; `c16_batches` counts the batches of two targets)
        per_target = cfg["c16_batches"] // 2
        n_b = per_target * len(targets)
        per = cfg["c16"] // per_target
        print(f"[3/5] {CONCURRENCY} concurrent: {cfg['c16']} requests each in {n_b} "
              f"alternating batches of {per} ...", flush=True)
        for t in targets:
            await concurrent_batch(t, small, cfg["c16_warm"], CONCURRENCY, None, max_s)
        elapsed = {t.name: 0.0 for t in targets}
        lat: dict[str, list[float]] = {t.name: [] for t in targets}
        batches: dict[str, list[float]] = {t.name: [] for t in targets}
        order = (targets + targets[::-1]) * n_b
        meter = CpuMeter(procs)
        for t in order[:n_b]:
            with timed_section(meter):
                s, l = await concurrent_batch(t, small, per, CONCURRENCY, "c16", max_s)
            elapsed[t.name] += s
            lat[t.name] += l
            batches[t.name].append(len(l) / s)
        result["scenarios"]["c16_latency"] = {k: summary(v) for k, v in lat.items()}
        cpu["c16"] = meter.per_request(len(lat["proxy"]), len(lat["direct"]), len(lat.get("litellm", ())))
        samples["c16_latency"] = lat
        result["scenarios"]["c16_rps"] = {
            k: {"requests": len(lat[k]), "seconds": elapsed[k], "rps": len(lat[k]) / elapsed[k],
                "rps_per_batch": batches[k]} for k in lat}

        # 4. long conversation, new last message each request
        print(f"[4/5] long conversation ({long_facts['messages']} messages, "
              f"{long_facts['tokens']:,} tokens, {long_facts['bytes']:,} bytes): "
              f"{cfg['long']} sequential requests each ...", flush=True)
        it = iter(bodies)
        meter = CpuMeter(procs)
        r = await interleaved(targets, cfg["long"], cfg["long_warm"], max_s,
                              lambda t, rec: t.post(next(it), "long" if rec else None), meter)
        cpu["long"] = meter.per_request(len(r["proxy"]), len(r["direct"]), len(r.get("litellm", ())))
        result["scenarios"]["long"] = {k: summary(v) for k, v in r.items()}
        samples["long"] = r

        # 4b. the same with a `tools` array, as agents send it
        print(f"[5/5] the same with a tools array: {cfg['long']} sequential requests each ...", flush=True)
        it = iter(bodies_tools)
        meter = CpuMeter(procs)
        r = await interleaved(targets, cfg["long"], cfg["long_warm"], max_s,
                              lambda t, rec: t.post(next(it), "long_tools" if rec else None), meter)
        cpu["long_tools"] = meter.per_request(len(r["proxy"]), len(r["direct"]), len(r.get("litellm", ())))
        result["scenarios"]["long_tools"] = {k: summary(v) for k, v in r.items()}
        samples["long_tools"] = r
        gc.unfreeze()
        result["_request_ids"] = proxy.request_ids
    return result


def proxy_log_breakdown(log_path: str, ids: dict[str, list[str]]) -> dict[str, Any]:
    """Median/p99 of the proxy's own per-request timings, per scenario (joined on request id)."""
    by_id: dict[str, dict[str, Any]] = {}
    other = 0
    with open(log_path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                other += 1
                continue
            if rec.get("msg") == "request" and "request_id" in rec:
                by_id[rec["request_id"]] = rec
            elif rec.get("level") in ("warning", "error", "critical"):
                other += 1
    out: dict[str, Any] = {"non_request_warnings_or_unparsed_lines": other}
    for scenario, rids in ids.items():
        recs = [by_id[r] for r in rids if r in by_id]
        entry: dict[str, Any] = {"matched": len(recs), "of": len(rids)}
        for field in ("overhead_ms", "upstream_headers_ms", "ttfb_ms", "total_ms"):
            xs = [float(r[field]) for r in recs if field in r]
            if xs:
                entry[field] = {"median": statistics.median(xs), "p99": p99(xs)}
        out[scenario] = entry
    return out


# --------------------------------------------------------------------------- report

ROWS = [
    ("small", "small non-stream, latency"),
    ("stream_first", "stream, time to first chunk"),
    ("stream_last", "stream, time to last chunk"),
    ("c16_latency", f"{CONCURRENCY} concurrent, latency"),
    ("long", "200 msgs/150k tok, latency"),
    ("long_tools", "  same + tools array, latency"),
]


def print_report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print()
    print(f"command:  {res['command']}")
    print(f"proxy:    {res['proxy_command']}")
    print(f"date:     {res['date']}; repo {m['git']}")
    print(f"machine:  {m['cpu_count']} CPUs ({m['cpu_model']}), {m['implementation']} {m['python']}, "
          f"{m['platform']}, load avg at start {m['loadavg_at_start']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
          + f"; client loop {res['client_loop']}")
    lc = res["long_conversation"]
    print(f"mode:     {res['mode']}; counts {res['counts']}")
    print(f"long conversation: {lc['messages']} messages, {lc['tokens']:,} tokens (o200k_base), "
          f"{lc['bytes']:,} bytes of JSON")
    print()
    hdr = (f"{'scenario':<32}{'n':>6}{'direct med':>12}{'proxy med':>11}{'added med':>11}"
           f"{'direct p99':>12}{'proxy p99':>11}{'added p99':>11}{'ratio':>8}")
    print(hdr)
    print("-" * len(hdr))
    sc = res["scenarios"]
    for key, label in ROWS:
        d, p = sc[key]["direct"], sc[key]["proxy"]
        print(f"{label:<32}{p['n']:>6}{d['median']:>12.3f}{p['median']:>11.3f}"
              f"{p['median'] - d['median']:>+11.3f}{d['p99']:>12.3f}{p['p99']:>11.3f}"
              f"{p['p99'] - d['p99']:>+11.3f}{p['median'] / d['median']:>8.2f}")
    rd, rp = sc["c16_rps"]["direct"], sc["c16_rps"]["proxy"]
    print(f"{f'{CONCURRENCY} concurrent, requests/s':<32}{rp['requests']:>6}{rd['rps']:>12.0f}"
          f"{rp['rps']:>11.0f}{'':>11}{'':>12}{'':>11}{'':>11}{rp['rps'] / rd['rps']:>8.2f}")
    print("(latencies in ms; added = proxy - direct, per percentile; ratio = proxy / direct;"
          " requests/s per batch: direct "
          + " ".join(f"{x:.0f}" for x in rd["rps_per_batch"]) + ", proxy "
          + " ".join(f"{x:.0f}" for x in rp["rps_per_batch"]) + ")")
    added = sc["small"]["proxy"]["median"] - sc["small"]["direct"]["median"]
    verdict = "under" if added < TARGET_ADDED_MEDIAN_MS else "OVER"
    print(f"small request: added median {added:.3f} ms, {verdict} the "
          f"{TARGET_ADDED_MEDIAN_MS:.0f} ms target (not asserted)")
    print_litellm(res)
    cpu = res.get("cpu_ms_per_request") or {}
    if cpu and any(v["proxy_ms_per_proxied_request"] for v in cpu.values()):
        print()
        print("CPU time per request (ms, from /proc schedstat over the recorded loops): proxy process per"
              " proxied request; mock and client per request of either kind")
        for key in ("small", "stream", "c16", "long", "long_tools"):
            if key in cpu:
                v = cpu[key]
                ll = (f"   litellm {v['litellm_ms_per_litellm_request']:.3f}"
                      if "litellm_ms_per_litellm_request" in v else "")
                print(f"  {key:<10} proxy {v['proxy_ms_per_proxied_request']:.3f}   mock "
                      f"{v['mock_ms_per_request']:.3f}   client {v['client_ms_per_request']:.3f}{ll}")
    bd = res.get("proxy_log")
    if bd:
        print()
        print("proxy's own log (median / p99 ms): overhead_ms = request received -> upstream request"
              " sent; upstream_headers_ms = sent -> upstream headers; total_ms = handler total")
        for key in ("small", "stream", "c16", "long", "long_tools"):
            e = bd.get(key)
            if not e:
                continue
            parts = [f"{f} {e[f]['median']:.3f} / {e[f]['p99']:.3f}"
                     for f in ("overhead_ms", "upstream_headers_ms", "ttfb_ms", "total_ms") if f in e]
            print(f"  {key:<10} ({e['matched']}/{e['of']} matched): " + "; ".join(parts))
        if bd.get("non_request_warnings_or_unparsed_lines"):
            print(f"  note: {bd['non_request_warnings_or_unparsed_lines']} warning/unparsed lines in "
                  f"the proxy log")


def print_litellm(res: dict[str, Any]) -> None:
    """The three-way table (direct / ctxproxy / LiteLLM), when LiteLLM ran; or why it did not."""
    u = res.get("litellm_unavailable")
    if u:
        print()
        print(f"LiteLLM: not run, {u['stage']} failed:\n{u['error']}")
        return
    sc = res["scenarios"]
    if "litellm" not in sc.get("small", {}):
        return
    info = res.get("litellm") or {}
    print()
    print(f"LiteLLM {info.get('version', '?')} ({info.get('requirement', '')}; venv bench/.venvs/litellm"
          f"{', installed by this run in %.0f s' % info['install_s'] if info.get('installed_now') else ''}; "
          f"ready {info.get('start_s', '?')} s after start)")
    print(f"  {info.get('command', '')}")
    hdr = (f"{'scenario':<32}{'n':>6}{'direct':>9}{'ctxproxy':>10}{'LiteLLM':>10}"
           f"{'ctxp +med':>11}{'LiteLLM +med':>14}{'ctxp +p99':>11}{'LiteLLM +p99':>14}"
           f"{'ctxp x':>8}{'LiteLLM x':>11}")
    print(hdr)
    print("-" * len(hdr))
    for key, label in ROWS:
        d, p, l = sc[key]["direct"], sc[key]["proxy"], sc[key]["litellm"]
        print(f"{label:<32}{l['n']:>6}{d['median']:>9.3f}{p['median']:>10.3f}{l['median']:>10.3f}"
              f"{p['median'] - d['median']:>+11.3f}{l['median'] - d['median']:>+14.3f}"
              f"{p['p99'] - d['p99']:>+11.3f}{l['p99'] - d['p99']:>+14.3f}"
              f"{p['median'] / d['median']:>8.2f}{l['median'] / d['median']:>11.2f}")
    rd, rp, rl = sc["c16_rps"]["direct"], sc["c16_rps"]["proxy"], sc["c16_rps"]["litellm"]
    print(f"{f'{CONCURRENCY} concurrent, requests/s':<32}{rl['requests']:>6}{rd['rps']:>9.0f}{rp['rps']:>10.0f}"
          f"{rl['rps']:>10.0f}{'':>11}{'':>14}{'':>11}{'':>14}{rp['rps'] / rd['rps']:>8.2f}"
          f"{rl['rps'] / rd['rps']:>11.2f}")
    print("(medians in ms; +med / +p99 = added over direct at that percentile; x = median / direct median, "
          "for requests/s throughput / direct throughput; requests/s per batch: LiteLLM "
          + " ".join(f"{x:.0f}" for x in rl["rps_per_batch"]) + ")")
    if "log_error_lines" in info:
        print(f"LiteLLM's log: {info['log_error_lines']} line(s) with Traceback/ERROR/Exception")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (about a fifth)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ap.add_argument("--max-seconds", type=float, default=300.0,
                    help="time budget per scenario phase; stops early (fewer samples) past it")
    ap.add_argument("--proxy-cmd", help="command to run the proxy instead of `ctxproxy` "
                                        "(`serve --host --port` are appended)")
    ap.add_argument("--keep-log", metavar="PATH", help="copy the proxy's log to PATH")
    ap.add_argument("--litellm", action="store_true",
                    help="add LiteLLM's proxy as a third target (installed into bench/.venvs/litellm on first use)")
    ap.add_argument("--litellm-requirement", default=LITELLM_REQUIREMENT, help=argparse.SUPPRESS)
    ap.add_argument("--serve-mock", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_mock:
        return serve_mock()

    try:
        import uvloop
        uvloop.install()
        client_loop = "uvloop"
    except ImportError:
        client_loop = "asyncio"

    res: dict[str, Any] = {
        "command": shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "client_loop": client_loop,
        "target_added_median_ms": TARGET_ADDED_MEDIAN_MS,
    }
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        procs = Processes(tmp, shlex.split(args.proxy_cmd) if args.proxy_cmd else None)
        try:
            res.update(asyncio.run(run(args, procs)))
        except BaseException:
            procs.stop()
            if os.path.exists(procs.proxy_log):
                with open(procs.proxy_log, errors="replace") as f:
                    tail = f.read()[-3000:]
                print(f"--- last lines of the proxy's log ---\n{tail}", file=sys.stderr)
            if procs.litellm is not None and os.path.exists(procs.litellm_log):
                with open(procs.litellm_log, errors="replace") as f:
                    tail = f.read()[-3000:]
                print(f"--- last lines of LiteLLM's log ---\n{tail}", file=sys.stderr)
            raise
        procs.stop()
        res["proxy_command"] = " ".join(getattr(procs, "proxy_cmd_run", []))
        ids = res.pop("_request_ids", {})
        res["proxy_log"] = proxy_log_breakdown(procs.proxy_log, ids)
        if args.keep_log:
            shutil.copyfile(procs.proxy_log, args.keep_log)
        if procs.litellm is not None and os.path.exists(procs.litellm_log):
            with open(procs.litellm_log, errors="replace") as f:
                text = f.read()
            res.setdefault("litellm", {})["log_error_lines"] = sum(
                1 for line in text.splitlines() if "Traceback" in line or "ERROR" in line or "Exception" in line)
            res["litellm"]["log_tail"] = text[-1500:]
    samples = res.pop("samples_ms", {})
    print_report(res)
    if args.json:
        res["samples_ms"] = {k: {t: [round(x, 4) for x in xs] for t, xs in v.items()}
                             for k, v in samples.items()}
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
