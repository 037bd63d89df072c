"""What `compress.precompute` saves the request that crosses the compression trigger.

    python -m bench.precompute [--trace proxy/examples/13_*.json] [--window 16000] [--summary-delay 3]
                               [--think 0.6] [--json out.json]

One run, two proxies side by side: the same agent session is replayed turn by turn
through a proxy with the default `compress.precompute` (the shipped value, read from
proxy/rewrite/settings.py) and through one with
`precompute: null`, concurrently, so machine noise hits both alike. Both talk to one
fake provider, in this process on a free 127.0.0.1 port, that answers the agent's own
calls at once and the proxies' summary calls (recognised and answered by
`bench/fake_llm.py`) after `--summary-delay` seconds, as a real summarizer call takes
seconds. Each turn sends `messages[:i]` for each assistant message i of the
trajectory (the recorded answer is what the next turn carries), then the agent
"thinks" `--think` seconds, as an agent waits for its model: that is the time a
background summary has to be ready in.

Printed per setting: the median latency of the ordinary (non-compacting) requests,
then for each crossing request (the response carries `x-ctxproxy-compacted`) its
latency, its layer, and what it added over the median of its ordinary neighbours
(the 5 ordinary requests on each side). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from typing import Any

import httpx
import uvicorn

from bench import fake_llm
from bench.paths import ROOT
from proxy.app import create_app
from proxy.config import build_settings

DEFAULT_TRACE = "13_mini-swe-agent_*.json"  # in proxy/examples: 186 messages, ~40k tokens
MODEL = "gpt-4o"
NEIGHBOURS = 5  # ordinary requests on each side of a crossing, for its baseline


# --------------------------------------------------------------------------- servers

def _bind() -> socket.socket:
    # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets whose proto says TCP (else ~40 ms Nagle stalls)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class Served:
    """An ASGI app under uvicorn in a daemon thread on a free loopback port: `with Served(app) as url:`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> str:
        sock = _bind()
        config = uvicorn.Config(self.app, loop="asyncio", log_config=None, access_log=False, lifespan="auto",
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise SystemExit("a server failed to start")
            time.sleep(0.005)
        return f"http://127.0.0.1:{sock.getsockname()[1]}"

    def __exit__(self, *exc: object) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(timeout=10)


class Provider:
    """A fake OpenAI chat endpoint: the agent's calls answered at once, summary calls after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.summary_calls = 0
        self.seq = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        raw, more = b"", True
        while more:
            msg = await receive()
            raw += msg.get("body", b"")
            more = msg.get("more_body", False)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if scope["path"] != "/v1/chat/completions" or not isinstance(body, dict):
            await self._send(send, 404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        if fake_llm.kind(body) is not None:  # the proxy's own summary / facts call
            self.summary_calls += 1
            await asyncio.sleep(self.delay)
        text = fake_llm.respond(body)
        self.seq += 1
        prompt = len(raw) // 4  # rough; nothing here depends on it
        await self._send(send, 200, {
            "id": f"chatcmpl-bench{self.seq}", "object": "chat.completion", "created": 1_700_000_000,
            "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": len(text) // 4,
                      "total_tokens": prompt + len(text) // 4}})

    @staticmethod
    async def _send(send: Any, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def shipped_precompute() -> float | None:
    """compress.precompute as the proxy ships it (the label of the default row says this number)."""
    from proxy.rewrite.settings import CompressSettings

    return CompressSettings().precompute


def proxy_app(upstream: str, store: str, window: int, precompute: float | None | str) -> Any:
    """`precompute`: a value, None (off), or "default" (no setting given: the shipped default)."""
    compress: dict[str, Any] = {} if precompute == "default" else {"precompute": precompute}
    cfg = {"upstream": {"base_url": upstream + "/v1"}, "store": store,
           "models": {MODEL: {"context_window": window}}, "defaults": {"compress": compress}}
    return create_app(build_settings(cfg, env={}))


# --------------------------------------------------------------------------- the agent

def load_trace(path: str | None) -> dict[str, Any]:
    if path is None:
        found = sorted(glob.glob(os.path.join(ROOT, "proxy", "examples", DEFAULT_TRACE)))
        if not found:
            raise SystemExit(f"no {DEFAULT_TRACE} under proxy/examples; pass --trace")
        path = found[0]
    with open(path) as f:
        trace = json.load(f)
    trace["path"] = os.path.relpath(path)
    return trace


async def agent(url: str, key: str, trace: dict[str, Any], think: float) -> list[dict[str, Any]]:
    """The trajectory turn by turn: messages[:i] for each assistant message i; one row per turn."""
    msgs, rows = trace["messages"], []
    async with httpx.AsyncClient(timeout=300) as client:
        for i, m in enumerate(msgs):
            if m.get("role") != "assistant" or i < 2:
                continue
            started = time.perf_counter()
            r = await client.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                                  json={"model": MODEL, "messages": msgs[:i], "tools": trace.get("tools") or []})
            took = time.perf_counter() - started
            rows.append({"turn": len(rows), "messages": i, "status": r.status_code, "ms": took * 1000,
                         "compacted": r.headers.get("x-ctxproxy-compacted")})
            await asyncio.sleep(think)
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ordinary = [r for r in rows if not r["compacted"]]
    crossings = []
    for r in rows:
        if not r["compacted"]:
            continue
        before = [o["ms"] for o in ordinary if o["turn"] < r["turn"]][-NEIGHBOURS:]
        after = [o["ms"] for o in ordinary if o["turn"] > r["turn"]][:NEIGHBOURS]
        base = statistics.median(before + after) if before + after else 0.0
        crossings.append({"turn": r["turn"], "layer": r["compacted"], "ms": r["ms"], "added_ms": r["ms"] - base})
    return {"requests": len(rows), "errors": sum(r["status"] != 200 for r in rows),
            "ordinary_median_ms": statistics.median(o["ms"] for o in ordinary) if ordinary else None,
            "crossings": crossings}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    trace = load_trace(args.trace)
    provider = Provider(args.summary_delay)
    settings: dict[str, float | None | str] = {f"precompute {shipped_precompute():g} (default)": "default",
                                                "precompute null": None}
    with tempfile.TemporaryDirectory() as tmp, Served(provider) as upstream:
        servers = [Served(proxy_app(upstream, f"sqlite:///{tmp}/{n}.db", args.window, p))
                   for n, p in enumerate(settings.values())]
        urls = [s.__enter__() for s in servers]
        try:
            started = time.monotonic()
            runs = await asyncio.gather(*[agent(u, f"sk-bench-precompute-{n}", trace, args.think)
                                          for n, u in enumerate(urls)])
            wall = time.monotonic() - started
        finally:
            for s in servers:
                s.__exit__()
    return {"trace": trace["path"], "window": args.window, "summary_delay_s": args.summary_delay,
            "think_s": args.think, "wall_s": wall, "summary_calls": provider.summary_calls,
            "settings": {name: {**figures(rows), "rows": rows} for name, rows in zip(settings, runs)}}


def report(res: dict[str, Any]) -> str:
    out = [f"trace {res['trace']}, window {res['window']:,}, summary calls take {res['summary_delay_s']:g} s, "
           f"agent thinks {res['think_s']:g} s per turn; {res['wall_s']:.0f} s wall, "
           f"{res['summary_calls']} summary calls in all", ""]
    out.append(f"| setting | requests | errors | ordinary median ms | crossing turn: layer, ms (added over "
               f"its {NEIGHBOURS}+{NEIGHBOURS} neighbours' median) |")
    out.append("|---|---:|---:|---:|---|")
    for name, f in res["settings"].items():
        cross = "; ".join(f"{c['turn']}: {c['layer']}, {c['ms']:,.0f} (+{c['added_ms']:,.0f})" for c in f["crossings"])
        out.append(f"| {name} | {f['requests']} | {f['errors']} | {f['ordinary_median_ms']:.1f} | {cross or '-'} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", help="a trajectory JSON (messages, tools); default proxy/examples/" + DEFAULT_TRACE)
    ap.add_argument("--window", type=int, default=16_000, help="the model's context window the proxy is told")
    ap.add_argument("--summary-delay", type=float, default=3.0, help="seconds each summary call takes")
    ap.add_argument("--think", type=float, default=0.6, help="seconds the agent waits between turns")
    ap.add_argument("--json", help="also write every figure and row here")
    args = ap.parse_args(argv)
    res = asyncio.run(run(args))
    print(report(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
