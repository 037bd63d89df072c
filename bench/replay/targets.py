"""Running ctxproxy in front of the mock (a subprocess as users run it, or in-process), and reading what it left.

Also what an external proxy left in its state folder, and a live process's CPU
time, read just before it is stopped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import yaml

from bench.paths import PROXY_CLI

START_TIMEOUT = 30.0  # seconds for the proxy to answer /healthz


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def proxy_subprocess(config: dict[str, Any], upstream: str, tmp: str,
                     src: str | None = None) -> Iterator[dict[str, Any]]:
    """`python -m proxy.cli serve` on a free port; yields {url, log, cmd, start_s}; stops it after.

    `src`: a directory holding the `proxy` package to run instead of the installed one
    (e.g. a `git archive` snapshot, so parallel edits in the working tree do not leak in).
    """
    port = free_port()
    cmd = [sys.executable, "-m", PROXY_CLI, "serve", "--port", str(port)]
    if config:
        path = os.path.join(tmp, "config.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        cmd += ["--config", path]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
    env.update(CTXPROXY_UPSTREAM=upstream, CTXPROXY_STORE=f"sqlite:///{os.path.join(tmp, 'ctxproxy.db')}")
    if src:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(src), *filter(None, [env.get("PYTHONPATH")])])
    log_path = os.path.join(tmp, "proxy.log")
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {proc.returncode}: {open(log_path).read()[-2000:]}")
            try:
                if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"proxy not healthy after {START_TIMEOUT:.0f}s")
            time.sleep(0.05)
        yield {"url": url, "log": log_path, "cmd": cmd, "start_s": time.perf_counter() - t0, "pid": proc.pid}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@contextmanager
def proxy_inprocess(config: dict[str, Any], upstream: str, tmp: str,
                    src: str | None = None) -> Iterator[dict[str, Any]]:
    """The proxy app under uvicorn in a thread of this process (tests/proxy_server.py)."""
    if src:
        raise SystemExit("replay: --proxy-src needs --proxy-mode subprocess")
    from tests.proxy_server import ProxyServer, make_settings

    t0 = time.perf_counter()
    settings = make_settings(upstream, f"sqlite:///{os.path.join(tmp, 'ctxproxy.db')}", **config)
    with ProxyServer(settings) as p:
        yield {"url": p.url, "log": None, "cmd": ["in-process"], "start_s": time.perf_counter() - t0, "pid": None}


def proxy_log(path: str | None) -> dict[str, Any]:
    """Sums over the proxy's per-request JSON log lines (in-handler time before forwarding, total)."""
    out = {"requests_logged": 0, "overhead_ms": 0.0, "total_ms": 0.0, "max_overhead_ms": 0.0, "errors": []}
    if not path or not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("level") in ("error", "warning", "critical"):
                out["errors"].append(rec.get("msg"))
            if rec.get("msg") != "request":
                continue
            out["requests_logged"] += 1
            oh = float(rec.get("overhead_ms") or 0.0)
            out["overhead_ms"] += oh
            out["max_overhead_ms"] = max(out["max_overhead_ms"], oh)
            out["total_ms"] += float(rec.get("total_ms") or 0.0)
    out["overhead_ms"] = round(out["overhead_ms"], 1)
    out["total_ms"] = round(out["total_ms"], 1)
    out["max_overhead_ms"] = round(out["max_overhead_ms"], 1)
    return out


def proxy_log_for(path: str | None, request_ids: set[str]) -> dict[str, list[str]]:
    """What the proxy's log says about each of `request_ids` besides the request line: its decisions
    (compaction layers, a summary set aside, errors), as "level: msg key=value ..." lines."""
    out: dict[str, list[str]] = {}
    if not path or not request_ids or not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            rid = rec.get("request_id") if isinstance(rec, dict) else None
            if rid not in request_ids:
                continue
            rest = {k: v for k, v in rec.items() if k not in ("ts", "time", "level", "msg", "request_id")}
            if rec.get("msg") == "request":
                rest = {k: rest[k] for k in ("messages", "events", "status") if k in rest}
            out.setdefault(rid, []).append(f"{rec.get('level')}: {rec.get('msg')} "
                                           + " ".join(f"{k}={v}" for k, v in rest.items()))
    return out


def external_state(state_dir: str | None) -> dict[str, Any]:
    """What an external proxy left in its state folder (ctxkeeper: per-session state.json counters)."""
    out: dict[str, Any] = {}
    if not state_dir or not os.path.isdir(state_dir):
        return out
    keys = ("cuts", "inplace_cuts", "inplace_failed", "notes_failed", "recalls", "requests", "upstream_calls",
            "notes_prompt_tokens", "notes_cached_tokens", "restarts")
    sums: dict[str, int] = {}
    rejected: dict[str, int] = {}
    for name in sorted(os.listdir(state_dir)):
        f = os.path.join(state_dir, name, "state.json")
        if os.path.exists(f):
            try:
                st = json.load(open(f))
            except ValueError:
                continue
            for k in keys:
                if isinstance(st.get(k), (int, float)):
                    sums[k] = sums.get(k, 0) + st[k]
        ev = os.path.join(state_dir, name, "events.jsonl")
        if os.path.exists(ev):
            for line in open(ev, errors="replace"):
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                why = e.get("why") or e.get("event")
                if why:
                    why = str(why)[:90]
                    rejected[why] = rejected.get(why, 0) + 1
    out["sessions"] = sum(1 for n in os.listdir(state_dir) if os.path.isdir(os.path.join(state_dir, n)))
    out["counters"] = sums
    out["events"] = dict(sorted(rejected.items(), key=lambda kv: -kv[1])[:15])
    return out


def cpu_seconds(pid: int | None) -> float | None:
    """User+system CPU of a live process (Linux /proc), read just before it is stopped."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return round((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, IndexError, ValueError):
        return None
