"""One trajectory through one setting, turn by turn: the per-request rows and their sums."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx

from bench import external_proxies as ext
from bench import fake_llm
from bench import identifiers as idents
from bench.replay.apis import CHAT, AnyTrace, Api, billed, cache_written
from bench.replay.checks import RewriteCheck, digest, tool_pairing_problems
from bench.replay.compaction import chunks_common, diagnose_lost, identifier_listing, is_status, summary_stats
from bench.replay.settings import Setting
from bench.replay.traces import encode_body
from tests import mock_upstream as mu

CACHED_PRICE = 0.1  # a cached input token costs this share of an uncached one
BREAK_TOKENS = 1024  # a request that re-bills more than this much of the previous prompt broke the cached prefix
# Anthropic's context-window errors (invalid_request_error, no code), counted as context_length_exceeded
_ANTHROPIC_WINDOW = re.compile(r"^(prompt is too long: |input length and `max_tokens` exceed context limit: )")


def _error_code(content: bytes) -> str | None:
    """The `error.code` (or `error.type`) of an OpenAI- or Anthropic-shaped error body; Anthropic's window
    errors as "context_length_exceeded"."""
    try:
        err = json.loads(content).get("error") or {}
        if _ANTHROPIC_WINDOW.match(str(err.get("message") or "")):
            return "context_length_exceeded"
        return err.get("code") or err.get("type")
    except (ValueError, AttributeError):
        return None


def replay_trace(client: httpx.Client, base: str, setting: Setting, trace: AnyTrace,
                 mock: mu.MockUpstream, final_turn: bool = False, window: int = mu.DEFAULT_WINDOW,
                 proxy_history: Any = None, api: Api = CHAT) -> dict[str, Any]:
    """All turns of one trajectory, sequentially, in `api`; the per-trajectory row plus per-request rows.

    The provider's requests of each turn are split into the agent's (what the
    client asked, as forwarded: possibly rejected and retried) and the proxy's
    own calls (summaries, notes: `fake_llm.kind`). Token figures count both;
    the `proxy_*` fields count the proxy's own calls alone. The checks read
    every request as chat messages (`api.view`), so they are the same for both APIs.
    """
    headers = {**api.headers(f"sk-replay-{setting.name}-{trace.id}"), "content-type": "application/json"}
    if setting.external and ext.EXTERNALS[setting.external].session_header:
        headers[ext.EXTERNALS[setting.external].session_header] = f"replay-{setting.name}-{trace.id}"
    check = RewriteCheck(setting.offload_thresholds()) if setting.proxied else None
    requests: list[dict[str, Any]] = []
    pairing: list[dict[str, Any]] = []
    strict_bad = 0  # requests breaking OpenAI's stricter rule (results right after their calls)
    t_client = 0.0
    turns = trace.turns(final_turn)
    compacted_views = 0  # ctxproxy requests whose messages no longer line up with the client's (not position-checked)
    summaries: list[dict[str, Any]] = []  # each distinct compacted-history message, when it first appears
    seen_summaries: set[str] = set()
    prev_chunks: list[tuple[int, ...]] | None = None
    last_served: dict[str, Any] | None = None
    mock.requests.clear()  # sequential: nothing in flight; keeps memory to one trajectory's bodies
    mock.cache.clear()  # one trajectory at a time (keyless proxies share one cache scope; a no-op for the others)
    for i in turns:
        body = api.body(trace, i, setting, window)
        client_view = api.view(body)
        raw = encode_body(body)
        before = len(mock.requests)
        t0 = time.perf_counter()
        resp = client.post(base + api.path, content=raw, headers=headers)
        dt = time.perf_counter() - t0
        t_client += dt
        sent = mock.requests[before:]
        row: dict[str, Any] = {"turn": i, "status": resp.status_code, "ms": round(dt * 1000, 2),
                               "upstream_requests": len(sent), "prompt_tokens": 0, "cached_tokens": 0,
                               "body_bytes": len(raw), "proxy_calls": 0, "proxy_prompt_tokens": 0,
                               "proxy_cached_tokens": 0, "proxy_completion_tokens": 0, "provider_rejections": 0,
                               "client_messages": len(client_view), "cache_written_tokens": 0}
        if resp.status_code != 200:
            row["error"] = _error_code(resp.content)
        _read_proxy_headers(row, resp.headers)
        agent, strict = _bill(row, sent, i, pairing, api)
        strict_bad += strict
        served = next((rec for rec in reversed(agent) if rec.status == 200 and isinstance(rec.json, dict)), None)
        if not sent and resp.status_code == 200:
            row["error"] = "no upstream request recorded"
        if served is not None:
            up = served.json
            up_view = api.view(up)
            row["upstream_messages"] = len(up_view)
            if check is not None:
                # the status bar (proxy 23f7ccd and later) adds `<agent_status>` user messages: set them aside
                aligned = [m for m in up_view if not is_status(m)]
                if len(aligned) == len(client_view):
                    check.check(i, client_view, {"messages": aligned, "tools": up.get("tools")})
                else:
                    compacted_views += 1
            chunks = api.chunks(up)
            if prev_chunks is not None:
                lost = sum(len(c) for c in prev_chunks) - chunks_common(prev_chunks, chunks)
                row["prefix_lost_tokens"] = lost
                if lost > BREAK_TOKENS:
                    row["cache_break"] = True
            prev_chunks = chunks
            last_served = {"messages": up_view}
            st = summary_stats(up_view)
            if st is not None:
                key = digest(up_view[st["position"]])
                if key not in seen_summaries:
                    seen_summaries.add(key)
                    st.update(turn=i, uncached_tokens=row["prompt_tokens"] - row["cached_tokens"],
                              proxy_prompt_tokens=row["proxy_prompt_tokens"])
                    summaries.append(st)
        agent_last = agent[-1] if agent else None
        if agent_last is not None and agent_last.status != 200 and isinstance(agent_last.json, dict):
            # what the provider was asked to read, even though it refused
            row["attempted_prompt_tokens"] = sum(len(c) for c in api.chunks(agent_last.json))
        requests.append(row)
    mock.requests.clear()
    out = aggregate(requests)
    out.update(trace=trace.id, name=trace.name, client_s=round(t_client, 3),
               client_pairing_problems=sum(1 for i in turns if tool_pairing_problems(trace.view(i))),
               pairing_problems=len(pairing), pairing_problems_strict=strict_bad, pairing_examples=pairing[:3])
    raw_last = trace.view(turns[-1]) if turns else []
    ret = idents.retention(raw_last, (last_served or {}).get("messages"))
    if proxy_history is not None and ret["lost"] and last_served is not None:
        ret["diagnosis"] = diagnose_lost(ret["lost"], raw_last, last_served["messages"], proxy_history)
    del ret["lost"]
    if last_served is not None:
        listing = identifier_listing(last_served.get("messages") or [])
        listed = [x for x in listing.rsplit("\n</context_summary>", 1)[0].splitlines() if x.strip()]
        if listed:  # ctxproxy's code-written list in the last request, and how much of it is an identifier by our rules
            ret["last_list"] = {"entries": len(listed),
                                "not_identifiers_by_bench_rules": [x for x in listed if x not in idents.extract(x)]}
    out["identifiers"] = ret
    out["summaries"] = summaries
    if check is not None:
        out["rewrites"] = check.summary()
        out["rewrites"]["over_threshold_not_offloaded"] = check.missed(raw_last, len(raw_last))
        out["rewrites"]["compacted_views"] = compacted_views
    out["rows"] = requests
    return out


def _read_proxy_headers(row: dict[str, Any], headers: httpx.Headers) -> None:
    """What ctxproxy said about the request in its x-ctxproxy-* response headers, into the request's row."""
    if "x-ctxproxy-offloaded" in headers:
        row["offloaded"] = int(headers["x-ctxproxy-offloaded"])
        row["tokens_saved"] = int(headers.get("x-ctxproxy-tokens-saved", 0))
    if "x-ctxproxy-compacted" in headers:
        row["compacted"] = headers["x-ctxproxy-compacted"]
        row["tokens_before"] = int(headers.get("x-ctxproxy-tokens-before", 0))
        row["tokens_after"] = int(headers.get("x-ctxproxy-tokens-after", 0))
    if "x-ctxproxy-compaction" in headers:
        row["compaction_version"] = int(headers["x-ctxproxy-compaction"])
    if "x-ctxproxy-cache-break" in headers:  # the proxy's own account of a break (since 71dd356)
        row["proxy_break_cause"] = headers["x-ctxproxy-cache-break"]
    if "x-ctxproxy-status-bar" in headers:
        row["status_bar"] = True
    if "x-ctxproxy-summary-rejected" in headers:
        row["summary_rejected"] = headers["x-ctxproxy-summary-rejected"]
    if row.get("error") and "x-ctxproxy-request-id" in headers:  # to find what the proxy logged about it
        row["proxy_request_id"] = headers["x-ctxproxy-request-id"]
    if "x-ctxproxy-window-learned" in headers:
        row["window_learned"] = int(headers["x-ctxproxy-window-learned"])


