"""Percentiles and summaries of latency samples (ms), and the added time over direct read off them."""

from __future__ import annotations

import statistics
from typing import Any

from bench.overhead.config import FLOOR


def ms(ns: int) -> float:
    """Nanoseconds as milliseconds."""
    return ns / 1e6


def percentile(xs: list[float], q: float) -> float:
    """Nearest rank: with few samples the p99 is close to the slowest one."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def p99(xs: list[float]) -> float:
    """The nearest-rank 99th percentile."""
    return percentile(xs, 0.99)


def summary(xs: list[float]) -> dict[str, float]:
    """Count, median, p90, p99, mean, min and max of one target's samples in one scenario."""
    return {"n": len(xs), "median": statistics.median(xs), "p90": percentile(xs, 0.90), "p99": p99(xs),
            "mean": statistics.fmean(xs), "min": min(xs), "max": max(xs)}


def added_ratio(proxy_added: float, floor_added: float) -> str:
    """ctxproxy's added time over the floor's, or "n/a" when the floor added nothing measurable."""
    return f"{proxy_added / floor_added:.2f}" if floor_added > 0 else "n/a"


def floor_added(res: dict[str, Any], key: str = "small") -> dict[str, float] | None:
    """For one scenario: the floor's and ctxproxy's added latency over direct at the median and p90, and the
    ratios ctxproxy-added / floor-added (None when the floor did not run)."""
    s = res["scenarios"].get(key) or {}
    if FLOOR not in s:
        return None
    d, p, f = s["direct"], s["proxy"], s[FLOOR]
    out = {"floor_added_median": f["median"] - d["median"], "floor_added_p90": f["p90"] - d["p90"],
           "proxy_added_median": p["median"] - d["median"], "proxy_added_p90": p["p90"] - d["p90"]}
    for q in ("median", "p90"):
        fa = out[f"floor_added_{q}"]
        out[f"ratio_{q}"] = out[f"proxy_added_{q}"] / fa if fa > 0 else float("nan")
    return out
