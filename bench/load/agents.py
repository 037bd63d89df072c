"""Phase 3's simulated agents: sessions of 8-40 turns with tools, tool results and streamed answers."""

from __future__ import annotations

import asyncio
import collections
import random
import time
from typing import Any

from bench.load.client import error_kind
from bench.load.config import AUTH, MODEL
from bench.load.traffic import AGENT_SYSTEM, STREAM_SHARE, TOOLS, TextPool, tool_result_size


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
    """What the agents did: latencies by kind, errors, sessions, tool results; recorded after the warm-up."""

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
    """One agent request (streamed or not); the assistant message it got back, or None on any error."""
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
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, IndexError) as e:
        stats.errors[error_kind(e)] += 1
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
    """One simulated agent: sessions of 8-40 turns until the deadline, each turn's tool calls answered."""
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
