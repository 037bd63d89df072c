"""The replay's checks of a whole run: ratios against no-proxy, the offload and the compression checks.

Each check is evaluated as written and carries the figures it rests on, so a
reader can see why it is met or not.
"""

from __future__ import annotations

from typing import Any

from bench.replay.apis import CHAT, AnyTrace, Api
from bench.replay.figures import available, ids_over, pct, share
from bench.replay.settings import BASELINE


def compare(results: list[dict[str, Any]]) -> None:
    """Add ratios against the baseline: over all requests, and over turns that succeeded in both."""
    base = next((r for r in results if r["setting"] == BASELINE), None)
    if base is None:
        return
    base_rows = {(t["trace"], q["turn"]): q for t in base["traces"] for q in t["rows"]}
    for res in results:
        tot = res["total"]
        b = base["total"]
        tot["prompt_ratio"] = round(tot["prompt_tokens"] / b["prompt_tokens"], 4) if b["prompt_tokens"] else None
        tot["cost_ratio"] = round(tot["cost_units"] / b["cost_units"], 4) if b["cost_units"] else None
        both = [(q, base_rows[(t["trace"], q["turn"])]) for t in res["traces"] for q in t["rows"]
                if q["status"] == 200 and base_rows.get((t["trace"], q["turn"]), {}).get("status") == 200]
        p = sum(q["prompt_tokens"] for q, _ in both)
        c = sum(q["cached_tokens"] for q, _ in both)
        bp = sum(x["prompt_tokens"] for _, x in both)
        bc = sum(x["cached_tokens"] for _, x in both)
        saved = sum(q.get("tokens_saved", 0) for q, _ in both)
        tot["common"] = {"requests": len(both), "prompt_tokens": p, "cached_tokens": c,
                         "tokens_saved_header": saved, "tokens_saved_measured": bp - p,
                         "hit_rate": round(c / p, 5) if p else None,
                         "baseline_prompt_tokens": bp, "baseline_cached_tokens": bc,
                         "baseline_hit_rate": round(bc / bp, 5) if bp else None,
                         "prompt_ratio": round(p / bp, 4) if bp else None}
        tot["hit_rate_delta_points"] = (round((tot["hit_rate"] - b["hit_rate"]) * 100, 3)
                                        if tot["hit_rate"] is not None and b["hit_rate"] is not None else None)
        for t in res["traces"]:
            bt = next((x for x in base["traces"] if x["trace"] == t["trace"]), None)
            if bt and bt["prompt_tokens"]:
                t["prompt_ratio"] = round(t["prompt_tokens"] / bt["prompt_tokens"], 4)


def _hit_note(delta: float | None, limit: float) -> str:
    if delta is not None and abs(delta) > limit and delta > 0:
        return (f" (fails only upward: the proxy's hit rate is {delta:.2f} points higher, "
                f"i.e. it is not lower by more than {limit} points)")
    return ""


