"""The six scenarios, run in one sitting against every target, interleaved.

Targets: the mock itself ("direct"), ctxproxy ("proxy"), the bare pass-through
("floor") and, with ``--litellm``, LiteLLM. Each sequential scenario sends one
request per target per round, rotating which goes first; the concurrent one
runs alternating batches. Noise then hits every target alike.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import time
from collections.abc import Callable
from typing import Any

from bench.overhead.client import Target, chat_body, concurrent_batch, interleaved, messages_body, responses_body
from bench.overhead.config import (
    CONCURRENCY,
    DIRECT,
    FLOOR,
    FULL,
    LITELLM,
    LITELLM_START_TIMEOUT,
    MODEL,
    PROXY,
    QUICK,
    SMALL_MESSAGES,
)
from bench.overhead.cpu import CpuMeter, timed_section
from bench.overhead.processes import NotHealthy, Processes, wait_healthy
from bench.overhead.stats import summary
from bench.overhead.websocket import ws_vs_http


def long_bodies(count: int) -> tuple[list[bytes], list[bytes], dict[str, Any]]:
    """`count` request bodies: the same 199 messages of ~150k tokens plus a new last one;
    the same again with the agent's `tools` array (as agents send it), and the facts."""
    import orjson

    from bench.token_count import N_MESSAGES, TOOLS, build_conversation
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


def _session() -> Any:
    """A client session for one target: keep-alive connections, room for the concurrent scenario."""
    import aiohttp

    conn = aiohttp.TCPConnector(limit=2 * CONCURRENCY, limit_per_host=2 * CONCURRENCY,
                                keepalive_timeout=600, force_close=False)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120), auto_decompress=False,
                                 skip_auto_headers=("User-Agent",))


async def _probe(target: Target) -> None:
    """One plain and one streamed request end to end, before anything is measured."""
    await target.post(chat_body(SMALL_MESSAGES))
    await target.stream(chat_body(SMALL_MESSAGES, stream=True))


async def _start_litellm(args: argparse.Namespace, procs: Processes, session: Any,
                         result: dict[str, Any]) -> Target | None:
    """LiteLLM as a target, or None (with `result["litellm_unavailable"]` saying why) when it cannot run."""
    import aiohttp

    from bench import external_proxies as ext

    print(f"starting LiteLLM ({args.litellm_requirement}) ...", flush=True)
    try:
        url = procs.start_litellm(args.litellm_requirement)
    except ext.ExternalUnavailable as err:
        result["litellm_unavailable"] = {"stage": "install", "error": str(err)}
        return None
    assert procs.litellm is not None
    t0 = time.monotonic()
    try:
        await wait_healthy(session, url, procs.litellm, procs.litellm_log,
                           timeout=LITELLM_START_TIMEOUT, path="/health/liveliness", what="LiteLLM")
        target = Target(LITELLM, url + "/v1", session)
        await _probe(target)  # the pass-through works end to end
    except (TimeoutError, NotHealthy, RuntimeError, aiohttp.ClientError) as err:
        result["litellm_unavailable"] = {"stage": "start", "error": f"{type(err).__name__}: {err}"}
        return None
    procs.litellm_info["start_s"] = round(time.monotonic() - t0, 1)
    return target


async def _sequential(name: str, targets: list[Target], n: int, warm: int, max_s: float, call: Any,
                      procs: Processes, result: dict[str, Any]) -> dict[str, list[Any]]:
    """One interleaved sequential scenario; its CPU per request goes into the result."""
    meter = CpuMeter(procs)
    r = await interleaved(targets, n, warm, max_s, call, meter)
    result["cpu_ms_per_request"][name] = meter.per_request(r)
    return r