def _bill(row: dict[str, Any], sent: list[Any], turn: int, pairing: list[dict[str, Any]],
          api: Api = CHAT) -> tuple[list[Any], int]:
    """Add what the provider billed for one turn's requests to its row, and check their tool-call pairing.

    Returns the agent's requests (the proxy's own calls set aside) and how many of all the requests break
    OpenAI's stricter pairing rule; pairing problems are appended to `pairing`.
    """
    agent = []
    strict_bad = 0
    for rec in sent:
        own = fake_llm.kind(rec.json)
        if rec.status != 200:
            row["provider_rejections"] += 1
        prompt, cached, completion = billed(rec.usage) if rec.status == 200 and rec.usage else (0, 0, 0)
        row["prompt_tokens"] += prompt
        row["cached_tokens"] += cached
        row["cache_written_tokens"] += cache_written(rec.usage) if rec.status == 200 and rec.usage else 0
        if own is not None:
            row["proxy_calls"] += 1
            row.setdefault("proxy_call_kinds", []).append(own if rec.status == 200 else f"{own}:{rec.status}")
            row["proxy_prompt_tokens"] += prompt
            row["proxy_cached_tokens"] += cached
            row["proxy_completion_tokens"] += completion
        else:
            agent.append(rec)
        if isinstance(rec.json, dict):
            msgs = api.view(rec.json)
            problems = tool_pairing_problems(msgs)
            if problems:
                pairing.append({"turn": turn, "problems": problems[:3], "count": len(problems),
                                "proxy_call": own})
            if problems or tool_pairing_problems(msgs, strict=True):
                strict_bad += 1
    return agent, strict_bad


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums over request rows (one trajectory's, or a whole setting's): tokens, hit rates, cost, breaks."""
    prompt = sum(r["prompt_tokens"] for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    pp = sum(r.get("proxy_prompt_tokens", 0) for r in rows)
    pc = sum(r.get("proxy_cached_tokens", 0) for r in rows)
    return {
        "requests": len(rows),
        "upstream_requests": sum(r["upstream_requests"] for r in rows),
        "ok": sum(1 for r in rows if r["status"] == 200),
        "rejected": sum(1 for r in rows if r["status"] != 200),
        "context_length_exceeded": sum(1 for r in rows if r.get("error") == "context_length_exceeded"),
        "provider_rejections": sum(r.get("provider_rejections", 0) for r in rows),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": round(cached / prompt, 5) if prompt else None,
        "cost_units": round(prompt - cached + CACHED_PRICE * cached, 1),
        "cache_written_tokens": sum(r.get("cache_written_tokens", 0) for r in rows),  # billed apart (Anthropic)
        "proxy_calls": sum(r.get("proxy_calls", 0) for r in rows),
        "proxy_prompt_tokens": pp,
        "proxy_cached_tokens": pc,
        "proxy_completion_tokens": sum(r.get("proxy_completion_tokens", 0) for r in rows),
        "proxy_cost_units": round(pp - pc + CACHED_PRICE * pc, 1),
        "agent_hit_rate": round((cached - pc) / (prompt - pp), 5) if prompt - pp else None,
        "cache_breaks": sum(1 for r in rows if r.get("cache_break")),
        "prefix_lost_tokens": sum(r.get("prefix_lost_tokens", 0) for r in rows),
        "compactions": sum(1 for r in rows if r.get("compacted")),
        "compactions_by_layer": {k: sum(1 for r in rows if r.get("compacted") == k)
                                 for k in sorted({r["compacted"] for r in rows if r.get("compacted")})},
        "offloaded_requests": sum(1 for r in rows if r.get("offloaded")),
        "tokens_saved_header": sum(r.get("tokens_saved", 0) for r in rows),
    }
