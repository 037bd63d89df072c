"""Issue 27's floor targets, read off one run: ctxproxy's added time over the floor's per API and body size,
and its throughput against the floor's at 16 concurrent clients.

Every figure is a ratio between targets interleaved in the same run, so machine noise hits both sides alike;
the milliseconds themselves do not carry over from one run (or machine) to the next.
"""

from __future__ import annotations

from typing import Any

from bench.overhead.config import CONCURRENCY, FLOOR

# (scenario, label, the most ctxproxy-added / floor-added may be at the median)
ADDED_TARGETS = [
    ("small", "small chat", 1.5),
    ("small_responses", "small Responses", 1.5),
    ("small_messages", "small Messages", 1.5),
    ("long", "150k-token body", 2.0),
    ("long_tools", "150k-token body + tools", 2.0),
]
# ctxproxy's requests/s at CONCURRENCY clients, at least this share of the floor's: small bodies, and 150k-token ones
# (the real shape of agent traffic, where the proxy parses and renders every body)
THROUGHPUT_TARGETS = [("c16_rps", "c16", f"{CONCURRENCY} clients, requests/s", 0.75),
                      ("c16_long_rps", "c16_long", f"{CONCURRENCY} clients x 150k tokens, req/s", 0.5)]


def floor_targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target that ran: the figure, the bound, and whether it is met (empty without the floor)."""
    sc = res["scenarios"]
    logged = res.get("proxy_log") or {}
    rows: list[dict[str, Any]] = []
    for key, label, bound in ADDED_TARGETS:
        s = sc.get(key) or {}
        if FLOOR not in s:
            continue
        d = s["direct"]["median"]
        fa, pa = s[FLOOR]["median"] - d, s["proxy"]["median"] - d
        ratio = pa / fa if fa > 0 else float("nan")
        rows.append({"scenario": key, "label": label, "figure": "ctxproxy-added / floor-added, median",
                     "floor_added_ms": fa, "proxy_added_ms": pa, "value": ratio, "bound": bound,
                     "degraded": (logged.get(key) or {}).get("degraded", 0),
                     "met": fa > 0 and ratio <= bound})
    for key, logged_as, label, bound in THROUGHPUT_TARGETS:
        rps = sc.get(key) or {}
        if FLOOR not in rps:
            continue
        ratio = rps["proxy"]["rps"] / rps[FLOOR]["rps"]
        rows.append({"scenario": key, "label": label, "figure": "ctxproxy / floor", "floor_rps": rps[FLOOR]["rps"],
                     "proxy_rps": rps["proxy"]["rps"], "value": ratio, "bound": bound, "met": ratio >= bound,
                     "degraded": (logged.get(logged_as) or {}).get("degraded", 0)})
    for row in rows:  # a proxy that forwarded requests unmodified did less than its work: no verdict of it
        row["met"] = row["met"] and not row["degraded"]
    return rows


def print_targets(rows: list[dict[str, Any]]) -> None:
    """The targets side by side, each with its figure from this run and met / NOT MET."""
    if not rows:
        return
    print()
    print("Floor targets (issue 27), this run: ctxproxy's added time / the floor's at the median (at most the bound),"
          f" and requests/s at {CONCURRENCY} clients against the floor's (at least the bound)")
    hdr = f"{'target':<30}{'floor':>12}{'ctxproxy':>12}{'ratio':>8}{'bound':>9}   verdict"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["scenario"].endswith("_rps"):
            floor, proxy, bound = f"{r['floor_rps']:.0f} rps", f"{r['proxy_rps']:.0f} rps", f">= {r['bound']:.2f}"
        else:
            floor, proxy = f"+{r['floor_added_ms']:.3f} ms", f"+{r['proxy_added_ms']:.3f} ms"
            bound = f"<= {r['bound']:.1f}"
        verdict = "met" if r["met"] else "NOT MET"
        if r.get("degraded"):
            verdict += f" ({r['degraded']} requests degraded)"
        print(f"{r['label']:<30}{floor:>12}{proxy:>12}{r['value']:>8.2f}{bound:>9}   {verdict}")
