"""The client side: one keep-alive session per target, requests interleaved across targets, concurrent batches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.overhead.config import AUTH, MESSAGES_AUTH, MESSAGES_MAX_TOKENS, MESSAGES_MODEL, MODEL
from bench.overhead.cpu import CpuMeter, timed_section
from bench.overhead.stats import ms


def responses_body(messages: list[dict[str, Any]]) -> bytes:
    """The same small conversation as a Responses API request: the system text as instructions."""
    import orjson

    system = [m["content"] for m in messages if m["role"] == "system"]
    items = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
    body: dict[str, Any] = {"model": MODEL, "input": items, "store": False}
    if system:
        body["instructions"] = "\n".join(system)
    return orjson.dumps(body)


def messages_body(messages: list[dict[str, Any]]) -> bytes:
    """The same small conversation as an Anthropic Messages request: the system text as top-level `system`."""
    import orjson

    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
    body: dict[str, Any] = {"model": MESSAGES_MODEL, "max_tokens": MESSAGES_MAX_TOKENS, "messages": turns}
    if system:
        body["system"] = "\n".join(system)
    return orjson.dumps(body)


def chat_body(messages: list[dict[str, Any]], *, stream: bool = False,
              tools: list[dict[str, Any]] | None = None) -> bytes:
    """A chat completion request body (streamed with usage when `stream`)."""
    import orjson

    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if tools:
        body["tools"] = tools
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


class Target:
    """One endpoint (direct, ctxproxy, the floor or LiteLLM) with its own keep-alive session."""

    def __init__(self, name: str, base: str, session: Any) -> None:
        self.name = name
        self.url = base.rstrip("/") + "/chat/completions"
        self.responses_url = base.rstrip("/") + "/responses"
        self.messages_url = base.rstrip("/") + "/messages"
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
        return ms(t1 - t0)

    async def post_responses(self, body: bytes, scenario: str | None = None) -> float:
        """Whole non-streamed Responses API exchange, ms (request sent to body fully read)."""
        t0 = time.perf_counter_ns()
        async with self.session.post(self.responses_url, data=body, headers=AUTH) as r:
            data = await r.read()
            t1 = time.perf_counter_ns()
            if r.status != 200 or b'"object":"response"' not in data:
                raise RuntimeError(f"{self.name}: HTTP {r.status}: {data[:300]!r}")
            self._note(scenario, r.headers)
        return ms(t1 - t0)

    async def post_messages(self, body: bytes, scenario: str | None = None) -> float:
        """Whole non-streamed Messages API exchange (x-api-key, anthropic-version), ms."""
        t0 = time.perf_counter_ns()
        async with self.session.post(self.messages_url, data=body, headers=MESSAGES_AUTH) as r:
            data = await r.read()
            t1 = time.perf_counter_ns()
            if r.status != 200 or b'"type":"message"' not in data:
                raise RuntimeError(f"{self.name}: HTTP {r.status}: {data[:300]!r}")
            self._note(scenario, r.headers)
        return ms(t1 - t0)

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
        return ms(first - t0), ms(t1 - t0)


def _round_order(targets: list[Target], i: int) -> list[Target]:
    """Round `i`'s order: the targets rotated by i (two targets: alternating which goes first)."""
    k = i % len(targets)
    return targets[k:] + targets[:k]


async def interleaved(targets: list[Target], n: int, warm: int, max_s: float,
                      call: Callable[[Target, bool], Awaitable[Any]],
                      meter: CpuMeter) -> dict[str, list[Any]]:
    """`warm` unrecorded then up to `n` recorded rounds; each round one call per target
    (direct, proxy, floor[, litellm]), rotating which goes first. Stops early after `max_s` seconds."""
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


async def concurrent_batch(target: Target, body: bytes | Callable[[], bytes], count: int, workers: int,
                           scenario: str | None, max_s: float) -> tuple[float, list[float]]:
    """`count` requests by `workers` concurrent loops; (elapsed s, latencies ms). `body`: the same every time, or
    a function giving each request's."""
    remaining = count
    lat: list[float] = []
    deadline = time.monotonic() + max_s

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0 and time.monotonic() < deadline:
            remaining -= 1
            lat.append(await target.post(body if isinstance(body, bytes) else body(), scenario))

    t0 = time.perf_counter_ns()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return (time.perf_counter_ns() - t0) / 1e9, lat
