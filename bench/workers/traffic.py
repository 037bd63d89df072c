"""The agents' traffic: each its own session, the same real history plus a new last message per request."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import orjson

from bench.scaling.config import MODEL
from bench.scaling.history import variant


class Agents:
    """`concurrency` agents sending the history of `messages` messages, over their own keep-alive connections."""

    def __init__(self, history: list[dict[str, Any]], tools: list[dict[str, Any]], concurrency: int) -> None:
        self.head, self.last, self.tools = history[:-1], history[-1], tools
        self.concurrency = concurrency
        self._variants = itertools.count()

    def body(self) -> bytes:
        b: dict[str, Any] = {"model": MODEL, "messages": [*self.head, variant(self.last, next(self._variants))]}
        if self.tools:
            b["tools"] = self.tools
        return orjson.dumps(b)

    async def batch(self, session: Any, url: str, key: str, count: int) -> float:
        """`count` requests to `url` by the agents together; the wall time in seconds. Any answer but 200 ends
        the run: a figure over failed requests would mean nothing."""
        remaining = count

        async def agent(i: int) -> None:
            nonlocal remaining
            headers = {"authorization": f"Bearer {key}", "content-type": "application/json",
                       "x-session-id": f"agent-{i}"}
            while remaining > 0:
                remaining -= 1
                async with session.post(url + "/v1/chat/completions", data=self.body(), headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise SystemExit(f"{url}: answered {r.status}: {(await r.text())[:300]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(i) for i in range(self.concurrency)))
        return time.perf_counter() - t0
