"""The printed report: the run's facts, each phase's table, the profile, RSS, and the load targets."""

from __future__ import annotations

from typing import Any

from bench import hostile
from bench.load.config import FLAT_MB, STREAM_DATA_CHUNKS, TARGET_RPS, TARGET_RSS_MB, TARGET_STREAMS
from bench.load.measure import pct


def header(res: dict[str, Any], proxy_note: str) -> list[str]:
    """The run's facts: command, proxy, date, machine, versions, how quiet the machine was, the mock."""
    out: list[str] = []
    w = out.append
    m = res["machine"]
    w(f"command:  {res['command']}")
    w(f"proxy:    {res['proxy_command']}{proxy_note}")
    w(f"date:     {res['date']}; repo {m['git']}")
    w(f"machine:  {m['cpu_count']} CPUs ({m['cpu_model']}), shared by client, proxy and mock; "
      f"{m['implementation']} {m['python']}, {m['platform']}, load avg at start {m['loadavg_at_start']}")
    w("versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + f"; client loop {res['client_loop']}")
    ic = res.get("idle_check") or {}
    w(f"quiet?:   other processes used {ic.get('others', float('nan')):.0f}% of a core in the 2 s before the load"
      f" (machine {ic.get('machine', float('nan')):.0f}% of {100 * (m['cpu_count'] or 1)}%)")
    w(f"mock:     {res['delay_ms']:.0f} ms before answering / before the first stream chunk, "
      f"{res['chunk_delay_ms']:.0f} ms between stream chunks; mode {res['mode']}")
    w("")
    return out


def report(res: dict[str, Any]) -> str:
    """The whole report as text (the hostile run's, with `--hostile`)."""
    if "hostile" in res:
        return "\n".join(header(res, "") + hostile.report(res["hostile"], pct))
    out = header(res, "  (phase 3: a fresh one, same command, store and log in a subdirectory)")
    w = out.append
    p1 = res.get("phase1") or []
    if p1:
        dur = p1[0]["seconds"]
        w(f"Phase 1: small non-streaming requests, closed loop, {dur:.0f} s per run after a 1 s warm-up "
          f"(latency ms; added = proxy - direct per percentile; CPU % of one core)")
        hdr = (f"{'conc':>5} {'target':<7}{'req/s':>7}{'min 1s':>7}{'requests':>9}{'errors':>7}"
               f"{'p50':>8}{'p99':>8}{'max':>8}{'+p50':>8}{'+p99':>8}" + CPU_HDR + f"{'RSS MB':>8}{'busy s':>7}")
        w(hdr)
        w("-" * len(hdr))
        by = {(r["concurrency"], r["target"]): r for r in p1}
        for c in sorted({r["concurrency"] for r in p1}):
            d = by.get((c, "direct"))
            for t in ("direct", "proxy"):
                r = by.get((c, t))
                if not r:
                    continue
                add50 = f"{r['p50'] - d['p50']:+8.2f}" if t == "proxy" and d else f"{'':>8}"
                add99 = f"{r['p99'] - d['p99']:+8.2f}" if t == "proxy" and d else f"{'':>8}"
                w(f"{c:>5} {t:<7}{r['rps']:>7.0f}{r['min_1s_rps']:>7.0f}{r['requests']:>9}{r['errors']:>7}"
                  f"{r['p50']:>8.2f}{r['p99']:>8.2f}{r['max']:>8.1f}{add50}{add99}" + cpu_cols(r.get("cpu"))
                  + (f"{r['rss_after_mb']:>8.0f}{r['busy_after_s']:>7.1f}" if "rss_after_mb" in r else ""))
        kinds = {f"{r['concurrency']} {r['target']}": r["error_kinds"] for r in p1 if r["error_kinds"]}
        if kinds:
            w(f"  errors: {kinds}")
        w("  (min 1s = fewest requests completed in any whole second of the run; " + CPU_NOTE
          + "; RSS MB = the proxy's VmRSS right after its run; busy s = how long the proxy kept using over 5%"
          " of a core after its load stopped)")
        w("")
    prof = res.get("profile") or {}
    if prof:
        if prof.get("self"):
            ld = prof.get("load", {})
            cpu = ld.get("cpu") or {}
            w(f"Profile: py-spy on the proxy, {prof['samples']} samples at {prof['concurrency']} concurrent "
              f"({ld.get('rps', 0):.0f} req/s, errors {ld.get('errors', 0)}, proxy CPU "
              f"{cpu.get('proxy', float('nan')):.0f}% of a core, busy {ld.get('busy_after_s', float('nan')):.1f} s"
              " after the load stopped; unrecorded run)")
            w("  samples by thread: " + ", ".join(f"{t} {p:.1f}%" for t, p in prof["threads"]))
            w("  top frames by own time, all threads (% of all samples):")
            for fr, p in prof["self"]:
                w(f"    {p:5.1f}%  {fr}")
            w("  ctxproxy's functions by inclusive time, all threads (% of all samples):")
            for fr, p in prof["proxy_inclusive"]:
                w(f"    {p:5.1f}%  {fr}")
            w("  own time by package or ctxproxy module, and thread (% of all samples):")
            for fr, p in prof["packages"]:
                w(f"    {p:5.1f}%  {fr}")
        else:
            w(f"Profile: {prof.get('error') or prof.get('command')}")
            if prof.get("py_spy_output"):
                w("  py-spy said: " + prof["py_spy_output"].strip().replace("\n", "\n  "))
        w("")
    p2 = res.get("phase2")
    if p2:
        w("Phase 2: concurrent streaming requests, all sent at once "
          f"({STREAM_DATA_CHUNKS} data chunks + [DONE] each; ms)")
        hdr = (f"{'target':<8}{'round':>6}{'streams':>8}{'complete':>9}{'errors':>7}{'TTFC p50':>10}"
               f"{'TTFC p99':>10}{'total p50':>10}{'total p99':>10}{'batch s':>8}" + CPU_HDR)
        w(hdr)
        w("-" * len(hdr))
        for t in ("direct", "proxy"):
            for i, b in enumerate(p2[t]):
                w(f"{t:<8}{i + 1:>6}{b['streams']:>8}{b['completed']:>9}{b['errors']:>7}"
                  f"{pct(b['ttfc'], 0.5):>10.1f}{pct(b['ttfc'], 0.99):>10.1f}{pct(b['total'], 0.5):>10.1f}"
                  f"{pct(b['total'], 0.99):>10.1f}{b['batch_s']:>8.2f}" + cpu_cols(b.get("cpu")))
        w(f"  (TTFC = time to the first data chunk; total = to the end of the stream; batch s = until the last"
          f" stream of the batch ended; {CPU_NOTE})")
        for t in ("direct", "proxy"):
            for b in p2[t]:
                if b["error_kinds"]:
                    w(f"  {t} errors: {b['error_kinds']}")
        w("")
    p3 = res.get("phase3")
    if p3:
        cpu = p3["cpu"]
        w(f"Phase 3: agent-like mixed traffic through a fresh proxy, {p3['agents']} agents, {p3['seconds']:.0f} s "
          f"recorded after a warm-up")
        w(f"  requests {p3['requests']} ({p3['rps']:.0f}/s), sessions started {p3['sessions_started']}, tool "
          f"results {p3['tool_results']} (of which ~100 KB: {p3['big_tool_results']}), longest history "
          f"{p3['max_messages']} messages; errors {p3['errors']} {p3['error_kinds'] or ''}")
        for k, v in p3["latency"].items():
            w(f"  {k:<10} n {v['n']:>6}  p50 {v['p50']:8.1f} ms  p99 {v['p99']:8.1f} ms")
        w("  CPU % of one core:" + "".join(f" {k} {cpu.get(k, float('nan')):.0f}" for k in CPU_KEYS))
        growth = p3["rss_last_third_mb"] - p3["rss_first_third_mb"]
        per_1000_sessions = growth / max(1, p3["sessions_recorded"] * 2 / 3) * 1000
        w(f"  proxy RSS over the recorded run ({p3['rss_samples']} samples, 1/s): min {p3['rss_min_mb']:.1f} MB, "
          f"max {p3['rss_max_mb']:.1f} MB; mean of first third {p3['rss_first_third_mb']:.1f} MB, last third "
          f"{p3['rss_last_third_mb']:.1f} MB ({p3['rss_last_third_mb'] - p3['rss_first_third_mb']:+.1f}); "
          f"slope {p3['rss_slope_mb_per_min']:+.2f} MB/min; "
          f"{per_1000_sessions:+.1f}"
          f" MB per 1000 new sessions ({p3['sessions_recorded']} started while recording)")
        w("")
    rss = res.get("rss") or {}
    if rss:
        after = ", ".join(f"after {k} {v:.1f}" for k, v in rss["after"].items())
        w(f"Proxy RSS (MB): at start {res['rss_at_start_mb']:.1f}, {after}; peak sampled "
          f"{rss['peak_sampled_mb']:.1f}, VmHWM {rss['vmhwm_mb']:.1f}")
        for p in res.get("proxies") or []:
            w(f"  proxy for {p['role']}: start {p.get('start_mb', 0):.1f}, end {p.get('end_mb', 0):.1f}, "
              f"peak (VmHWM) {p.get('vmhwm_mb', 0):.1f}")
        w("")
    w("Load targets:")
    for line in load_targets(res):
        w("  " + line)
    w(f"total run time {res.get('total_seconds', 0):.0f} s (after start-up)")
    return "\n".join(out)


CPU_KEYS = ("proxy", "proxy_wait", "mock", "client", "others")
CPU_HDR = f"{'proxy%':>7}{'wait%':>6}{'mock%':>6}{'clnt%':>6}{'other%':>7}"


CPU_NOTE = ("CPU % of one core over the run: proxy, proxy runnable but waiting for a CPU, mock, client (this"
            " process), other processes on the machine")


def cpu_cols(cpu: dict[str, float] | None) -> str:
    """The CPU columns of one run's row."""
    cpu = cpu or {}
    nan = float("nan")
    return (f"{cpu.get('proxy', nan):>7.0f}{cpu.get('proxy_wait', nan):>6.0f}{cpu.get('mock', nan):>6.0f}"
            f"{cpu.get('client', nan):>6.0f}{cpu.get('others', nan):>7.0f}")


def load_targets(res: dict[str, Any]) -> list[str]:
    """Each load target, met or not, with its figures: throughput with no errors, every stream complete, RSS
    under its cap, memory flat over the long run."""
    lines = []
    p1 = [r for r in res.get("phase1") or [] if r["target"] == "proxy"]
    if p1:
        best = max(p1, key=lambda r: r["rps"])
        errs = sum(r["errors"] for r in p1)
        ok = best["rps"] >= TARGET_RPS and errs == 0
        lines.append(f"[{'met' if ok else 'NOT met'}] >= {TARGET_RPS} req/s small non-streaming with 0 errors: "
                     f"best {best['rps']:.0f} req/s at {best['concurrency']} concurrent, "
                     + ", ".join(f"{r['rps']:.0f} at {r['concurrency']}" for r in p1)
                     + f"; errors through the proxy {errs}")
    p2 = (res.get("phase2") or {}).get("proxy") or []
    if p2:
        ok = all(b["completed"] == b["streams"] == TARGET_STREAMS for b in p2)
        lines.append(f"[{'met' if ok else 'NOT met'}] {TARGET_STREAMS} concurrent streams complete: "
                     + ", ".join(f"{b['completed']}/{b['streams']}" for b in p2) + " through the proxy")
    rss = res.get("rss") or {}
    if rss:
        peak = max(rss["vmhwm_mb"], rss["peak_sampled_mb"])
        lines.append(f"[{'met' if peak < TARGET_RSS_MB else 'NOT met'}] RSS under {TARGET_RSS_MB} MB: "
                     f"peak {peak:.1f} MB (highest VmHWM of the proxy processes)")
    p3 = res.get("phase3")
    if p3:
        growth = p3["rss_last_third_mb"] - p3["rss_first_third_mb"]
        ok = growth <= FLAT_MB and p3["errors"] == 0
        lines.append(f"[{'met' if ok else 'NOT met'}] memory flat over the long run (last third within "
                     f"{FLAT_MB:.0f} MB of the first, no errors): {growth:+.1f} MB, slope "
                     f"{p3['rss_slope_mb_per_min']:+.2f} MB/min over {p3['seconds']:.0f} s, errors {p3['errors']}")
    return lines