async def _concurrent(targets: list[Target], body: bytes | Callable[[], bytes], cfg: dict[str, int], max_s: float,
                      procs: Processes, result: dict[str, Any], name: str = "c16") -> None:
    """16 concurrent workers in alternating batches: D P F F P D ... (D P F L L F P D ... with LiteLLM;
    `c16_batches` counts the batches of two targets). `name`: c16 (small bodies) or c16_long (150k tokens)."""
    per_target = cfg["c16_batches"] // 2
    n_b = per_target * len(targets)
    per = cfg[name] // per_target
    print(f"[{'3' if name == 'c16' else '6'}/6] {CONCURRENCY} concurrent{' 150k-token bodies' * (name != 'c16')}: "
          f"{cfg[name]} requests each in {n_b} alternating batches of {per} ...", flush=True)
    for t in targets:
        await concurrent_batch(t, body, cfg[f"{name}_warm"], CONCURRENCY, None, max_s)
    elapsed = {t.name: 0.0 for t in targets}
    lat: dict[str, list[float]] = {t.name: [] for t in targets}
    batches: dict[str, list[float]] = {t.name: [] for t in targets}
    order = (targets + targets[::-1]) * n_b
    meter = CpuMeter(procs)
    for t in order[:n_b]:
        with timed_section(meter):
            s, batch_lat = await concurrent_batch(t, body, per, CONCURRENCY, name, max_s)
        elapsed[t.name] += s
        lat[t.name] += batch_lat
        batches[t.name].append(len(batch_lat) / s)
    result["scenarios"][f"{name}_latency"] = {k: summary(v) for k, v in lat.items()}
    result["cpu_ms_per_request"][name] = meter.per_request(lat)
    result["samples_ms"][f"{name}_latency"] = lat
    result["scenarios"][f"{name}_rps"] = {
        k: {"requests": len(lat[k]), "seconds": elapsed[k], "rps": len(lat[k]) / elapsed[k],
            "rps_per_batch": batches[k]} for k in lat}


