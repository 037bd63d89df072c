"""The printed report: the direct / ctxproxy table, the floor, client-API and LiteLLM tables, CPU, the proxy's log."""

from __future__ import annotations

from typing import Any

from bench.overhead.config import CONCURRENCY, FLOOR, LITELLM, TARGET_ADDED_MEDIAN_MS
from bench.overhead.report_apis import print_apis
from bench.overhead.stats import added_ratio, floor_added
from bench.overhead.targets import print_targets

ROWS = [
    ("small", "small non-stream, latency"),
    ("stream_first", "stream, time to first chunk"),
    ("stream_last", "stream, time to last chunk"),
    ("c16_latency", f"{CONCURRENCY} concurrent, latency"),
    ("long", "200 msgs/150k tok, latency"),
    ("long_tools", "  same + tools array, latency"),
    ("c16_long_latency", f"{CONCURRENCY} concurrent 150k tok, latency"),
]


def print_report(res: dict[str, Any]) -> None:
    """The whole report: run facts, direct / ctxproxy, the floor, the client APIs, LiteLLM, CPU per request, the
    proxy's log, and last the floor targets met or not."""
    _print_facts(res)
    _print_main_table(res)
    print_floor(res)
    print_apis(res)
    print_litellm(res)
    _print_cpu(res)
    _print_websocket(res)
    _print_proxy_log(res)
    print_targets(res.get("floor_targets") or [])


def _print_facts(res: dict[str, Any]) -> None:
    """What ran, where, when: command, proxy and floor commands, machine, versions, counts."""
    m = res["machine"]
    print()
    print(f"command:  {res['command']}")
    print(f"proxy:    {res['proxy_command']}")
    if res.get("floor_command"):
        print(f"floor:    {res['floor_command']}")
    print(f"date:     {res['date']}; repo {m['git']}")
    print(f"machine:  {m['cpu_count']} CPUs ({m['cpu_model']}), {m['implementation']} {m['python']}, "
          f"{m['platform']}, load avg at start {m['loadavg_at_start']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
          + f"; client loop {res['client_loop']}")
    lc = res["long_conversation"]
    print(f"mode:     {res['mode']}; counts {res['counts']}")
    print(f"long conversation: {lc['messages']} messages, {lc['tokens']:,} tokens (o200k_base), "
          f"{lc['bytes']:,} bytes of JSON")


def _print_main_table(res: dict[str, Any]) -> None:
    """direct against ctxproxy, per scenario, and the small-request target."""
    print()
    hdr = (f"{'scenario':<32}{'n':>6}{'direct med':>12}{'proxy med':>11}{'added med':>11}"
           f"{'direct p99':>12}{'proxy p99':>11}{'added p99':>11}{'ratio':>8}")
    print(hdr)
    print("-" * len(hdr))
    sc = res["scenarios"]
    for key, label in ROWS:
        if key not in sc:  # a run from before the scenario existed
            continue
        d, p = sc[key]["direct"], sc[key]["proxy"]
        print(f"{label:<32}{p['n']:>6}{d['median']:>12.3f}{p['median']:>11.3f}"
              f"{p['median'] - d['median']:>+11.3f}{d['p99']:>12.3f}{p['p99']:>11.3f}"
              f"{p['p99'] - d['p99']:>+11.3f}{p['median'] / d['median']:>8.2f}")
    rd, rp = sc["c16_rps"]["direct"], sc["c16_rps"]["proxy"]
    print(f"{f'{CONCURRENCY} concurrent, requests/s':<32}{rp['requests']:>6}{rd['rps']:>12.0f}"
          f"{rp['rps']:>11.0f}{'':>11}{'':>12}{'':>11}{'':>11}{rp['rps'] / rd['rps']:>8.2f}")
    print("(latencies in ms; added = proxy - direct, per percentile; ratio = proxy / direct;"
          " requests/s per batch: direct "
          + " ".join(f"{x:.0f}" for x in rd["rps_per_batch"]) + ", proxy "
          + " ".join(f"{x:.0f}" for x in rp["rps_per_batch"]) + ")")
    added = sc["small"]["proxy"]["median"] - sc["small"]["direct"]["median"]
    verdict = "under" if added < TARGET_ADDED_MEDIAN_MS else "OVER"
    print(f"small request: added median {added:.3f} ms, {verdict} the "
          f"{TARGET_ADDED_MEDIAN_MS:.0f} ms target (not asserted)")


