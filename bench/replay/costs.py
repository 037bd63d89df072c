"""What each setting costs beside the cheapest peer that loses no turn, and beside no proxy where none is needed.

A user comparing bills compares the proxy's defaults with the alternatives on
the same work: against the cheapest peer that answers every turn
(cliffcompaction, the reference of issue 27), and, on the trajectories that
fit the window without any proxy, against sending them straight (there the
proxy can only add: its status bar, its tool definition). On the trajectories
that do not fit, no-proxy's figure is not a bill for the same work (its
rejected turns bill nothing), so that part is compared with the previous
defaults instead (`ctxproxy-previous-defaults`).
"""

from __future__ import annotations

from typing import Any

from bench.replay.figures import available, pct, share
from bench.replay.settings import BASELINE

PEER = "cliffcompaction"
OURS = "ctxproxy"
PREVIOUS = "ctxproxy-previous-defaults"
PEER_RATIO_MAX = 1.00  # the defaults' cost at most this times the peer's (issue 27, item 2)
RETENTION_MIN = 0.97  # ... keeping at least this share of the identifiers
FIT_OVERHEAD_MAX = 0.03  # on trajectories that fit without a proxy: at most no-proxy's cost plus this share


def fitting_traces(results: list[dict[str, Any]]) -> list[str]:
    """The trajectories no-proxy served whole (no request rejected): empty when no-proxy did not run."""
    base = next((r for r in available(results) if r["setting"] == BASELINE), None)
    return [t["trace"] for t in base["traces"] if t["rejected"] == 0] if base else []


def _cost(res: dict[str, Any], traces: set[str]) -> float:
    return sum(t["cost_units"] for t in res["traces"] if t["trace"] in traces)


def _ratio(x: float, ref: float | None) -> str:
    return f"{x / ref:.3f}x" if ref else "-"


def cost_markdown(results: list[dict[str, Any]]) -> str:
    """Every setting side by side: rejections, hit rate, identifiers, cost, and cost against the peer, against
    no-proxy where it fits and against the previous defaults where it does not."""
    ok = available(results)
    by = {r["setting"]: r for r in ok}
    fit = set(fitting_traces(ok))
    rest = {t["trace"] for t in ok[0]["traces"]} - fit if ok else set()
    peer = by[PEER]["total"]["cost_units"] if PEER in by else None
    base_fit = _cost(by[BASELINE], fit) if BASELINE in by else None
    prev_rest = _cost(by[PREVIOUS], rest) if PREVIOUS in by else None
    lines = [f"cost side by side: {len(fit)} trajectories fit the window without a proxy, {len(rest)} do not",
             "",
             "| setting | rejected | hit rate | identifiers kept | cost units | vs cliffcompaction | "
             f"cost, the {len(fit)} that fit | vs no-proxy there | cost, the {len(rest)} that do not | "
             "vs previous defaults there |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in ok:
        t = r["total"]
        i = t["identifiers"]
        cf, cr = _cost(r, fit), _cost(r, rest)
        lines.append(f"| {r['setting']} | {t['rejected']} | {pct(t['hit_rate'])} | {share(i['kept'], i['total'])} | "
                     f"{t['cost_units']:,.0f} | {_ratio(t['cost_units'], peer)} | {cf:,.0f} | "
                     f"{_ratio(cf, base_fit)} | {cr:,.0f} | {_ratio(cr, prev_rest) if rest else '-'} |")
    return "\n".join(lines)


def cost_criteria(results: list[dict[str, Any]], window: int) -> list[dict[str, Any]]:
    """Issue 27's checks of the defaults, as written, each with the figures it rests on."""
    by = {r["setting"]: r for r in available(results)}
    if OURS not in by:
        return []
    ours = by[OURS]["total"]
    out = []
    fit = set(fitting_traces(list(by.values())))
    rest = {t["trace"] for t in by[OURS]["traces"]} - fit
    if PEER in by and (rest or BASELINE not in by):  # where everything fits, the peer is no proxy: the next check
        peer = by[PEER]["total"]
        i = ours["identifiers"]
        kept = i["kept"] / i["total"] if i["total"] else 1.0
        ratio = ours["cost_units"] / peer["cost_units"]
        out.append({"criterion": f"window {window:,}: cost at most {PEER_RATIO_MAX:.2f}x {PEER}'s, 0 rejected, "
                                 f">= {RETENTION_MIN:.0%} of identifiers kept",
                    "met": ratio <= PEER_RATIO_MAX and ours["rejected"] == 0 and kept >= RETENTION_MIN,
                    "figures": f"{ours['cost_units']:,.0f} vs {peer['cost_units']:,.0f} ({ratio:.3f}x); "
                               f"{ours['rejected']} rejected; identifiers {share(i['kept'], i['total'])}"})
    if BASELINE in by and fit:
        mine, base = _cost(by[OURS], fit), _cost(by[BASELINE], fit)
        out.append({"criterion": f"window {window:,}: on the {len(fit)} trajectories that fit without a proxy, "
                                 f"cost at most no-proxy's + {FIT_OVERHEAD_MAX:.0%}",
                    "met": mine <= base * (1 + FIT_OVERHEAD_MAX),
                    "figures": f"{mine:,.0f} vs {base:,.0f} ({mine / base:.3f}x)"})
    if PREVIOUS in by and rest and BASELINE in by:
        mine, prev = _cost(by[OURS], rest), _cost(by[PREVIOUS], rest)
        out.append({"criterion": f"window {window:,}: on the {len(rest)} that do not, cost at most the previous "
                                 "defaults'",
                    "met": mine <= prev,
                    "figures": f"{mine:,.0f} vs {prev:,.0f} ({mine / prev:.3f}x)"})
    for x in out:
        x["setting"] = OURS
    return out
