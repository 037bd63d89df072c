"""Percentiles and summaries of latency samples (ms)."""

from __future__ import annotations

import statistics


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