def _print_cpu(res: dict[str, Any]) -> None:
    """CPU time per request of each process, per scenario."""
    cpu = res.get("cpu_ms_per_request") or {}
    if cpu and any(v["proxy_ms_per_proxied_request"] for v in cpu.values()):
        print()
        print("CPU time per request (ms, from /proc schedstat over the recorded loops): proxy process per"
              " proxied request (floor and LiteLLM per request of theirs); mock and client per request of"
              " any kind")
        for key in ("small", "stream", "c16", "long", "long_tools", "c16_long"):
            if key in cpu:
                v = cpu[key]
                extra = "".join(f"   {name} {v[f'{name}_ms_per_{name}_request']:.3f}" for name in (FLOOR, LITELLM)
                                if f"{name}_ms_per_{name}_request" in v)
                print(f"  {key:<10} proxy {v['proxy_ms_per_proxied_request']:.3f}   mock "
                      f"{v['mock_ms_per_request']:.3f}   client {v['client_ms_per_request']:.3f}{extra}")


def _print_websocket(res: dict[str, Any]) -> None:
    """Scenario 1d: a small Responses turn over the proxy's WebSocket against the same turn over HTTP."""
    w = res["scenarios"].get("small_responses_ws")
    if not w:
        return
    print()
    print("small Responses turn through ctxproxy, WebSocket vs HTTP stream (ms, one socket kept open):")
    for k in ("http_stream", "websocket"):
        print(f"  {k:<12} n {w[k]['n']:>4}  median {w[k]['median']:.3f}  p90 {w[k]['p90']:.3f}  p99 {w[k]['p99']:.3f}")
    print(f"  ratio websocket / http median: {w['ratio_median']:.3f}")


def _print_proxy_log(res: dict[str, Any]) -> None:
    """ctxproxy's own per-request timings from its log, per scenario."""
    bd = res.get("proxy_log")
    if bd:
        print()
        print("proxy's own log (median / p99 ms): overhead_ms = request received -> upstream request"
              " sent; upstream_headers_ms = sent -> upstream headers; total_ms = handler total")
        for key in ("small", "small_responses", "small_messages", "stream", "c16", "long", "long_tools", "c16_long"):
            e = bd.get(key)
            if not e:
                continue
            parts = [f"{f} {e[f]['median']:.3f} / {e[f]['p99']:.3f}"
                     for f in ("overhead_ms", "upstream_headers_ms", "ttfb_ms", "total_ms") if f in e]
            if e.get("degraded"):
                parts.append(f"DEGRADED (forwarded unmodified) {e['degraded']}")
            print(f"  {key:<15} ({e['matched']}/{e['of']} matched): " + "; ".join(parts))
        if bd.get("non_request_warnings_or_unparsed_lines"):
            print(f"  note: {bd['non_request_warnings_or_unparsed_lines']} warning/unparsed lines in "
                  f"the proxy log")


def print_litellm(res: dict[str, Any]) -> None:
    """The three-way table (direct / ctxproxy / LiteLLM), when LiteLLM ran; or why it did not."""
    u = res.get("litellm_unavailable")
    if u:
        print()
        print(f"LiteLLM: not run, {u['stage']} failed:\n{u['error']}")
        return
    sc = res["scenarios"]
    if "litellm" not in sc.get("small", {}):
        return
    info = res.get("litellm") or {}
    print()
    installed = f", installed by this run in {info['install_s']:.0f} s" if info.get("installed_now") else ""
    print(f"LiteLLM {info.get('version', '?')} ({info.get('requirement', '')}; venv bench/.venvs/litellm"
          f"{installed}; ready {info.get('start_s', '?')} s after start)")
    print(f"  {info.get('command', '')}")
    hdr = (f"{'scenario':<32}{'n':>6}{'direct':>9}{'ctxproxy':>10}{'LiteLLM':>10}"
           f"{'ctxp +med':>11}{'LiteLLM +med':>14}{'ctxp +p99':>11}{'LiteLLM +p99':>14}"
           f"{'ctxp x':>8}{'LiteLLM x':>11}")
    print(hdr)
    print("-" * len(hdr))
    for key, label in ROWS:
        if key not in sc:
            continue
        d, p, lt = sc[key]["direct"], sc[key]["proxy"], sc[key]["litellm"]
        print(f"{label:<32}{lt['n']:>6}{d['median']:>9.3f}{p['median']:>10.3f}{lt['median']:>10.3f}"
              f"{p['median'] - d['median']:>+11.3f}{lt['median'] - d['median']:>+14.3f}"
              f"{p['p99'] - d['p99']:>+11.3f}{lt['p99'] - d['p99']:>+14.3f}"
              f"{p['median'] / d['median']:>8.2f}{lt['median'] / d['median']:>11.2f}")
    rd, rp, rl = sc["c16_rps"]["direct"], sc["c16_rps"]["proxy"], sc["c16_rps"]["litellm"]
    print(f"{f'{CONCURRENCY} concurrent, requests/s':<32}{rl['requests']:>6}{rd['rps']:>9.0f}{rp['rps']:>10.0f}"
          f"{rl['rps']:>10.0f}{'':>11}{'':>14}{'':>11}{'':>14}{rp['rps'] / rd['rps']:>8.2f}"
          f"{rl['rps'] / rd['rps']:>11.2f}")
    print("(medians in ms; +med / +p99 = added over direct at that percentile; x = median / direct median, "
          "for requests/s throughput / direct throughput; requests/s per batch: LiteLLM "
          + " ".join(f"{x:.0f}" for x in rl["rps_per_batch"]) + ")")
    if "log_error_lines" in info:
        print(f"LiteLLM's log: {info['log_error_lines']} line(s) with Traceback/ERROR/Exception")


