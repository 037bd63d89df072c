"""The hostile-neighbour run of ``python -m bench.load --hostile``: do a client's worst inputs slow everybody else?

Same processes as bench.load (the load mock in its own subprocess, answering after
``--delay``; the proxy as users run it, default config, SQLite store). Small
non-streaming requests run in a closed loop at ``--hostile-concurrency`` (8) with
/healthz polled every 50 ms beside them, in runs of ``--hostile-duration``
seconds (12), alternately **quiet** (only them) and **hostile** (while one more
client, the neighbour, sends back to back, each on the same API key):

1. a 10 MB tool result of one repeated letter, new content every time (letter
   and length change, so no decision is ever replayed) - offloaded, so the
   proxy hashes, counts and previews it;
2. a read-back of a stored trap text (a log with ten lines of 22 ``a`` and a
   ``!``) with the pattern ``(a+)+$`` (a backtracking engine needs ~0.6 s per
   such line);
3. the same with ``(a|aa)+b``.

The neighbour learns the trap's handle from the mock, which answers a request
whose prompt names a handle with that handle, and asks for a read-back by
ending its prompt with a ``HOSTILE-READ {json}`` message: the mock then calls
``context_read`` with those arguments, and answers the proxy's hidden round
with text (`mock_reply`, used by bench.load's mock). Runs alternate Q H Q H, so
the machine's noise hits both alike; the figures are per kind of run, all its
samples together: small requests' p50/p99/max and errors, the worst /healthz,
and what the neighbour got done (its requests and their median times).
About a minute.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

HOSTILE_SYSTEM = "You are the hostile neighbour of bench/hostile.py."
READ_MARK = "HOSTILE-READ "
READ_CALL = "call_hostile_read"
STATUS_OPEN = "<agent_status>"  # the proxy's status bar, appended after the client's last message
PATTERNS = ("(a+)+$", "(a|aa)+b")
TRAP = "\n".join([f"2026-11-29T12:00:00 worker[{i}] processed item {i * 7919 % 100003} ok" for i in range(2500)]
                 + ["a" * 22 + "!"] * 10)  # ~25k tokens: over the default 20k offload threshold
BIG_CHARS = 10_000_000
HANDLE = re.compile(r"ctx_[0-9a-f]{20}")
HEALTHZ_EVERY_S = 0.05
TIMEOUT_S = 60.0
DEFAULTS = dict(concurrency=8, duration=12.0, rounds=2)


def mock_reply(messages: list[dict[str, Any]]) -> Any:
    """The load mock's answer to the neighbour's requests (None for anybody else's)."""
    from tests import _mock_stream as ms

    if not messages or messages[0].get("content") != HOSTILE_SYSTEM:
        return None
    last = next(m for m in reversed(messages) if not str(m.get("content")).startswith(STATUS_OPEN))
    content = last.get("content") if isinstance(last.get("content"), str) else ""
    if last.get("role") == "tool" and str(last.get("tool_call_id", "")).startswith(READ_CALL):
        return ms.Reply(f"read back {len(content)} characters")
    if last.get("role") == "user" and content.startswith(READ_MARK):
        return ms.Reply(None, [ms.ToolCall(f"{READ_CALL}_{len(messages)}", "context_read", content[len(READ_MARK):])])
    found = [h for m in messages if isinstance(m.get("content"), str) for h in HANDLE.findall(m["content"])]
    return ms.Reply(f"stored as {found[-1]}" if found else "nothing stored")


def _history(task: str, tool_text: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": HOSTILE_SYSTEM}, {"role": "user", "content": task},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "cat"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": tool_text}]


async def _post(session: Any, url: str, body: bytes, auth: dict[str, str]) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    async with session.post(url, data=body, headers=auth) as r:
        data = await r.read()
    try:
        text = json.loads(data)["choices"][0]["message"]["content"] or ""
    except (ValueError, KeyError, IndexError, TypeError):
        text = ""
    return r.status, text, time.perf_counter() - t0


async def neighbour(url: str, auth: dict[str, str], handle: str, stop: asyncio.Event, done: dict[str, list]) -> None:
    """Back to back until `stop`: a new 10 MB single-letter result, then a read-back per pattern."""
    import aiohttp
    import orjson

    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, skip_auto_headers=("User-Agent",)) as session:
        i = 0
        while not stop.is_set():
            i += 1
            letter = "abcdefghijklmnopqrstuvwxyz"[i % 26]
            big = orjson.dumps({"model": "gpt-4o", "messages": _history(f"big {i}", letter * (BIG_CHARS + i))})
            jobs = [("10 MB result", big)]
            for p in PATTERNS:
                read = _history("read the trap", TRAP) + [
                    {"role": "user", "content": READ_MARK + json.dumps({"handle": handle, "pattern": p})}]
                jobs.append((f"read {p}", orjson.dumps({"model": "gpt-4o", "messages": read})))
            for kind, body in jobs:
                if stop.is_set():
                    return
                try:
                    status, _, took = await _post(session, url, body, auth)
                    done.setdefault(kind if status == 200 else f"{kind} (HTTP {status})", []).append(took)
                except (TimeoutError, aiohttp.ClientError) as e:
                    done.setdefault(f"{kind} ({type(e).__name__})", []).append(TIMEOUT_S)


