"""What accounting keeps in the store, under which keys, and how a session's summary is read back.

Counters per tenant, route, model and hour (`stats:{tenant}:{route}|{model}|{bucket}|{field}`) and per
session (`sessstat:{tenant}:{session}|{field}`), the session index (`sessions:{tenant}:{session}` =
its requests), and the per-session records and logs (timeline, inspector, texts). Written by
proxy/accounting/accountant.py, read by /ctx/v1/* (proxy/http/ctx_api.py, proxy/accounting/stats.py);
every figure derived from them is derived here, once (`derived`), so stats and sessions agree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson

from proxy.store import Store
from proxy.store.keys import session_key, tenant_key

HOUR = 3600
TIMELINE_MAX = 500  # requests kept per session timeline
INSPECT_MAX = 100  # requests per session whose inspector record is kept (the newest)
TEXTS_MAX = 5000  # distinct texts kept per session for the inspector (a status or placeholder is stored once)
RETENTION = 30 * 86_400  # seconds session timelines and summaries are kept
# Counters per tenant, route, model and hour; see README "What the figures mean". `measured_cached`: the
# cached tokens of the requests whose cacheable prefix the proxy measured (efficiency's numerator);
# `cacheable_billed`: that prefix in the provider's token units (efficiency's denominator).
FIELDS = ("requests", "errors", "prompt", "cached", "cache_write", "reported_prompt", "cacheable", "measured_cached",
          "cacheable_billed", "completion",
          "own_calls", "own_prompt", "own_cached", "own_completion", "client_tokens", "sent_tokens", "saved_offload",
          "saved_compress", "breaks", "offloads", "compactions", "read_rounds", "handles_given", "handles_read")
# The same counters per session (requests are counted in the session index).
SESSION_FIELDS = tuple(f for f in FIELDS if f not in ("requests", "reported_prompt"))
_SESSION_FIELD_SET = frozenset(SESSION_FIELDS)

SESSIONS_PREFIX = "sessions:"  # counters sessions:{tenant}:{session} = requests: the session index
SESSION_STATS_PREFIX = "sessstat:"  # counters sessstat:{tenant}:{session}|{field}


def session_record_key(tenant: str, session: str) -> str:
    return tenant_key(tenant, "session", session)


def timeline_key(tenant: str, session: str) -> str:
    return session_key(tenant, session, "timeline")


def inspect_key(tenant: str, session: str) -> str:
    return session_key(tenant, session, "inspect")


def texts_key(tenant: str, session: str) -> str:
    return session_key(tenant, session, "texts")


def stats_prefix(tenant: str) -> str:
    return f"stats:{tenant}:"


def derived(t: dict[str, Any]) -> dict[str, Any]:
    """Figures that follow from the counters, the same way everywhere (stats, sessions).

    `efficiency` is cached / cacheable with both in the provider's token units (`cacheable_billed`: the
    proxy's measure of the repeated prefix scaled by the provider's count of the prompt over the proxy's), so a
    session cached exactly as it could be reads 100%, not the few percent more the provider's tokenizer counts;
    counters from before that field compare with the proxy's own count. Never clamped: above 1 a prefix came
    from outside what the proxy compares.
    """
    saved = t.get("client_tokens", 0) - t.get("sent_tokens", 0)
    given, cacheable = t.get("handles_given", 0), t.get("cacheable_billed") or t.get("cacheable", 0)
    return {"saved_tokens": saved,
            "added_tokens": t.get("saved_offload", 0) + t.get("saved_compress", 0) - saved,
            "readback_rate": round(t.get("handles_read", 0) / given, 4) if given else None,
            "efficiency": round(t.get("measured_cached", 0) / cacheable, 4) if cacheable else None}


def add_counts(amounts: defaultdict[str, int | float], tenant: str, session: str | None, group: str, hour: int,
               values: dict[str, int | float], request: bool = True) -> None:
    """Fold one request's counter values into a batch: its route/model group (all-time and hourly) and,
    when it has one, its session (the index counts it as a request, unless `request` is False: one of the
    proxy's own calls, proxy/accounting/own_calls.py). A value of 0 adds nothing: most of a request's are."""
    nonzero = [(k, v) for k, v in values.items() if v]
    for prefix in (f"{group}|all|", f"{group}|h{hour}|"):
        for k, v in nonzero:
            amounts[prefix + k] += v
    if session is None:
        return
    sess = f"{tenant}:{session}"
    if request:
        amounts[f"{SESSIONS_PREFIX}{sess}"] += 1
    prefix = f"{SESSION_STATS_PREFIX}{sess}|"
    for k, v in nonzero:
        if k in _SESSION_FIELD_SET:
            amounts[prefix + k] += v


def group_of(tenant: str, route: str, model: str | None) -> str:
    """The counters' prefix for a tenant's route and model."""
    return f"{stats_prefix(tenant)}{route}|{model or ''}"


async def session_summaries(store: Store, pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """What /ctx/v1/sessions shows per session, assembled from counters and blind-written records
    (no read-modify-write, so concurrent requests of one session never lose an update)."""
    if not pairs:
        return []
    keys = [session_record_key(t, s) for t, s in pairs]
    metas = await store.get_many(keys)
    firsts = await store.get_many([k + ":first" for k in keys])
    breaks = await store.get_many([k + ":break" for k in keys])
    tenants = {t for t, _ in pairs}
    stats: dict[str, int | float] = {}
    for t in tenants:
        stats.update(await store.counters(f"{SESSION_STATS_PREFIX}{t}:"))
    requests: dict[str, int | float] = {}
    for t in tenants:
        requests.update(await store.counters(f"{SESSIONS_PREFIX}{t}:"))
    out = []
    for (t, s), meta, first, brk in zip(pairs, metas, firsts, breaks):
        if meta is None:
            continue
        row = orjson.loads(meta)
        base = f"{SESSION_STATS_PREFIX}{t}:{s}|"
        counts = {f: stats.get(base + f, 0) for f in SESSION_FIELDS}
        row.update(first=orjson.loads(first) if first else row.get("last"),
                   requests=requests.get(f"{SESSIONS_PREFIX}{t}:{s}", 0), **counts, **derived(counts),
                   last_break=orjson.loads(brk) if brk else None)
        out.append(row)
    return out