def print_floor(res: dict[str, Any]) -> None:
    """The floor against ctxproxy: what any Python pass-through on the same stack adds, and ctxproxy beside it."""
    sc = res["scenarios"]
    if FLOOR not in sc.get("small", {}):
        return
    print()
    print("Floor: a bare FastAPI + aiohttp pass-through (bench/overhead/floor.py: the body forwarded as bytes with"
          " one shared aiohttp session, the answer returned or streamed back; uvicorn, uvloop + httptools, one"
          " worker), interleaved with the others")
    hdr = (f"{'scenario':<32}{'n':>6}{'direct':>9}{'floor':>9}{'ctxproxy':>10}"
           f"{'floor +med':>12}{'ctxp +med':>11}{'floor +p90':>12}{'ctxp +p90':>11}"
           f"{'ctxp+/floor+ med':>18}{'p90':>7}")
    print(hdr)
    print("-" * len(hdr))
    for key, label in ROWS:
        if key not in sc:
            continue
        d, p, f = sc[key]["direct"], sc[key]["proxy"], sc[key][FLOOR]
        fa, pa = f["median"] - d["median"], p["median"] - d["median"]
        fa90, pa90 = f["p90"] - d["p90"], p["p90"] - d["p90"]
        print(f"{label:<32}{f['n']:>6}{d['median']:>9.3f}{f['median']:>9.3f}{p['median']:>10.3f}"
              f"{fa:>+12.3f}{pa:>+11.3f}{fa90:>+12.3f}{pa90:>+11.3f}"
              f"{added_ratio(pa, fa):>18}{added_ratio(pa90, fa90):>7}")
    rd, rp, rf = sc["c16_rps"]["direct"], sc["c16_rps"]["proxy"], sc["c16_rps"][FLOOR]
    print(f"{f'{CONCURRENCY} concurrent, requests/s':<32}{rf['requests']:>6}{rd['rps']:>9.0f}{rf['rps']:>9.0f}"
          f"{rp['rps']:>10.0f}   (floor / direct {rf['rps'] / rd['rps']:.2f}, ctxproxy / floor "
          f"{rp['rps'] / rf['rps']:.2f})")
    print("(medians in ms; +med / +p90 = added over direct at that percentile; ctxp+/floor+ = ctxproxy's added"
          " time / the floor's; requests/s per batch: floor "
          + " ".join(f"{x:.0f}" for x in rf["rps_per_batch"]) + ")")
    a = floor_added(res)
    assert a is not None
    print(f"small request: the floor adds {a['floor_added_median']:.3f} ms at the median "
          f"({a['floor_added_p90']:.3f} at p90), ctxproxy {a['proxy_added_median']:.3f} ms "
          f"({a['proxy_added_p90']:.3f} at p90): ctxproxy-added / floor-added = "
          f"{added_ratio(a['proxy_added_median'], a['floor_added_median'])} at the median, "
          f"{added_ratio(a['proxy_added_p90'], a['floor_added_p90'])} at p90")
