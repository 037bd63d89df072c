"""The printed report: CPU per request by history size and config, the proxy's own CPU, the profiles."""

from __future__ import annotations

from typing import Any

from bench.scaling.config import PASSTHROUGH


def print_report(res: dict[str, Any]) -> None:
    """The tables: CPU per request by size and config, the proxy's own CPU over the reference, the profiles."""
    print()
    print(f"command:  {res['command']}")
    print(f"date:     {res['date']}; repo {res['git']}; proxy from {res['proxy_from']}")
    m = res["machine"]
    print(f"machine:  {m['cpu_count']} CPUs ({m['cpu_model']}), {m['implementation']} {m['python']}, {m['platform']}")
    print(f"history:  {res['history']}")
    print()
    confs = res["configs"]
    names = [c["config"] for c in confs]
    hdr = f"{'messages':>8} {'tokens':>9} {'KB':>6}"
    for n in names:
        hdr += (f" | {n + ' cpu med':>22} {'p90':>7} {'in-handler':>10} "
                f"{'x n=' + str(confs[0]['rows'][0]['messages']):>7}")
    print(hdr)
    print("-" * len(hdr))
    base = {c["config"]: c["rows"][0]["cpu_ms"]["median"] for c in confs if c["rows"]}
    for i, r0 in enumerate(confs[0]["rows"]):
        line = f"{r0['messages']:>8} {r0['tokens']:>9,} {r0['bytes'] / 1024:>6.0f}"
        for c in confs:
            r = c["rows"][i]
            oh = r["overhead_ms"]["median"] if r["overhead_ms"] else float("nan")
            line += (f" | {r['cpu_ms']['median']:>22.3f} {r['cpu_ms']['p90']:>7.3f} {oh:>10.3f} "
                     f"{r['cpu_ms']['median'] / base[c['config']]:>7.2f}")
        print(line)
    print("(ms per request, median and p90 over the measured requests; cpu = process CPU time of the whole "
          "request path incl. the deferred accounting write; in-handler = the proxy log's overhead_ms; "
          "x = cpu median / the smallest size's)")
    for c in confs:
        rows = c["rows"]
        if len(rows) >= 2:
            a, b = rows[0], rows[-1]
            per_msg = (b["cpu_ms"]["median"] - a["cpu_ms"]["median"]) / (b["messages"] - a["messages"])
            per_kb = (b["cpu_ms"]["median"] - a["cpu_ms"]["median"]) / ((b["bytes"] - a["bytes"]) / 1024)
            print(f"  {c['config']}: {a['messages']} -> {b['messages']} messages: "
                  f"{a['cpu_ms']['median']:.2f} -> {b['cpu_ms']['median']:.2f} ms "
                  f"(+{per_msg * 1000:.1f} us per message, {per_kb * 1000:.1f} us per KB of request)")
        if c["log_warnings_or_errors"]:
            print(f"  {c['config']}: {len(c['log_warnings_or_errors'])} warning/error lines in the proxy log, "
                  f"first: {c['log_warnings_or_errors'][0]}")
    ref = next((c for c in confs if c["config"] == PASSTHROUGH), None)
    proxies = [c for c in confs if c["config"] != PASSTHROUGH]
    if ref is not None and proxies:
        print()
        print(f"The proxy's own CPU: its cpu median minus the {PASSTHROUGH} reference's (orjson loads + dumps of the "
              f"body, sent upstream and the answer returned; same app framework, upstream client and mock)")
        hdr = (f"{'messages':>8} {PASSTHROUGH + ' ms':>16}"
               + "".join(f" | {c['config'] + ' own ms':>22}" for c in proxies))
        print(hdr)
        print("-" * len(hdr))
        for i, r in enumerate(ref["rows"]):
            line = f"{r['messages']:>8} {r['cpu_ms']['median']:>16.3f}"
            for c in proxies:
                line += f" | {c['rows'][i]['cpu_ms']['median'] - r['cpu_ms']['median']:>22.3f}"
            print(line)
    for c in confs:
        for label, text in c["profiles"].items():
            print()
            print(f"cProfile, {c['config']}, {label}, {res['runs']} requests (the process's whole request path):")
            print(text)
