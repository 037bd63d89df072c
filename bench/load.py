#!/usr/bin/env python3
"""Load benchmark: throughput, concurrent streams and memory of one ctxproxy process.

Three processes on 127.0.0.1, as in ``bench/overhead.py`` (whose process helpers
this reuses): the mock provider (``tests/mock_upstream.py``) in its own
subprocess (``load.py --serve-mock``, driven over a stdin line protocol), the
proxy exactly as users run it (``ctxproxy serve``, default config, SQLite store
in a temporary directory, one uvloop/httptools worker), and this process, the
client (aiohttp on uvloop, one session per phase, its connection pool sized for
the concurrency). The mock answers at a realistic pace: ``--delay`` (50 ms)
before the answer or the first stream chunk, ``--chunk-delay`` (20 ms) between
stream chunks.

Phases:

1. small non-streaming chat requests, closed loop, at each of ``--concurrency``
   (16, 64, 128) for ``--duration`` seconds (15; quick 5) after a 1 s warm-up,
   straight to the mock ("direct") and through the proxy, in adjacent runs of the
   same length (the order alternates between levels). Requests/s held (overall and
   the slowest whole second), latency p50/p99/max, latency the proxy adds (per
   percentile), errors (any non-200, malformed body or transport error), and the
   CPU each process used (% of one core; the machine's cores are shared by all
   three and by anything else running: the rest of the machine's busy time is
   "other", and the proxy's run-queue wait from schedstat is "wait"), and the
   proxy's RSS after each run. Then, unrecorded, ``py-spy record`` on the proxy
   for ``--profile-seconds`` under the same load at the highest concurrency, if
   py-spy is installed.
2. ``--streams`` (200) concurrent streaming requests at once, each ~20 chunks
   (a 17-word answer: role chunk, 17 content chunks, finish chunk, usage chunk,
   then ``[DONE]``: 20 data chunks): direct and proxied batches alternating,
   ``--stream-rounds`` each. Every stream must complete with every chunk and
   ``[DONE]``. Time to the first ``data:`` chunk p50/p99, per-stream completion
   p50/p99, batch completion.
3. ``--long-duration`` seconds (60; quick 15) of agent-like traffic through a
   fresh proxy process (its own new store, so that what phases 1-2 allocated
   neither hides nor adds growth) after a warm-up: ``--agents`` (48) simulated
   agents, each running sessions of 8-40 turns (system prompt, tools array, a
   task, then the assistant's tool calls and tool results of 0.1-8 KB, rarely
   100 KB, so the history grows), 30% of the requests streamed. The proxy's RSS
   (``/proc/<pid>/status`` VmRSS) is sampled every second: peak (also VmHWM),
   mean of the first and last thirds, and the least-squares slope in MB/min.

``--hostile`` runs, instead of the three phases, the hostile-neighbour comparison of
``bench/hostile.py`` (small requests with and without a client that sends 10 MB
single-letter tool results and pathological read-back patterns; about a minute).

Targets (issue 7), checked and printed, never asserted: >= 500 requests/s of small
non-streaming requests with zero errors, all 200 concurrent streams complete, RSS
under 300 MB, memory flat over the long run (last third's mean within 5 MB of the
first third's).

Every phase is bounded by a duration and a request count, every request by a
timeout, the whole run by ``--max-seconds``; the benchmark stops by itself.

Usage: ``python bench/load.py [--quick | --hostile] [--json PATH] [--md PATH]`` from the repo root.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import gc
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
for _p in (ROOT, HERE):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import hostile  # noqa: E402
from overhead import Processes, machine_facts, wait_healthy  # noqa: E402

MODEL = "gpt-4o"
AUTH = {"authorization": "Bearer sk-bench-load", "content-type": "application/json"}
SMALL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Say ok."},
]
# The mock's answer to any request without tools: 17 words, so a stream is 20 data
# chunks (role, 17 words, finish, usage) plus [DONE].
ANSWER = "Sure, here is a short answer, long enough to arrive in about twenty separate chunks over HTTP."
ANSWER_WORDS = len(ANSWER.split())
STREAM_DATA_CHUNKS = ANSWER_WORDS + 3

TARGET_RPS = 500
TARGET_STREAMS = 200
TARGET_RSS_MB = 300
FLAT_MB = 5.0  # last third's mean RSS at most this far above the first third's

FULL = dict(duration=15.0, warmup=1.0, stream_rounds=3, long_duration=60.0, long_warmup=5.0,
            profile_seconds=10.0)
QUICK = dict(duration=5.0, warmup=1.0, stream_rounds=1, long_duration=15.0, long_warmup=3.0,
             profile_seconds=5.0)
MAX_REQUESTS_PER_RUN = 200_000  # a closed loop never sends more than this, whatever the duration
REQUEST_TIMEOUT = 30.0

# --------------------------------------------------------------------------- agent-like traffic

AGENT_SYSTEM = (
    "You are a coding agent working in a Python repository. You can run shell commands, read and "
    "write files, search the code and list directories with the tools provided. Work step by step: "
    "inspect the relevant files first, make the smallest change that fixes the problem, run the "
    "tests, and report what you changed. Never invent file contents; read them. Keep answers short.\n"
) * 4
TOOLS = [
    {"type": "function", "function": {
        "name": "bash", "description": "Run a shell command in the repository and return its output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line to run."},
            "timeout": {"type": "integer", "description": "Seconds before the command is killed."}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file, optionally a range of lines.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "start": {"type": "integer"}, "end": {"type": "integer"}},
            "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Write a whole file.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the repository for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "glob": {"type": "string"}}, "required": ["pattern"]}}},
    {"type": "function", "function": {
        "name": "list_dir", "description": "List a directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]
TOOL_NAMES = [t["function"]["name"] for t in TOOLS]
STREAM_SHARE = 0.3
BIG_RESULT_SHARE = 0.005  # tool results of ~100 KB (over the default 20k-token offload threshold)


def _code_lines(rng: random.Random, n: int) -> list[str]:
    words = ["self", "value", "result", "config", "request", "items", "index", "path", "token", "count",
             "message", "session", "store", "return", "await", "async", "def", "class", "if", "for"]
    return [f"{'    ' * rng.randint(0, 3)}{rng.choice(words)}_{rng.randint(0, 999)} = "
            f"{rng.choice(words)}({rng.choice(words)}, {rng.randint(0, 99999)})  # {rng.choice(words)}"
            for _ in range(n)]


class TextPool:
    """Pre-generated tool-output lines, so the client spends its CPU on requests, not on text."""

    def __init__(self, seed: int = 7) -> None:
        rng = random.Random(seed)
        self.lines = _code_lines(rng, 4000)

    def text(self, rng: random.Random, size: int) -> str:
        out, n = [], 0
        i = rng.randrange(len(self.lines))
        while n < size:
            line = self.lines[i % len(self.lines)]
            out.append(line)
            n += len(line) + 1
            i += 1
        return "\n".join(out)


def tool_result_size(rng: random.Random) -> int:
    if rng.random() < BIG_RESULT_SHARE:
        return 100_000
    return int(min(8000, max(100, rng.lognormvariate(6.6, 0.9))))  # median ~ 700 bytes


# --------------------------------------------------------------------------- mock subprocess

def serve_mock() -> int:
    """`--serve-mock`: a MockUpstream with the load answers, driven by JSON lines on stdin.

    Commands (one JSON object per line, answered by one line on stdout):
    ``{"cmd": "set", "delay": s, "chunk_delay": s}`` and ``{"cmd": "reset"}`` (drop
    recorded requests, the prompt cache and the token memo, keep the delays);
    EOF stops the server.
    """
    import orjson

    from tests import _mock_prompt as mp
    from tests import _mock_stream as ms
    from tests.mock_upstream import MockUpstream

    class LoadMock(MockUpstream):
        def _next_reply(self, body: dict[str, Any]) -> ms.Reply:
            neighbour = hostile.mock_reply(body.get("messages") or [])
            if neighbour is not None:
                return neighbour
            if not body.get("tools"):
                return ms.Reply(ANSWER)
            n = len(body.get("messages") or ())
            if n % 7 == 6:  # now and then the agent says something instead of calling a tool
                return ms.Reply("I looked at those files. Next I will check the tests and then make the change.")
            with self._lock:
                self._call_seq += 1
                seq = self._call_seq
            name = TOOL_NAMES[n % len(TOOL_NAMES)]
            args = {"bash": {"command": f"pytest -x tests/test_mod_{n}.py -q"},
                    "read_file": {"path": f"src/pkg/mod_{n}.py"},
                    "write_file": {"path": f"src/pkg/mod_{n}.py", "content": f"VALUE = {n}\n"},
                    "search": {"pattern": f"def handler_{n}", "glob": "*.py"},
                    "list_dir": {"path": f"src/pkg/sub_{n}"}}[name]
            return ms.Reply(None, [ms.ToolCall(f"call_load_{seq}", name, orjson.dumps(args).decode())])

    mock = LoadMock()
    settings = {"delay": 0.0, "chunk_delay": 0.0}

    def apply() -> None:
        with mock._lock:
            mock.delay = settings["delay"]
            mock.chunk_delay = settings["chunk_delay"]

    url = mock.start()
    gc.collect()
    gc.freeze()
    print(url, flush=True)

    stop = threading.Event()

    def trim() -> None:  # the recorded requests (raw bodies) would otherwise grow without bound
        while not stop.wait(2.0):
            with mock._lock:
                mock.requests.clear()
                mock.errors.clear()

    threading.Thread(target=trim, daemon=True).start()
    try:
        for line in sys.stdin:
            try:
                cmd = json.loads(line)
            except ValueError:
                print("error: not JSON", flush=True)
                continue
            if cmd.get("cmd") == "set":
                settings.update({k: float(cmd[k]) for k in ("delay", "chunk_delay") if k in cmd})
                apply()
            elif cmd.get("cmd") == "reset":
                mock.reset()
                mp.forget_tokens()
                apply()
                gc.collect()
            print("ok", flush=True)
    except KeyboardInterrupt:
        pass
    stop.set()
    mock.stop()
    return 0


class LoadProcesses(Processes):
    """overhead.py's processes, with this file's mock (which takes commands on stdin)."""

    def __init__(self, tmp: str, proxy_cmd: list[str] | None) -> None:
        super().__init__(tmp, proxy_cmd)
        self.logs: list[str] = []  # every proxy's log, in start order

    def start_mock(self) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
        self.mock = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-mock"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.mock.stdout is not None
        line = self.mock.stdout.readline().strip()
        if not line.startswith("http://127.0.0.1:"):
            raise SystemExit(f"mock upstream did not start (got {line!r})")
        self.mock_url = line
        return line

    async def start_healthy_proxy(self, restart: bool = False) -> str:
        """Start the proxy and wait for /healthz; `restart`: stop the running one first and give the new
        one its own store and log (a subdirectory of the temporary directory)."""
        if restart and self.proxy is not None:
            self.proxy.send_signal(signal.SIGINT)
            try:
                self.proxy.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait(timeout=5)
            self.tmp = os.path.join(self.tmp, f"proxy{len(self.logs) + 1}")
            os.makedirs(self.tmp, exist_ok=True)
            self.proxy_log = os.path.join(self.tmp, "proxy.log")
        url = self.start_proxy()
        self.logs.append(self.proxy_log)
        assert self.proxy is not None
        async with session_for(4) as s:
            await wait_healthy(s, url, self.proxy, self.proxy_log)
        return url

    def mock_command(self, **cmd: Any) -> None:
        assert self.mock is not None and self.mock.stdin is not None and self.mock.stdout is not None
        if self.mock.poll() is not None:
            raise SystemExit(f"mock upstream exited with {self.mock.returncode}")
        self.mock.stdin.write(json.dumps(cmd) + "\n")
        self.mock.stdin.flush()
        reply = self.mock.stdout.readline().strip()
        if reply != "ok":
            raise SystemExit(f"mock upstream answered {reply!r} to {cmd}")


# --------------------------------------------------------------------------- measuring

def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (as overhead.py's p99); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def rss_kb(pid: int) -> dict[str, int]:
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
        self.t0 = time.monotonic()
        self.c0 = {k: proc_sched(p) for k, p in self.pids.items()}
        self.client0 = time.process_time_ns()
        self.m0 = machine_busy_ns()

    def stop(self) -> dict[str, float]:
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


class Run:
    """What one closed-loop run recorded."""

    def __init__(self) -> None:
        self.lat: list[float] = []  # ms, successful requests
        self.errors: collections.Counter[str] = collections.Counter()
        self.per_second: collections.Counter[int] = collections.Counter()
        self.t0 = 0.0
        self.recording = False

    def ok(self, ms: float) -> None:
        if self.recording:
            self.lat.append(ms)
            self.per_second[int(time.monotonic() - self.t0)] += 1

    def error(self, kind: str) -> None:
        if self.recording:
            self.errors[kind] += 1


def _error_kind(e: BaseException) -> str:
    return type(e).__name__


async def post_small(session: Any, url: str, body: bytes, run: Run) -> None:
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
            else:
                run.ok((t1 - t0) / 1e6)
                return
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        run.error(_error_kind(e))
    await asyncio.sleep(0.01)  # after an error: no hot loop against a failing server


def session_for(limit: int) -> Any:
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
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return {"error": _error_kind(e)}
    if not done or chunks != STREAM_DATA_CHUNKS:
        return {"error": f"incomplete stream ({chunks}/{STREAM_DATA_CHUNKS} chunks, [DONE] {done})"}
    return {"ttfc": (first - t0) / 1e6, "total": (t1 - t0) / 1e6, "chunks": chunks}


async def stream_batch(url: str, body: bytes, n: int, procs: Processes) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- phase 3: agents

def assemble_stream(lines: list[bytes]) -> dict[str, Any] | None:
    """The assistant message a client rebuilds from chat.completion.chunk events."""
    import orjson

    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    done = False
    for line in lines:
        if not line.startswith(b"data: "):
            continue
        payload = line[6:].strip()
        if payload == b"[DONE]":
            done = True
            continue
        ev = orjson.loads(payload)
        for ch in ev.get("choices") or ():
            delta = ch.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for tc in delta.get("tool_calls") or ():
                c = calls.setdefault(tc["index"], {"id": None, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                if tc.get("id"):
                    c["id"] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    c["function"]["name"] += fn["name"]
                if fn.get("arguments"):
                    c["function"]["arguments"] += fn["arguments"]
    if not done:
        return None
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


class AgentStats:
    def __init__(self) -> None:
        self.lat = {"non-stream": [], "stream": []}  # ms
        self.errors: collections.Counter[str] = collections.Counter()
        self.sessions = 0
        self.requests = 0
        self.tool_results = 0
        self.big_results = 0
        self.max_messages = 0
        self.recording = False
        self.requests_at_start = 0
        self.sessions_at_start = 0


async def agent_turn(session: Any, url: str, messages: list[dict[str, Any]], stream: bool,
                     stats: AgentStats) -> dict[str, Any] | None:
    import aiohttp
    import orjson

    body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": TOOLS}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    raw = orjson.dumps(body)
    t0 = time.perf_counter_ns()
    kind = "stream" if stream else "non-stream"
    try:
        async with session.post(url, data=raw, headers=AUTH) as r:
            if r.status != 200:
                detail = (await r.read())[:200]
                stats.errors[f"HTTP {r.status}"] += 1
                if stats.errors[f"HTTP {r.status}"] <= 3:
                    print(f"  agent request: HTTP {r.status}: {detail!r}", flush=True)
                return None
            if stream:
                msg = assemble_stream([line async for line in r.content])
            else:
                data = orjson.loads(await r.read())
                m = data["choices"][0]["message"]
                msg = {"role": "assistant", "content": m.get("content")}
                if m.get("tool_calls"):
                    msg["tool_calls"] = m["tool_calls"]
            t1 = time.perf_counter_ns()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError, IndexError) as e:
        stats.errors[_error_kind(e)] += 1
        return None
    if msg is None:
        stats.errors["incomplete stream"] += 1
        return None
    stats.requests += 1
    if stats.recording:
        stats.lat[kind].append((t1 - t0) / 1e6)
    return msg


async def agent(idx: int, session: Any, url: str, deadline: float, pool: TextPool, stats: AgentStats,
                max_requests: int) -> None:
    rng = random.Random(1000 + idx)
    s = 0
    while time.monotonic() < deadline and stats.requests < max_requests:
        s += 1
        stats.sessions += 1
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": AGENT_SYSTEM},
            {"role": "user", "content": f"Task {idx}-{s}: the handler in src/pkg/mod_{rng.randint(0, 999)}.py "
                                        f"returns the wrong status when the session store is empty; fix it "
                                        f"and add a test. Reference #{rng.getrandbits(48):x}."}]
        for _turn in range(rng.randint(8, 40)):
            if time.monotonic() >= deadline or stats.requests >= max_requests:
                return
            msg = await agent_turn(session, url, messages, rng.random() < STREAM_SHARE, stats)
            if msg is None:
                await asyncio.sleep(0.05)
                break  # this session is abandoned; the agent starts a new one
            messages.append(msg)
            if msg.get("tool_calls"):
                for call in msg["tool_calls"]:
                    size = tool_result_size(rng)
                    stats.tool_results += 1
                    stats.big_results += size >= 100_000
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": f"$ {call['function']['name']} {call['function']['arguments']}\n"
                                                + pool.text(rng, size)})
            else:
                messages.append({"role": "user", "content": f"Continue (step {_turn})."})
            stats.max_messages = max(stats.max_messages, len(messages))


async def rss_sampler(pid: list[int], samples: list[tuple[float, str, int]], phase: list[str], t0: float,
                      stop: asyncio.Event, max_samples: int) -> None:
    """VmRSS of the process `pid[0]` (the current proxy) once a second, tagged with `phase[0]`."""
    while not stop.is_set() and len(samples) < max_samples:
        r = rss_kb(pid[0])
        if "VmRSS" in r:
            samples.append((time.monotonic() - t0, phase[0], r["VmRSS"]))
        try:
            await asyncio.wait_for(stop.wait(), timeout=1.0)
        except asyncio.TimeoutError:
            pass


def slope_mb_per_min(points: list[tuple[float, int]]) -> float:
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


# --------------------------------------------------------------------------- profiling

def profile_proxy(pid: int, seconds: float, out: str) -> tuple[subprocess.Popen[bytes] | None, str]:
    exe = shutil.which("py-spy")
    if not exe:
        return None, "py-spy not installed (pip install py-spy, for diagnosis only)"
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
           "--format", "raw", "--threads", "--output", out, "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), shlex.join(cmd)


def top_frames(path: str, n: int = 15) -> dict[str, Any]:
    """Shares of py-spy's collapsed stacks (`--threads`), % of all samples: per thread; own (leaf) time
    by function and by package (or ctxproxy module) and thread; inclusive time of ctxproxy's functions.
    With uvloop a resumed coroutine's stack starts at its task, not at the loop."""
    self_c: collections.Counter[str] = collections.Counter()
    incl_proxy: collections.Counter[str] = collections.Counter()
    by_package: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path, errors="replace") as f:
        for line in f:
            stack, _, cnt = line.rstrip("\n").rpartition(" ")
            try:
                c = int(cnt)
            except ValueError:
                continue
            raw = [fr for fr in stack.split(";") if fr]
            thread = "?"
            if raw and raw[0].startswith("thread ("):
                thread = raw.pop(0).split(": ", 1)[-1]
            frames = [_short_frame(fr) for fr in raw]
            if not frames:
                continue
            total += c
            by_thread[thread] += c
            self_c[frames[-1]] += c
            leaf = frames[-1].rpartition(" (")[2].rstrip(")")
            package = leaf.split("/", 1)[0] if "/" in leaf else leaf.removesuffix(".py")
            if package == "proxy":
                package = "/".join(leaf.split("/")[:2]).removesuffix(".py")
            by_package[f"{package} ({thread})"] += c
            for fr in set(frames):
                if "(proxy/" in fr and not fr.startswith(("main (proxy/cli", "_serve (proxy/cli")):
                    incl_proxy[fr] += c
    if not total:
        return {"samples": 0}
    share = lambda counter, k: [(fr, c / total * 100) for fr, c in counter.most_common(k)]  # noqa: E731
    return {"samples": total, "threads": share(by_thread, 6), "self": share(self_c, n),
            "proxy_inclusive": share(incl_proxy, n), "packages": share(by_package, n)}