def offload_criteria(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The offload checks (default thresholds and tool_result_tokens 1000 against no-proxy), evaluated as
    written (|difference|); each with the figures it rests on."""
    by = {r["setting"]: r["total"] for r in results}
    out = []
    b = by.get(BASELINE)
    if b is None:
        return out
    if "ctxproxy-default" in by:
        d = by["ctxproxy-default"]
        delta = d["hit_rate_delta_points"]
        out.append({"criterion": "default thresholds: hit rate within 0.5 points of no-proxy",
                    "met": delta is not None and abs(delta) <= 0.5,
                    "figures": f"{pct(d['hit_rate'])} vs {pct(b['hit_rate'])} ({delta:+.2f} points); "
                               f"over turns both served: {pct(d['common']['hit_rate'])} vs "
                               f"{pct(d['common']['baseline_hit_rate'])}" + _hit_note(delta, 0.5),
                    "met_one_sided": delta is not None and delta >= -0.5})
        out.append({"criterion": "default thresholds: no request fails",
                    "met": d["rejected"] == 0,
                    "figures": f"{d['rejected']} rejected ({d['context_length_exceeded']} context_length_exceeded); "
                               f"no-proxy: {b['rejected']} rejected ({b['context_length_exceeded']} "
                               f"context_length_exceeded)"})
    if "ctxproxy-offload-1000" in by:
        o = by["ctxproxy-offload-1000"]
        delta = o["hit_rate_delta_points"]
        out.append({"criterion": "tool_result_tokens 1000: prompt tokens <= 85% of no-proxy's",
                    "met": o["prompt_ratio"] is not None and o["prompt_ratio"] <= 0.85,
                    "figures": f"{o['prompt_tokens']:,} / {b['prompt_tokens']:,} = {pct(o['prompt_ratio'])} "
                               f"(over turns both served: {pct(o['common']['prompt_ratio'])})"})
        out.append({"criterion": "tool_result_tokens 1000: hit rate within 2 points of no-proxy",
                    "met": delta is not None and abs(delta) <= 2.0,
                    "figures": f"{pct(o['hit_rate'])} vs {pct(b['hit_rate'])} ({delta:+.2f} points); "
                               f"over turns both served: {pct(o['common']['hit_rate'])} vs "
                               f"{pct(o['common']['baseline_hit_rate'])}" + _hit_note(delta, 2.0),
                    "met_one_sided": delta is not None and delta >= -2.0})
    return out


def over_trigger_traces(traces: list[AnyTrace], window: int, final_turn: bool, share: float = 0.85,
                        api: Api = CHAT) -> list[str]:
    """Trajectories whose largest request (the mock's count, as the client sends it in `api`) passes share x
    window."""
    out = []
    for t in traces:
        turns = t.turns(final_turn)
        if turns and max(sum(len(c) for c in api.chunks(api.body(t, i))) for i in turns) > share * window:
            out.append(t.id)
    return out


def compression_criteria(results: list[dict[str, Any]], window: int, subset: list[str]) -> list[dict[str, Any]]:
    """The compression checks for the `ctxproxy` settings (with and without the status bar), as written, each
    with the figures it rests on."""
    out = []
    for name in ("ctxproxy", "ctxproxy-no-status-bar"):
        out += _criteria_for(results, name, window, subset)
    return out


def _criteria_for(results: list[dict[str, Any]], name: str, window: int, subset: list[str]) -> list[dict[str, Any]]:
    ok = {r["setting"]: r for r in available(results)}
    if name not in ok:
        return []
    c = ok[name]["total"]
    out = [
        {"criterion": f"window {window:,}: no request rejected for length",
         "met": c["context_length_exceeded"] == 0,
         "figures": f"{c['context_length_exceeded']} context_length_exceeded, {c['rejected']} rejected of "
                    f"{c['requests']} (provider-side 400s, retried by the proxy: {c['provider_rejections']})"},
        {"criterion": "provider hit rate > 90% (all provider requests, the proxy's own calls included)",
         "met": c["hit_rate"] is not None and c["hit_rate"] > 0.90,
         "figures": f"{pct(c['hit_rate'])} ({c['cached_tokens']:,} / {c['prompt_tokens']:,}); agent requests "
                    f"alone {pct(c['agent_hit_rate'])}"},
    ]
    i = c["identifiers"]
    o = ids_over(ok[name], subset)
    out.append({"criterion": ">= 95% identifier retention (all trajectories pooled)",
                "met": i["total"] > 0 and i["kept"] / i["total"] >= 0.95,
                "figures": f"{share(i['kept'], i['total'])}; first named after the head: "
                           f"{share(i['after_head_kept'], i['after_head'])}"})
    out.append({"criterion": ">= 95% identifier retention, trajectories that pass the trigger "
                             f"({len(subset)}: {', '.join(subset) or '-'})",
                "met": (o["kept"] / o["total"] >= 0.95) if o["total"] else None,
                "figures": f"{share(o['kept'], o['total'])}; first named after the head: "
                           f"{share(o['after_head_kept'], o['after_head'])}"})
    for other in ("sliding-window-20", "cliffcompaction"):
        if other in ok:
            t = ok[other]["total"]
            out.append({"criterion": f"effective input cost lower than {other}'s",
                        "met": c["cost_units"] < t["cost_units"],
                        "figures": f"{c['cost_units']:,.0f} vs {t['cost_units']:,.0f} "
                                   f"({c['cost_units'] / t['cost_units'] * 100:.1f}%); {other}: hit rate "
                                   f"{pct(t['hit_rate'])}, identifiers "
                                   f"{share(t['identifiers']['kept'], t['identifiers']['total'])}"})
        else:
            out.append({"criterion": f"effective input cost lower than {other}'s", "met": None,
                        "figures": f"{other} not run"})
    for x in out:
        x["setting"] = name
    return out
