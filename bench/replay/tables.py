"""The replay's markdown tables, from the results of ``run.replay_setting``."""

from __future__ import annotations

from typing import Any

from bench.replay.figures import available, ids_over, pct, share
from bench.replay.settings import STATUS_BAR_SETTINGS
from bench.replay.turns import BREAK_TOKENS


def markdown(results: list[dict[str, Any]], criteria: list[dict[str, Any]]) -> str:
    """The offload table: each setting's totals against no-proxy, the per-request checks, the offload checks."""
    lines = ["| setting | requests | rejected (ctx exceeded) | prompt tokens | cached tokens | hit rate | "
             "cost units | prompt vs no-proxy | prompt vs no-proxy, turns both served | wall s | proxy CPU s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["total"]
        common = t.get("common") or {}
        lines.append(f"| {r['setting']} | {t['requests']} | {t['rejected']} ({t['context_length_exceeded']}) | "
                     f"{t['prompt_tokens']:,} | {t['cached_tokens']:,} | {pct(t['hit_rate'])} | "
                     f"{t['cost_units']:,.0f} | {pct(t.get('prompt_ratio'))} | {pct(common.get('prompt_ratio'))} | "
                     f"{t['wall_s']:.1f} | "
                     f"{r['proxy'].get('cpu_s') if r['proxy'].get('cpu_s') is not None else '-'} |")
    lines += ["", "| setting | tool pairing: bad requests, strict (client's own) | rewritten msgs | "
              "preview not smaller | max preview share | unstable rewrites | altered w/o placeholder | "
              "placeholder w/o read tool | over threshold, not offloaded | proxy overhead ms (sum / max) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        t = r["total"]
        w = t.get("rewrites")
        p = r["proxy"]
        if w is None:
            lines.append(f"| {r['setting']} | {t['pairing_problems']}, {t['pairing_problems_strict']} "
                         f"({t['client_pairing_problems']}) | - | - | - | - | - | - | - | - |")
            continue
        max_share = "-" if w["max_preview_share"] is None else f"{w['max_preview_share']:.3f}"
        lines.append(f"| {r['setting']} | {t['pairing_problems']}, {t['pairing_problems_strict']} "
                     f"({t['client_pairing_problems']}) | "
                     f"{w['rewritten_messages']} | {w['preview_not_smaller']} | {max_share} | "
                     f"{w['unstable_rewrites']} | {w['altered_without_placeholder']} | "
                     f"{w['placeholder_without_read_tool']} | {w['over_threshold_not_offloaded']} | "
                     f"{p.get('overhead_ms', '-')} / {p.get('max_overhead_ms', '-')} |")
    if criteria:
        lines += ["", "| offload check | met | figures |", "|---|---|---|"]
        lines += [f"| {c['criterion']} | {'yes' if c['met'] else '**no**'} | {c['figures']} |" for c in criteria]
    return "\n".join(lines)


def per_trace_markdown(results: list[dict[str, Any]]) -> str:
    """Prompt tokens, hit rate and rejections per trajectory and setting."""
    names = [r["setting"] for r in results]
    head = "| trace | turns | " + " | ".join(f"{n}: prompt / hit / rej" for n in names) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(names)]
    traces = [t["trace"] for t in results[0]["traces"]]
    for k, tid in enumerate(traces):
        cells = []
        for r in results:
            t = r["traces"][k]
            cells.append(f"{t['prompt_tokens']:,} / {pct(t['hit_rate'])} / {t['rejected']}")
        lines.append(f"| {tid} | {results[0]['traces'][k]['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compress_markdown(results: list[dict[str, Any]], subset: list[str]) -> str:
    """The compression table: every setting side by side, cost against sliding-window-20, identifiers kept."""
    ok = available(results)
    by = {r["setting"]: r["total"] for r in ok}
    ref = by.get("sliding-window-20")
    lines = ["| setting | requests | rejected (ctx exceeded) | provider 400s | prompt tokens | cached tokens | "
             "hit rate (agent only) | cost units | cost vs sliding-window-20 | "
             "proxy's own calls: n / prompt tok / cost units | identifiers kept: all / after head | "
             "same, trajectories over trigger | pairing: bad requests, strict | cache breaks | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "total" not in r:
            lines.append(f"| {r['setting']} | not run: {r['unavailable']['stage']} failed (see below) |"
                         + " |" * 13)
            continue
        t = r["total"]
        i = t["identifiers"]
        o = ids_over(r, subset)
        vs = f"{t['cost_units'] / ref['cost_units'] * 100:.1f}%" if ref and ref["cost_units"] else "-"
        own = (f"{t['proxy_calls']} / {t['proxy_prompt_tokens']:,} / {t['proxy_cost_units']:,.0f}"
               if t["proxy_calls"] else "0")
        lines.append(
            f"| {r['setting']} | {t['requests']} | {t['rejected']} ({t['context_length_exceeded']}) | "
            f"{t['provider_rejections']} | {t['prompt_tokens']:,} | {t['cached_tokens']:,} | "
            f"{pct(t['hit_rate'])} ({pct(t['agent_hit_rate'])}) | {t['cost_units']:,.0f} | {vs} | {own} | "
            f"{share(i['kept'], i['total'])} / {share(i['after_head_kept'], i['after_head'])} | "
            f"{share(o['kept'], o['total'])} / {share(o['after_head_kept'], o['after_head'])} | "
            f"{t['pairing_problems']}, {t['pairing_problems_strict']} | {t['cache_breaks']} | {t['wall_s']:.1f} |")
    return "\n".join(lines)


def ranking_markdown(results: list[dict[str, Any]], ours: str = "ctxproxy") -> str:
    """The ranking targets: among settings with no length rejection, is `ours` cheapest, best cached, best kept?

    ctxproxy's own variants (every setting named ``ctxproxy...``) are left out of "the others"."""
    ok = [r for r in available(results) if r["total"]["rejected"] == 0]
    mine = next((r for r in ok if r["setting"] == ours), None)
    if mine is None:
        return ""
    measures = [("lowest effective cost (cost units)", lambda t: -t["cost_units"], lambda t: f"{t['cost_units']:,.0f}"),
                ("highest hit rate (all provider requests)", lambda t: t["hit_rate"], lambda t: pct(t["hit_rate"])),
                ("highest identifier retention", lambda t: t["identifiers"]["kept"] / max(1, t["identifiers"]["total"]),
                 lambda t: share(t["identifiers"]["kept"], t["identifiers"]["total"]))]
    lines = [f"| ranking target, among the {len(ok)} settings with no length rejection | {ours} | best other "
             "setting | met |", "|---|---:|---|---|"]
    for label, key, show in measures:
        others = [r for r in ok if r["setting"] != ours and not r["setting"].startswith(ours)
                  and r["setting"] not in STATUS_BAR_SETTINGS]
        best = max(others, key=lambda r: key(r["total"]), default=None)
        met = best is None or key(mine["total"]) > key(best["total"])
        lines.append(f"| {label} | {show(mine['total'])} | "
                     + (f"{best['setting']}: {show(best['total'])}" if best else "-")
                     + f" | {'yes' if met else '**no**'} |")
    return "\n".join(lines)


def status_bar_markdown(results: list[dict[str, Any]]) -> str:
    """The status bar's modes side by side (append, the default; off; replace), with the status bar check
    "hit rate with append within 2 points of without". Empty when fewer than two of them ran."""
    ok = {r["setting"]: r for r in available(results)}
    names = [n for n in STATUS_BAR_SETTINGS if n in ok]
    if len(names) < 2:
        return ""
    off = ok.get("ctxproxy-no-status-bar")
    lines = ["| status bar setting | mode | prompt tokens | hit rate (agent only) | vs no status bar, points | "
             "cost units | cost vs no status bar | own calls | compactions | identifiers kept | "
             "in-handler ms (sum / max) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    modes = {"ctxproxy": "replace (default)", "ctxproxy-no-status-bar": "off",
             "ctxproxy-status-replace": "replace (set explicitly)"}
    for n in names:
        r = ok[n]
        t = r["total"]
        i = t["identifiers"]
        if off is not None:
            o = off["total"]
            dp = f"{(t['hit_rate'] - o['hit_rate']) * 100:+.2f}" if t["hit_rate"] is not None else "-"
            dc = f"{t['cost_units'] / o['cost_units'] * 100:.1f}%" if o["cost_units"] else "-"
        else:
            dp = dc = "-"
        p = r["proxy"]
        lines.append(f"| {n} | {modes[n]} | {t['prompt_tokens']:,} | {pct(t['hit_rate'])} "
                     f"({pct(t['agent_hit_rate'])}) | {dp} | {t['cost_units']:,.0f} | {dc} | {t['proxy_calls']} | "
                     f"{t['compactions']} | {share(i['kept'], i['total'])} | "
                     f"{p.get('overhead_ms', '-')} / {p.get('max_overhead_ms', '-')} |")
    if off is not None and "ctxproxy" in ok:
        a, o = ok["ctxproxy"]["total"], off["total"]
        d = (a["hit_rate"] - o["hit_rate"]) * 100
        lines += ["", f"status bar check, hit rate with the status bar (default mode) within 2 points of without: "
                      f"{'met' if abs(d) <= 2.0 else 'NOT met'} ({pct(a['hit_rate'])} vs {pct(o['hit_rate'])}, "
                      f"{d:+.2f} points)"]
        if "ctxproxy-status-replace" in ok:
            rp = ok["ctxproxy-status-replace"]["total"]
            lines.append(f"replace mode, beside it: {pct(rp['hit_rate'])} "
                         f"({(rp['hit_rate'] - o['hit_rate']) * 100:+.2f} points against no status bar)")
    return "\n".join(lines)


def criteria_markdown(criteria: list[dict[str, Any]], title: str) -> str:
    """A table of checks (setting, check, met, figures) under the heading `title`."""
    lines = [f"| setting | {title} | met | figures |", "|---|---|---|---|"]
    for c in criteria:
        met = "n/a" if c["met"] is None else "yes" if c["met"] else "**no**"
        lines.append(f"| {c.get('setting', '')} | {c['criterion']} | {met} | {c['figures']} |")
    return "\n".join(lines)


def compress_per_trace_markdown(results: list[dict[str, Any]], subset: list[str]) -> str:
    """Per trajectory and setting: prompt tokens, hit rate, rejections, identifiers kept; * marks the trajectories
    over the trigger."""
    ok = available(results)
    head = "| trace | turns | " + " | ".join(f"{r['setting']}: prompt / hit / rej / ids" for r in ok) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(ok)]
    for k, t0 in enumerate(ok[0]["traces"]):
        cells = []
        for r in ok:
            t = r["traces"][k]
            i = t["identifiers"]
            cells.append(f"{t['prompt_tokens']:,} / {pct(t['hit_rate'])} / {t['rejected']} / {i['kept']}/{i['total']}")
        mark = " *" if t0["trace"] in subset else ""
        lines.append(f"| {t0['trace']}{mark} | {t0['requests']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compaction_detail(res: dict[str, Any], limit: int = 40) -> str:
    """The compacted-history messages a setting produced (per first appearance) and cache breaks vs compactions."""
    lines = []
    t = res["total"]
    rows = [(tr["trace"], q) for tr in res["traces"] for q in tr["rows"]]
    breaks_with = sum(1 for _, q in rows if q.get("cache_break") and q.get("compacted"))
    breaks_without = [(tid, q["turn"], q.get("prefix_lost_tokens")) for tid, q in rows
                      if q.get("cache_break") and not q.get("compacted")]
    comp_no_break = [(tid, q["turn"], q["compacted"]) for tid, q in rows
                     if q.get("compacted") and not q.get("cache_break")]
    lines.append(f"{res['setting']}: {t['cache_breaks']} cache breaks (> {BREAK_TOKENS} tokens of the previous prompt "
                 f"re-billed), {t['prefix_lost_tokens']:,} prefix tokens lost in all; compactions by layer "
                 f"{t['compactions_by_layer'] or '{}'}; breaks on a compacting request {breaks_with}, "
                 f"breaks without one {len(breaks_without)}, compactions without a break {len(comp_no_break)}; "
                 f"proxy's own calls {t['proxy_calls']} ({t['proxy_prompt_tokens']:,} prompt tokens, "
                 f"{t['proxy_cached_tokens']:,} cached, {t['proxy_completion_tokens']:,} written)")
    if breaks_without:
        lines.append(f"  breaks without a compaction header (trace, turn, tokens lost): {breaks_without[:12]}")
    sums = [(tr["trace"], s) for tr in res["traces"] for s in tr.get("summaries", [])]
    if sums:
        lines.append("")
        lines.append("| trace | turn | kind | message tokens | model-written part | identifiers listed (tokens) | "
                     "uncached tokens of that request | proxy's own prompt tokens that turn |")
        lines.append("|---|---:|---|---:|---:|---:|---:|---:|")
        for tid, s in sums[:limit]:
            idl = f"{s['identifiers_listed']} ({s['identifier_tokens']:,})" if "identifiers_listed" in s else "-"
            lines.append(f"| {tid} | {s['turn']} | {s['kind']} | {s['tokens']:,} | {s.get('digest_tokens', '-')} | "
                         f"{idl} | {s['uncached_tokens']:,} | {s['proxy_prompt_tokens']:,} |")
        if len(sums) > limit:
            lines.append(f"| ... {len(sums) - limit} more | | | | | | | |")
    diag = [(tr["trace"], tr["identifiers"].get("diagnosis")) for tr in res["traces"]
            if tr["identifiers"].get("diagnosis")]
    if diag:
        lines.append("")
        for tid, d in diag:
            parts = [f"{k}: {len(v)} ({', '.join(repr(x) for x in v[:4])}{', ...' if len(v) > 4 else ''})"
                     for k, v in d.items() if isinstance(v, list) and v]
            lines.append(f"  trace {tid}: lost {sum(len(v) for v in d.values() if isinstance(v, list))}, "
                         f"last list {d.get('listed_count')} identifiers; " + "; ".join(parts))
    return "\n".join(lines)


CORPUS_LABELS = {"trajectories": "chat corpus", "native": "native Codex sessions"}
NATIVE_LABELS = {"responses": "native Codex sessions", "messages": "native Claude Code sessions"}


def corpus_label(api: str, corpus: str) -> str:
    """How a (API, corpus) group is named in the tables: the native sessions are Codex's or Claude Code's."""
    if corpus == "native":
        return NATIVE_LABELS.get(api, "native sessions")
    return CORPUS_LABELS.get(corpus, corpus)


def api_markdown(results: list[dict[str, Any]]) -> str:
    """Chat, Responses and Messages side by side: per setting, one row per (API, corpus) it was replayed in.

    The chat corpus in chat and converted to Responses items or Messages are the same turns, so their rows
    compare directly (the "vs chat" column: the row against the chat row of the same setting); the native
    sessions are other conversations, compared only with their own no-proxy row ("prompt vs no-proxy").
    "cache writes": the tokens Anthropic bills as written to its cache (at 1.25 x the input price; cost units
    leave them at 1 x, as for the OpenAI APIs, which bill no writes). The Messages no-proxy row's hit rate is
    the cache reads Claude Code's own breakpoints get.
    """
    order = list(dict.fromkeys(r["setting"] for r in results))
    groups = list(dict.fromkeys((r.get("api", "chat"), r.get("corpus", "trajectories")) for r in results))
    by = {(r["setting"], r.get("api", "chat"), r.get("corpus", "trajectories")): r for r in results}
    lines = ["| setting | API | corpus | requests | rejected (ctx exceeded) | provider 400s | prompt tokens | "
             "cached tokens | hit rate (agent only) | cost units | prompt vs no-proxy | "
             "proxy's own calls: n / prompt tok | compactions | identifiers kept: all / after head | "
             "pairing: bad requests, strict | vs chat: prompt, hit rate points | cache writes | wall s |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in order:
        for api, corpus in groups:
            r = by.get((name, api, corpus))
            if r is None:
                continue
            where = f"| {name} | {api} | {corpus_label(api, corpus)} |"
            if "total" not in r:
                u = r["unavailable"]
                lines.append(f"{where} not run: {u['error']} |" + " |" * 14)
                continue
            t = r["total"]
            i = t["identifiers"]
            own = (f"{t['proxy_calls']} / {t['proxy_prompt_tokens']:,}" if t["proxy_calls"] else "0")
            chat = by.get((name, "chat", corpus))
            vs = "-"
            if api != "chat" and chat is not None and "total" in chat and chat["total"]["prompt_tokens"]:
                c = chat["total"]
                dp = (f"{(t['hit_rate'] - c['hit_rate']) * 100:+.2f}"
                      if t["hit_rate"] is not None and c["hit_rate"] is not None else "-")
                vs = f"{t['prompt_tokens'] / c['prompt_tokens'] * 100:.1f}%, {dp}"
            lines.append(
                f"{where} {t['requests']} | {t['rejected']} ({t['context_length_exceeded']}) | "
                f"{t['provider_rejections']} | {t['prompt_tokens']:,} | {t['cached_tokens']:,} | "
                f"{pct(t['hit_rate'])} ({pct(t['agent_hit_rate'])}) | {t['cost_units']:,.0f} | "
                f"{pct(t.get('prompt_ratio'))} | {own} | {t['compactions']} | "
                f"{share(i['kept'], i['total'])} / {share(i['after_head_kept'], i['after_head'])} | "
                f"{t['pairing_problems']}, {t['pairing_problems_strict']} | {vs} | "
                f"{f'{w:,}' if (w := t.get('cache_written_tokens')) else '-'} | {t['wall_s']:.1f} |")
    return "\n".join(lines)


def rejected_detail(results: list[dict[str, Any]], limit: int = 20) -> str:
    """Each request a proxied setting had rejected: the conversation, the turn, what the provider said, what
    the proxy's headers and log say it did (so a rejection through the proxy can be traced to its cause)."""
    lines = []
    for r in available(results):
        rej = r["proxy"].get("rejected") or []
        if not rej:
            continue
        api = r.get("api", "chat")
        lines.append(f"{r['setting']} [{api}, {corpus_label(api, r.get('corpus', ''))}]: "
                     f"{len(rej)} rejected")
        for q in rej[:limit]:
            size = (f"; proxy's count {q['tokens_before']:,} -> {q['tokens_after']:,} ({q['compacted']})"
                    if "tokens_before" in q else "")
            counted = q.get("attempted_prompt_tokens")
            lines.append(f"  trace {q['trace']} turn {q['turn']}: HTTP {q['status']} {q.get('error')}, provider "
                         f"counted {'-' if counted is None else f'{counted:,}'} tokens{size}"
                         + (f"; summary set aside: {q['summary_rejected']}" if q.get("summary_rejected") else "")
                         + (f"; proxy's own calls {q['proxy_call_kinds']}" if q.get("proxy_call_kinds") else ""))
            lines += [f"    log: {x}" for x in q["log"] if not x.startswith("info: request ")]
        if len(rej) > limit:
            lines.append(f"  ... {len(rej) - limit} more")
    return "\n".join(lines)