def _short_frame(frame: str) -> str:
    """`func (path/to/site-packages/pkg/mod.py:123)` -> `func (pkg/mod.py)`."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", ROOT + os.sep, f"/lib/python{sys.version_info[0]}.{sys.version_info[1]}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name


# --------------------------------------------------------------------------- the run

async def run_hostile(args: argparse.Namespace, procs: LoadProcesses) -> dict[str, Any]:
    """`--hostile`: only the hostile-neighbour comparison (bench/hostile.py), on one proxy."""
    import orjson

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


async def run(args: argparse.Namespace, procs: LoadProcesses, cfg: dict[str, Any]) -> dict[str, Any]:
    import orjson

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
        # ---- phase 1
        phase[0] = "phase1"
        small = orjson.dumps({"model": MODEL, "messages": SMALL_MESSAGES})
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
        res["phase1"] = p1
        mark("phase1")

        # ---- profile (unrecorded load)
        prof: dict[str, Any] = {}
        if not args.no_profile:
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
        res["profile"] = prof

        # ---- phase 2
        phase[0] = "phase2"
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
        res["phase2"] = p2
        mark("phase2")

        # ---- a fresh proxy (and store) for phase 3: what phases 1-2 allocated neither hides nor adds growth
        close_record()
        phase[0] = "restart"
        via_proxy = await procs.start_healthy_proxy(restart=True) + "/v1/chat/completions"
        assert procs.proxy is not None
        pid[0] = procs.proxy.pid
        start_mb = rss_kb(pid[0]).get("VmRSS", 0) / 1024
        proxies.append({"role": "phase 3", "start_mb": start_mb})

        # ---- phase 3
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
        res["phase3"] = {
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
    finally:
        stop.set()
        await sampler
    close_record()
    res["rss"] = {"after": rss_after, "peak_sampled_mb": max((kb for *_, kb in samples), default=0) / 1024,
                  "vmhwm_mb": max(p.get("vmhwm_mb", 0) for p in proxies),
                  "samples": [(round(t, 1), ph, kb) for t, ph, kb in samples]}
    res["total_seconds"] = time.monotonic() - t_start
    return res


# --------------------------------------------------------------------------- report

def header(res: dict[str, Any], proxy_note: str) -> list[str]:
    """The run's facts: command, proxy, date, machine, versions, how quiet the machine was, the mock."""
    out: list[str] = []
    w = out.append
    m = res["machine"]
    w(f"command:  {res['command']}")
    w(f"proxy:    {res['proxy_command']}{proxy_note}")
    w(f"date:     {res['date']}; repo {m['git']}")
    w(f"machine:  {m['cpu_count']} CPUs ({m['cpu_model']}), shared by client, proxy and mock; "
      f"{m['implementation']} {m['python']}, {m['platform']}, load avg at start {m['loadavg_at_start']}")
    w("versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f"; client loop {res['client_loop']}")
    ic = res.get("idle_check") or {}
    w(f"quiet?:   other processes used {ic.get('others', float('nan')):.0f}% of a core in the 2 s before the load"
      f" (machine {ic.get('machine', float('nan')):.0f}% of {100 * (m['cpu_count'] or 1)}%)")
    w(f"mock:     {res['delay_ms']:.0f} ms before answering / before the first stream chunk, "
      f"{res['chunk_delay_ms']:.0f} ms between stream chunks; mode {res['mode']}")
    w("")
    return out


def report(res: dict[str, Any]) -> str:
    if "hostile" in res:
        return "\n".join(header(res, "") + hostile.report(res["hostile"], pct))
    out = header(res, "  (phase 3: a fresh one, same command, store and log in a subdirectory)")
    w = out.append
    p1 = res.get("phase1") or []
    if p1:
        dur = p1[0]["seconds"]
        w(f"Phase 1: small non-streaming requests, closed loop, {dur:.0f} s per run after a 1 s warm-up "
          f"(latency ms; added = proxy - direct per percentile; CPU % of one core)")
        hdr = (f"{'conc':>5} {'target':<7}{'req/s':>7}{'min 1s':>7}{'requests':>9}{'errors':>7}"
               f"{'p50':>8}{'p99':>8}{'max':>8}{'+p50':>8}{'+p99':>8}" + CPU_HDR + f"{'RSS MB':>8}{'busy s':>7}")
        w(hdr)
        w("-" * len(hdr))
        by = {(r["concurrency"], r["target"]): r for r in p1}
        for c in sorted({r["concurrency"] for r in p1}):
            d = by.get((c, "direct"))
            for t in ("direct", "proxy"):
                r = by.get((c, t))
                if not r:
                    continue
                add50 = f"{r['p50'] - d['p50']:+8.2f}" if t == "proxy" and d else f"{'':>8}"
                add99 = f"{r['p99'] - d['p99']:+8.2f}" if t == "proxy" and d else f"{'':>8}"
                w(f"{c:>5} {t:<7}{r['rps']:>7.0f}{r['min_1s_rps']:>7.0f}{r['requests']:>9}{r['errors']:>7}"
                  f"{r['p50']:>8.2f}{r['p99']:>8.2f}{r['max']:>8.1f}{add50}{add99}" + cpu_cols(r.get("cpu"))
                  + (f"{r['rss_after_mb']:>8.0f}{r['busy_after_s']:>7.1f}" if "rss_after_mb" in r else ""))
        kinds = {f"{r['concurrency']} {r['target']}": r["error_kinds"] for r in p1 if r["error_kinds"]}
        if kinds:
            w(f"  errors: {kinds}")
        w("  (min 1s = fewest requests completed in any whole second of the run; " + CPU_NOTE
          + "; RSS MB = the proxy's VmRSS right after its run; busy s = how long the proxy kept using over 5%"
          " of a core after its load stopped)")
        w("")
    prof = res.get("profile") or {}
    if prof:
        if prof.get("self"):
            ld = prof.get("load", {})
            cpu = ld.get("cpu") or {}
            w(f"Profile: py-spy on the proxy, {prof['samples']} samples at {prof['concurrency']} concurrent "
              f"({ld.get('rps', 0):.0f} req/s, errors {ld.get('errors', 0)}, proxy CPU "
              f"{cpu.get('proxy', float('nan')):.0f}% of a core, busy {ld.get('busy_after_s', float('nan')):.1f} s"
              " after the load stopped; unrecorded run)")
            w("  samples by thread: " + ", ".join(f"{t} {p:.1f}%" for t, p in prof["threads"]))
            w("  top frames by own time, all threads (% of all samples):")
            for fr, p in prof["self"]:
                w(f"    {p:5.1f}%  {fr}")
            w("  ctxproxy's functions by inclusive time, all threads (% of all samples):")
            for fr, p in prof["proxy_inclusive"]:
                w(f"    {p:5.1f}%  {fr}")
            w("  own time by package or ctxproxy module, and thread (% of all samples):")
            for fr, p in prof["packages"]:
                w(f"    {p:5.1f}%  {fr}")
        else:
            w(f"Profile: {prof.get('error') or prof.get('command')}")
            if prof.get("py_spy_output"):
                w("  py-spy said: " + prof["py_spy_output"].strip().replace("\n", "\n  "))
        w("")
    p2 = res.get("phase2")
    if p2:
        w("Phase 2: concurrent streaming requests, all sent at once "
          f"({STREAM_DATA_CHUNKS} data chunks + [DONE] each; ms)")
        hdr = (f"{'target':<8}{'round':>6}{'streams':>8}{'complete':>9}{'errors':>7}{'TTFC p50':>10}"
               f"{'TTFC p99':>10}{'total p50':>10}{'total p99':>10}{'batch s':>8}" + CPU_HDR)
        w(hdr)
        w("-" * len(hdr))
        for t in ("direct", "proxy"):
            for i, b in enumerate(p2[t]):
                w(f"{t:<8}{i + 1:>6}{b['streams']:>8}{b['completed']:>9}{b['errors']:>7}"
                  f"{pct(b['ttfc'], 0.5):>10.1f}{pct(b['ttfc'], 0.99):>10.1f}{pct(b['total'], 0.5):>10.1f}"
                  f"{pct(b['total'], 0.99):>10.1f}{b['batch_s']:>8.2f}" + cpu_cols(b.get("cpu")))
        w(f"  (TTFC = time to the first data chunk; total = to the end of the stream; batch s = until the last"
          f" stream of the batch ended; {CPU_NOTE})")
        for t in ("direct", "proxy"):
            for b in p2[t]:
                if b["error_kinds"]:
                    w(f"  {t} errors: {b['error_kinds']}")
        w("")
    p3 = res.get("phase3")
    if p3:
        cpu = p3["cpu"]
        w(f"Phase 3: agent-like mixed traffic through a fresh proxy, {p3['agents']} agents, {p3['seconds']:.0f} s "
          f"recorded after a warm-up")
        w(f"  requests {p3['requests']} ({p3['rps']:.0f}/s), sessions started {p3['sessions_started']}, tool "
          f"results {p3['tool_results']} (of which ~100 KB: {p3['big_tool_results']}), longest history "
          f"{p3['max_messages']} messages; errors {p3['errors']} {p3['error_kinds'] or ''}")
        for k, v in p3["latency"].items():
            w(f"  {k:<10} n {v['n']:>6}  p50 {v['p50']:8.1f} ms  p99 {v['p99']:8.1f} ms")
        w("  CPU % of one core:" + "".join(f" {k} {cpu.get(k, float('nan')):.0f}" for k in CPU_KEYS))
        w(f"  proxy RSS over the recorded run ({p3['rss_samples']} samples, 1/s): min {p3['rss_min_mb']:.1f} MB, "
          f"max {p3['rss_max_mb']:.1f} MB; mean of first third {p3['rss_first_third_mb']:.1f} MB, last third "
          f"{p3['rss_last_third_mb']:.1f} MB ({p3['rss_last_third_mb'] - p3['rss_first_third_mb']:+.1f}); "
          f"slope {p3['rss_slope_mb_per_min']:+.2f} MB/min; "
          f"{(p3['rss_last_third_mb'] - p3['rss_first_third_mb']) / max(1, p3['sessions_recorded'] * 2 / 3) * 1000:+.1f}"
          f" MB per 1000 new sessions ({p3['sessions_recorded']} started while recording)")
        w("")
    rss = res.get("rss") or {}
    if rss:
        after = ", ".join(f"after {k} {v:.1f}" for k, v in rss["after"].items())
        w(f"Proxy RSS (MB): at start {res['rss_at_start_mb']:.1f}, {after}; peak sampled "
          f"{rss['peak_sampled_mb']:.1f}, VmHWM {rss['vmhwm_mb']:.1f}")
        for p in res.get("proxies") or []:
            w(f"  proxy for {p['role']}: start {p.get('start_mb', 0):.1f}, end {p.get('end_mb', 0):.1f}, "
              f"peak (VmHWM) {p.get('vmhwm_mb', 0):.1f}")
        w("")
    w("Targets (issue 7):")
    for line in targets(res):
        w("  " + line)
    w(f"total run time {res.get('total_seconds', 0):.0f} s (after start-up)")
    return "\n".join(out)


CPU_KEYS = ("proxy", "proxy_wait", "mock", "client", "others")
CPU_HDR = f"{'proxy%':>7}{'wait%':>6}{'mock%':>6}{'clnt%':>6}{'other%':>7}"
CPU_NOTE = ("CPU % of one core over the run: proxy, proxy runnable but waiting for a CPU, mock, client (this"
            " process), other processes on the machine")


def cpu_cols(cpu: dict[str, float] | None) -> str:
    cpu = cpu or {}
    nan = float("nan")
    return (f"{cpu.get('proxy', nan):>7.0f}{cpu.get('proxy_wait', nan):>6.0f}{cpu.get('mock', nan):>6.0f}"
            f"{cpu.get('client', nan):>6.0f}{cpu.get('others', nan):>7.0f}")


def targets(res: dict[str, Any]) -> list[str]:
    lines = []
    p1 = [r for r in res.get("phase1") or [] if r["target"] == "proxy"]
    if p1:
        best = max(p1, key=lambda r: r["rps"])
        errs = sum(r["errors"] for r in p1)
        ok = best["rps"] >= TARGET_RPS and errs == 0
        lines.append(f"[{'met' if ok else 'NOT met'}] >= {TARGET_RPS} req/s small non-streaming with 0 errors: "
                     f"best {best['rps']:.0f} req/s at {best['concurrency']} concurrent, "
                     + ", ".join(f"{r['rps']:.0f} at {r['concurrency']}" for r in p1)
                     + f"; errors through the proxy {errs}")
    p2 = (res.get("phase2") or {}).get("proxy") or []
    if p2:
        ok = all(b["completed"] == b["streams"] == TARGET_STREAMS for b in p2)
        lines.append(f"[{'met' if ok else 'NOT met'}] {TARGET_STREAMS} concurrent streams complete: "
                     + ", ".join(f"{b['completed']}/{b['streams']}" for b in p2) + " through the proxy")
    rss = res.get("rss") or {}
    if rss:
        peak = max(rss["vmhwm_mb"], rss["peak_sampled_mb"])
        lines.append(f"[{'met' if peak < TARGET_RSS_MB else 'NOT met'}] RSS under {TARGET_RSS_MB} MB: "
                     f"peak {peak:.1f} MB (highest VmHWM of the proxy processes)")
    p3 = res.get("phase3")
    if p3:
        growth = p3["rss_last_third_mb"] - p3["rss_first_third_mb"]
        ok = growth <= FLAT_MB and p3["errors"] == 0
        lines.append(f"[{'met' if ok else 'NOT met'}] memory flat over the long run (last third within "
                     f"{FLAT_MB:.0f} MB of the first, no errors): {growth:+.1f} MB, slope "
                     f"{p3['rss_slope_mb_per_min']:+.2f} MB/min over {p3['seconds']:.0f} s, errors {p3['errors']}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s per phase-1 run, 1 stream round, 15 s long run")
    ap.add_argument("--hostile", action="store_true", help="only the hostile-neighbour comparison (bench/hostile.py, "
                                                           "about a minute)")
    ap.add_argument("--hostile-concurrency", type=int, default=hostile.DEFAULTS["concurrency"],
                    help="small requests in flight in the hostile run (8)")
    ap.add_argument("--hostile-duration", type=float, default=hostile.DEFAULTS["duration"],
                    help="seconds per quiet or hostile run (12)")
    ap.add_argument("--hostile-rounds", type=int, default=hostile.DEFAULTS["rounds"],
                    help="quiet + hostile pairs (2)")
    ap.add_argument("--concurrency", default="16,64,128", help="phase-1 levels (default 16,64,128)")
    ap.add_argument("--duration", type=float, help="seconds per phase-1 run (15; quick 5)")
    ap.add_argument("--streams", type=int, default=TARGET_STREAMS, help="concurrent streams in phase 2")
    ap.add_argument("--stream-rounds", type=int, help="phase-2 batches per target (3; quick 1)")
    ap.add_argument("--agents", type=int, default=48, help="simulated agents in phase 3")
    ap.add_argument("--long-duration", type=float, help="seconds of phase 3 (60; quick 15)")
    ap.add_argument("--delay", type=float, default=0.05, help="mock: seconds before answering (0.05)")
    ap.add_argument("--chunk-delay", type=float, default=0.02, help="mock: seconds between stream chunks (0.02)")
    ap.add_argument("--no-profile", action="store_true", help="skip the py-spy run")
    ap.add_argument("--profile-seconds", type=float, help="py-spy duration (10; quick 5)")
    ap.add_argument("--keep-profile", metavar="PATH", help="copy py-spy's collapsed stacks to PATH")
    ap.add_argument("--proxy-cmd", help="command to run the proxy instead of `ctxproxy` "
                                        "(`serve --host --port` are appended)")
    ap.add_argument("--keep-log", metavar="PATH", help="copy the proxies' logs to PATH (phases 1-2) and PATH.2 "
                                                       "(phase 3)")
    ap.add_argument("--json", metavar="PATH", help="also write every figure (and the RSS samples) to PATH")
    ap.add_argument("--md", metavar="PATH", help="also write the report to PATH (markdown, figures in a code block)")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="hard limit for the whole run (600)")
    ap.add_argument("--serve-mock", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_mock:
        return serve_mock()

    cfg = dict(QUICK if args.quick else FULL)
    for k in ("duration", "stream_rounds", "long_duration", "profile_seconds"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    for name, v in (("concurrency", min(args.concurrency, default=0)), ("streams", args.streams),
                    ("agents", args.agents)):
        if not 1 <= v <= 2000:
            ap.error(f"--{name} must be between 1 and 2000")

    try:
        import uvloop
        uvloop.install()
        client_loop = "uvloop"
    except ImportError:
        client_loop = "asyncio"

    res: dict[str, Any] = {
        "command": shlex.join(["python", os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_facts(), "client_loop": client_loop, "mode": "quick" if args.quick else "full",
        "config": cfg, "delay_ms": args.delay * 1000, "chunk_delay_ms": args.chunk_delay * 1000,
    }
    if args.hostile:
        res["mode"] = "hostile"
    with tempfile.TemporaryDirectory(prefix="ctxproxy-load-") as tmp:
        procs = LoadProcesses(tmp, shlex.split(args.proxy_cmd) if args.proxy_cmd else None)
        try:
            main_run = run_hostile(args, procs) if args.hostile else run(args, procs, cfg)
            res.update(asyncio.run(asyncio.wait_for(main_run, timeout=args.max_seconds)))
        except BaseException:
            procs.stop()
            if os.path.exists(procs.proxy_log):
                with open(procs.proxy_log, errors="replace") as f:
                    tail = f.read()[-3000:]
                print(f"--- last lines of the proxy's log ---\n{tail}", file=sys.stderr)
            raise
        procs.stop()
        res["proxy_command"] = " ".join(getattr(procs, "proxy_cmd_run", []))
        warnings = 0
        for i, path in enumerate(procs.logs):
            with open(path, errors="replace") as f:
                for line in f:
                    try:
                        level = json.loads(line).get("level")
                    except ValueError:
                        level = "unparsed"
                    warnings += level in ("warning", "error", "critical", "unparsed")
            if args.keep_log:  # PATH for the first proxy, PATH.2 for the phase-3 one
                shutil.copyfile(path, args.keep_log + (f".{i + 1}" if i else ""))
        res["proxy_log_warnings"] = warnings
        if args.hostile and procs.logs:
            res["hostile"]["big_overhead_ms"] = hostile.big_overheads(procs.logs[0])
    text = report(res)
    if res["proxy_log_warnings"]:
        text += f"\nnote: {res['proxy_log_warnings']} warning/error/unparsed lines in the proxy's log"
    print()
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"# Load benchmark ({res['date'][:10]})\n\n```\n{text}\n```\n")
        print(f"\nreport written to {args.md}")
    if args.json:
        def clean(o: Any) -> Any:
            if isinstance(o, float) and not math.isfinite(o):
                return None
            if isinstance(o, dict):
                return {k: clean(v) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [clean(v) for v in o]
            return o
        with open(args.json, "w") as f:
            json.dump(clean(res), f, indent=1)
            f.write("\n")
        print(f"figures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
