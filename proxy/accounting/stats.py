"""Figures for people: counters from the store summed over windows, per route and model, per session.

The store holds hourly and all-time counters per tenant, route and model
(written by proxy/accounting/accountant.py), so every replica's requests add up and the
figures survive restarts. Ratios are raw (proxy/accounting/counters.py `derived`): an efficiency
above 1 is shown as it is, never clamped.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from proxy.accounting.counters import FIELDS, HOUR, derived, stats_prefix
from proxy.config import Price
from proxy.store import Store

WINDOWS = {"last_hour": 2, "last_day": 25}  # hourly buckets summed: this hour and the ones before it
SERIES_HOURS = 48
CACHED_PRICE = 0.1  # a cached prompt token costs about a tenth of an uncached one


def _derived(t: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {k: t.get(k, 0) for k in FIELDS}
    prompt, cached = out["prompt"], out["cached"]
    out["hit_rate"] = round(cached / out["reported_prompt"], 4) if out["reported_prompt"] else None
    own_uncached = out["own_prompt"] - out["own_cached"]
    out["effective_cost"] = round(prompt - cached + CACHED_PRICE * cached + own_uncached
                                  + CACHED_PRICE * out["own_cached"], 1)
    out.update(derived(out))
    return out


def _parse(key: str, prefix: str) -> tuple[str, str, str, str, str] | None:
    """stats:{tenant}:{route}|{model}|{bucket}|{field} → (tenant, route, model, bucket, field)."""
    rest = key[len(prefix):] if key.startswith(prefix) else None
    if rest is None:
        return None
    tenant, _, rest = rest.partition(":") if prefix == "stats:" else (prefix[6:-1], "", rest)
    head, bucket, field = rest.rsplit("|", 2)
    route, _, model = head.partition("|")
    return tenant, route, model, bucket, field


_MILLION = 1_000_000


def dollars(t: Mapping[str, Any], price: Price) -> dict[str, float]:
    """A group's cost as its provider bills it (the agent's calls and the proxy's own), and what the proxy's
    savings would have cost at the uncached input price (an upper bound: some would have been cached)."""
    cached_price = price.input if price.cached_input is None else price.cached_input
    write_price = price.input if price.cache_write is None else price.cache_write
    prompt, cached, written = t["prompt"] + t["own_prompt"], t["cached"] + t["own_cached"], t["cache_write"]
    cost = ((prompt - cached - written) * price.input + cached * cached_price + written * write_price
            + (t["completion"] + t["own_completion"]) * price.output) / _MILLION
    return {"cost_usd": round(cost, 4), "saved_usd": round(max(t["saved_tokens"], 0) * price.input / _MILLION, 4)}


def _priced(rows: list[dict[str, Any]], name: str) -> dict[str, float | None]:
    """The dollars of the groups whose model has a price, summed; None where none has."""
    priced = [r[name] for r in rows if r[name].get("cost_usd") is not None]
    if not priced:
        return {"cost_usd": None, "saved_usd": None}
    return {k: round(sum(w[k] for w in priced), 4) for k in ("cost_usd", "saved_usd")}


async def stats(store: Store, tenant: str | None, now: float | None = None,
                prices: Mapping[str, Price] | None = None) -> dict[str, Any]:
    """`prices`: per model (config.yaml's models.<name>.price): its groups, and the totals, say dollars too."""
    now = time.time() if now is None else now
    hour = int(now // HOUR)
    prefix = stats_prefix(tenant) if tenant else "stats:"
    raw = await store.counters(prefix)
    groups: dict[tuple[str, str], dict[str, dict[str, float]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(float)))
    series: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, value in raw.items():
        parsed = _parse(key, prefix)
        if parsed is None:
            continue
        _, route, model, bucket, field = parsed
        g = groups[(route, model)]
        if bucket == "all":
            g["all"][field] += value
            continue
        h = int(bucket[1:])
        for name, span in WINDOWS.items():
            if hour - h < span:
                g[name][field] += value
        if hour - h < SERIES_HOURS:
            series[h][field] += value
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    rows = []
    for (route, model), windows in sorted(groups.items()):
        row: dict[str, Any] = {"route": route, "model": model}
        price = (prices or {}).get(model)
        for name in ("last_hour", "last_day", "all"):
            row[name] = _derived(windows.get(name, {}))
            row[name].update(dollars(row[name], price) if price else {"cost_usd": None, "saved_usd": None})
            for f, v in windows.get(name, {}).items():
                totals[name][f] += v
        rows.append(row)
    return {
        "generated_at": round(now, 3), "scope": "tenant" if tenant else "all",
        "totals": {name: {**_derived(totals.get(name, {})), **_priced(rows, name)}
                   for name in ("last_hour", "last_day", "all")},
        "groups": rows,
        "series": [{"hour": h * HOUR, **_derived(series[h])} for h in sorted(series)],
    }