async def run(args: argparse.Namespace, procs: Processes) -> dict[str, Any]:
    """Start every target, run the five scenarios; the figures (and every sample, under "samples_ms")."""
    cfg = QUICK if args.quick else FULL
    max_s = args.max_seconds
    result: dict[str, Any] = {"mode": "quick" if args.quick else "full", "counts": cfg,
                              "concurrency": CONCURRENCY, "scenarios": {}, "samples_ms": {},
                              "cpu_ms_per_request": {}}
    samples = result["samples_ms"]  # every recorded latency, in order, for the JSON file
    sc = result["scenarios"]

    print("building the long conversation ...", flush=True)
    n_long = cfg["long"] + cfg["long_warm"]
    bodies, bodies_tools, long_facts = long_bodies((4 if args.litellm else 3) * n_long)
    result["long_conversation"] = long_facts

    mock_url = procs.start_mock()
    proxy_url = procs.start_proxy()
    floor_url = procs.start_floor()
    async with contextlib.AsyncExitStack() as stack:
        s_direct, s_proxy, s_floor, s_litellm = [await stack.enter_async_context(_session()) for _ in range(4)]
        assert procs.proxy is not None and procs.floor is not None
        await wait_healthy(s_proxy, proxy_url, procs.proxy, procs.proxy_log)
        await wait_healthy(s_floor, floor_url, procs.floor, procs.floor_log, what="floor")
        proxy = Target(PROXY, proxy_url + "/v1", s_proxy)
        floor = Target(FLOOR, floor_url + "/v1", s_floor)
        await _probe(floor)
        targets = [Target(DIRECT, mock_url, s_direct), proxy, floor]
        litellm = await _start_litellm(args, procs, s_litellm, result) if args.litellm else None
        if litellm is not None:
            targets.append(litellm)
        if "litellm_unavailable" in result:
            u = result["litellm_unavailable"]
            print(f"LiteLLM not run ({u['stage']} failed), going on without it:\n{u['error']}", flush=True)
        result["targets"] = [t.name for t in targets]
        result["floor_command"] = " ".join(getattr(procs, "floor_cmd_run", []))
        result["litellm"] = {k: v for k, v in procs.litellm_info.items()}
        gc.collect()
        gc.freeze()  # the setup's objects are never rescanned

        # 1. small non-streaming, sequential
        small = chat_body(SMALL_MESSAGES)
        print(f"[1/6] small non-streaming: {cfg['small']} sequential requests each ...", flush=True)
        r = await _sequential("small", targets, cfg["small"], cfg["small_warm"], max_s,
                              lambda t, rec: t.post(small, "small" if rec else None), procs, result)
        sc["small"] = {k: summary(v) for k, v in r.items()}
        sc["small"]["bytes"] = len(small)
        samples["small"] = r

        # 1b. the same small conversation through the Responses API (direct, ctxproxy, the floor: LiteLLM is
        # configured as a chat pass-through only)
        rsmall = responses_body(SMALL_MESSAGES)
        rtargets = [t for t in targets if t.name != LITELLM]
        print(f"[1b/6] small Responses API: {cfg['small']} sequential requests each ...", flush=True)
        r = await _sequential("small_responses", rtargets, cfg["small"], cfg["small_warm"], max_s,
                              lambda t, rec: t.post_responses(rsmall, "small_responses" if rec else None), procs,
                              result)
        sc["small_responses"] = {k: summary(v) for k, v in r.items()}
        sc["small_responses"]["bytes"] = len(rsmall)
        samples["small_responses"] = r

        # 1d. the same Responses turn over the proxy's WebSocket against the same turn streamed over HTTP
        print(f"[1d/6] small Responses turn, WebSocket vs HTTP stream: {cfg['small']} rounds ...", flush=True)
        sc["small_responses_ws"] = await ws_vs_http(s_proxy, proxy_url + "/v1", rsmall, cfg["small"],
                                                    cfg["small_warm"])

        # 1c. and through the Anthropic Messages API (system as `system`, x-api-key), the same three targets
        msmall = messages_body(SMALL_MESSAGES)
        print(f"[1c/6] small Messages API: {cfg['small']} sequential requests each ...", flush=True)
        r = await _sequential("small_messages", rtargets, cfg["small"], cfg["small_warm"], max_s,
                              lambda t, rec: t.post_messages(msmall, "small_messages" if rec else None), procs,
                              result)
        sc["small_messages"] = {k: summary(v) for k, v in r.items()}
        sc["small_messages"]["bytes"] = len(msmall)
        samples["small_messages"] = r

        # 2. streaming
        sbody = chat_body(SMALL_MESSAGES, stream=True)
        print(f"[2/6] streaming: {cfg['stream']} sequential requests each ...", flush=True)
        r = await _sequential("stream", targets, cfg["stream"], cfg["stream_warm"], max_s,
                              lambda t, rec: t.stream(sbody, "stream" if rec else None), procs, result)
        sc["stream_first"] = {k: summary([x[0] for x in v]) for k, v in r.items()}
        sc["stream_last"] = {k: summary([x[1] for x in v]) for k, v in r.items()}
        samples["stream_first"] = {k: [x[0] for x in v] for k, v in r.items()}
        samples["stream_last"] = {k: [x[1] for x in v] for k, v in r.items()}

        # 3. 16 concurrent, alternating batches
        await _concurrent(targets, small, cfg, max_s, procs, result)

        # 4. long conversation, new last message each request
        print(f"[4/6] long conversation ({long_facts['messages']} messages, "
              f"{long_facts['tokens']:,} tokens, {long_facts['bytes']:,} bytes): "
              f"{cfg['long']} sequential requests each ...", flush=True)
        it = iter(bodies)
        r = await _sequential("long", targets, cfg["long"], cfg["long_warm"], max_s,
                              lambda t, rec: t.post(next(it), "long" if rec else None), procs, result)
        sc["long"] = {k: summary(v) for k, v in r.items()}
        samples["long"] = r

        # 4b. the same with a `tools` array, as agents send it
        print(f"[5/6] the same with a tools array: {cfg['long']} sequential requests each ...", flush=True)
        it = iter(bodies_tools)
        r = await _sequential("long_tools", targets, cfg["long"], cfg["long_warm"], max_s,
                              lambda t, rec: t.post(next(it), "long_tools" if rec else None), procs, result)
        sc["long_tools"] = {k: summary(v) for k, v in r.items()}
        samples["long_tools"] = r

        # 6. 16 clients sending 150k-token bodies, as agents do (each a new last message: the proxy parses,
        # rewrites and renders every body)
        cycle = itertools.cycle(bodies_tools)
        await _concurrent(targets, lambda: next(cycle), cfg, max_s, procs, result, "c16_long")
        gc.unfreeze()
        result["_request_ids"] = proxy.request_ids
    return result
