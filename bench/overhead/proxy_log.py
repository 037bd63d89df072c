"""ctxproxy's own per-request timings, from its JSON log, joined on the request ids the client saw."""

from __future__ import annotations

import json
import statistics
from typing import Any

from bench.overhead.stats import p99


def proxy_log_breakdown(log_path: str, ids: dict[str, list[str]]) -> dict[str, Any]:
    """Median/p99 of the proxy's own per-request timings, per scenario (joined on request id)."""
    by_id: dict[str, dict[str, Any]] = {}
    other = 0
    with open(log_path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                other += 1
                continue
            if rec.get("msg") == "request" and "request_id" in rec:
                by_id[rec["request_id"]] = rec
            elif rec.get("level") in ("warning", "error", "critical"):
                other += 1
    out: dict[str, Any] = {"non_request_warnings_or_unparsed_lines": other}
    for scenario, rids in ids.items():
        recs = [by_id[r] for r in rids if r in by_id]
        # a request forwarded unmodified (the store timed out, a transform failed) skipped the proxy's work:
        # a scenario with any is not a measure of it (bench/overhead/targets.py says so in its verdict)
        entry: dict[str, Any] = {"matched": len(recs), "of": len(rids),
                                 "degraded": sum("degraded" in (r.get("events") or ()) for r in recs)}
        for field in ("overhead_ms", "upstream_headers_ms", "ttfb_ms", "total_ms"):
            xs = [float(r[field]) for r in recs if field in r]
            if xs:
                entry[field] = {"median": statistics.median(xs), "p99": p99(xs)}
        out[scenario] = entry
    return out
