"""Scenario 1d: one small Responses turn over the proxy's WebSocket versus the same turn over HTTP streaming.

A WebSocket turn is always streamed, so its HTTP twin is the same body with
`stream: true`, timed to the end of its stream; the WebSocket turn is timed
from sending `response.create` to its `response.completed`, on one socket kept
open (as Codex keeps one per session). Both go through the same proxy and
are interleaved round by round, so the ratio ws / http is read off one run.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from bench.overhead.config import AUTH
from bench.overhead.stats import ms, summary


async def _http_turn(session: Any, url: str, body: bytes) -> float:
    t0 = time.perf_counter_ns()
    async with session.post(url, data=body, headers=AUTH) as r:
        data = await r.read()
        t1 = time.perf_counter_ns()
    if r.status != 200 or b"response.completed" not in data:
        raise RuntimeError(f"HTTP stream turn: {r.status}: {data[:300]!r}")
    return ms(t1 - t0)


async def _ws_turn(ws: Any, frame: str) -> float:
    t0 = time.perf_counter_ns()
    await ws.send_str(frame)
    while True:
        msg = await ws.receive(timeout=60)
        data = msg.data if isinstance(msg.data, str) else ""
        if '"response.completed"' in data[:200]:
            return ms(time.perf_counter_ns() - t0)
        if '"type":"error"' in data[:40] or not data:
            raise RuntimeError(f"WebSocket turn: {msg.type}: {data[:300]}")


async def ws_vs_http(session: Any, proxy_base: str, body: bytes, n: int, warm: int) -> dict[str, Any]:
    """`warm` then `n` rounds of one HTTP-streamed and one WebSocket turn each, alternating which goes first."""
    stream_body = orjson.dumps({**orjson.loads(body), "stream": True})
    frame = orjson.dumps({"type": "response.create", **orjson.loads(body)}).decode()
    url = proxy_base.rstrip("/") + "/responses"
    out: dict[str, list[float]] = {"http_stream": [], "websocket": []}
    async with session.ws_connect(url.replace("http://", "ws://"), headers=AUTH, max_msg_size=0) as ws:
        for i in range(warm + n):
            pair = [("http_stream", lambda: _http_turn(session, url, stream_body)),
                    ("websocket", lambda: _ws_turn(ws, frame))]
            for name, call in (pair if i % 2 == 0 else pair[::-1]):
                t = await call()
                if i >= warm:
                    out[name].append(t)
    res: dict[str, Any] = {k: summary(v) for k, v in out.items()}
    res["ratio_median"] = res["websocket"]["median"] / res["http_stream"]["median"]
    return res