async def healthz(base: str, stop: asyncio.Event, out: list[float]) -> None:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                async with session.get(base + "/healthz") as r:
                    await r.read()
                out.append(time.perf_counter() - t0)
            except (TimeoutError, aiohttp.ClientError):
                out.append(TIMEOUT_S)
            await asyncio.sleep(HEALTHZ_EVERY_S)


async def store_trap(url: str, auth: dict[str, str]) -> str:
    """Offload the trap text once; its handle, as the mock saw it in the rewritten prompt."""
    import aiohttp
    import orjson

    async with aiohttp.ClientSession() as session:
        status, text, _ = await _post(session, url, orjson.dumps(
            {"model": "gpt-4o", "messages": _history("read the trap", TRAP)}), auth)
    found = HANDLE.search(text)
    if status != 200 or not found:
        raise SystemExit(f"hostile run: the trap text was not offloaded (HTTP {status}: {text[:200]!r})")
    return found.group(0)


async def run(proxy_base: str, auth: dict[str, str], small: bytes, closed_loop: Any, procs: Any,
              cfg: dict[str, Any]) -> dict[str, Any]:
    """Q H Q H ... runs; closed_loop is bench.load's (small requests at a concurrency, with CPU figures)."""
    url = proxy_base + "/v1/chat/completions"
    handle = await store_trap(url, auth)
    kinds: dict[str, dict[str, Any]] = {k: {"lat": [], "errors": 0, "error_kinds": {}, "requests": 0, "healthz": [],
                                            "runs": []} for k in ("quiet", "hostile")}
    neighbour_done: dict[str, list[float]] = {}
    for r in range(cfg["rounds"]):
        for kind in ("quiet", "hostile"):
            print(f"[hostile] round {r + 1}/{cfg['rounds']}, {kind:<7}: {cfg['duration']:.0f} s of small requests at "
                  f"{cfg['concurrency']} concurrent ...", flush=True)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(healthz(proxy_base, stop, kinds[kind]["healthz"]))]
            if kind == "hostile":
                tasks.append(asyncio.create_task(neighbour(url, auth, handle, stop, neighbour_done)))
                await asyncio.sleep(0.5)  # the neighbour's first 10 MB is on its way
            res = await closed_loop(url, small, cfg["concurrency"], 0.5, cfg["duration"], procs, keep=True)
            stop.set()
            await asyncio.gather(*tasks)
            k = kinds[kind]
            k["lat"] += res.pop("latencies")
            k["errors"] += res["errors"]
            for e, n in res["error_kinds"].items():
                k["error_kinds"][e] = k["error_kinds"].get(e, 0) + n
            k["requests"] += res["requests"]
            k["runs"].append(res)
    return {"handle": handle, "kinds": kinds, "neighbour": neighbour_done, "config": cfg}


def big_overheads(log_path: str) -> list[float]:
    """overhead_ms (request received until sent upstream) of the neighbour's 10 MB requests, from the proxy's log."""
    out = []
    with open(log_path, errors="replace") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("msg") == "request" and row.get("bytes_in", 0) >= BIG_CHARS and "overhead_ms" in row:
                out.append(float(row["overhead_ms"]))
    return out


def report(res: dict[str, Any], pct: Any) -> list[str]:
    cfg = res["config"]
    out = [f"Hostile neighbour: small non-streaming requests, closed loop at {cfg['concurrency']} concurrent, "
           f"{cfg['rounds']} x {cfg['duration']:.0f} s per kind, quiet and hostile runs alternating (latency ms)"]
    hdr = f"{'run':<9}{'requests':>9}{'errors':>7}{'p50':>9}{'p99':>9}{'max':>9}{'healthz max':>13}{'proxy%':>8}"
    out += [hdr, "-" * len(hdr)]
    for kind, k in res["kinds"].items():
        cpu = [r["cpu"].get("proxy", float("nan")) for r in k["runs"] if r.get("cpu")]
        out.append(f"{kind:<9}{k['requests']:>9}{k['errors']:>7}{pct(k['lat'], 0.5):>9.1f}{pct(k['lat'], 0.99):>9.1f}"
                   f"{max(k['lat'], default=float('nan')):>9.1f}{max(k['healthz'], default=float('nan')) * 1000:>13.1f}"
                   f"{sum(cpu) / len(cpu) if cpu else float('nan'):>8.0f}")
    for kind, k in res["kinds"].items():
        if k["error_kinds"]:
            out.append(f"  {kind} errors: " + ", ".join(f"{e} {n}" for e, n in sorted(k["error_kinds"].items())))
    q, h = res["kinds"]["quiet"]["lat"], res["kinds"]["hostile"]["lat"]
    out.append(f"  hostile - quiet: p50 {pct(h, 0.5) - pct(q, 0.5):+.1f} ms, p99 {pct(h, 0.99) - pct(q, 0.99):+.1f} ms")
    out.append("  the neighbour, meanwhile (requests answered, median seconds each):")
    for kind, times in sorted(res["neighbour"].items()):
        out.append(f"    {kind:<26}{len(times):>4}  {pct(times, 0.5):8.2f} s")
    big = res.get("big_overhead_ms") or []
    if big:
        out.append(f"  the proxy's own overhead_ms on the 10 MB requests (received -> sent upstream, its log): "
                   f"median {pct(big, 0.5):,.0f}, max {max(big):,.0f} ({len(big)} requests)")
    return out
