"""The printed table for the small conversation in each client API (chat, Responses, Messages), side by side.

The three scenarios run in the same sitting, interleaved alike, against the
same direct / floor / ctxproxy targets, so the figures that carry over from one
noisy run to the next are the ratios between them, not the milliseconds.
"""

from __future__ import annotations

from typing import Any

from bench.overhead.config import FLOOR
from bench.overhead.stats import added_ratio

APIS = [
    ("small", "small chat", "chat"),
    ("small_responses", "small Responses", "Responses"),
    ("small_messages", "small Messages", "Messages"),
]


def _cpu(res: dict[str, Any], key: str, field: str) -> str:
    """One CPU-per-request figure (ms) for the table, or "-" when /proc gave none."""
    v = (res.get("cpu_ms_per_request") or {}).get(key, {}).get(field)
    return f"{v:.3f}" if v else "-"


def print_apis(res: dict[str, Any]) -> None:
    """Per API: direct, floor and ctxproxy medians, each one's added time, ctxproxy-added / floor-added,
    proxy / direct, CPU per request; then each API's added time against chat's."""
    sc = res["scenarios"]
    rows = [(k, label, short) for k, label, short in APIS if k in sc and FLOOR in sc[k]]
    if len(rows) < 2:
        return
    print()
    print("Client APIs: the small conversation as POST /v1/chat/completions, /v1/responses (instructions + input)"
          " and /v1/messages (system + messages, x-api-key), interleaved alike")
    hdr = (f"{'scenario':<20}{'n':>6}{'direct':>9}{'floor':>9}{'ctxproxy':>10}{'floor +med':>12}{'ctxp +med':>11}"
           f"{'ctxp+/floor+':>14}{'ctxp x':>8}{'ctxp CPU':>10}{'floor CPU':>11}")
    print(hdr)
    print("-" * len(hdr))
    added: dict[str, float] = {}
    for key, label, short in rows:
        d, p, f = sc[key]["direct"], sc[key]["proxy"], sc[key][FLOOR]
        fa, pa = f["median"] - d["median"], p["median"] - d["median"]
        added[short] = pa
        print(f"{label:<20}{p['n']:>6}{d['median']:>9.3f}{f['median']:>9.3f}{p['median']:>10.3f}"
              f"{fa:>+12.3f}{pa:>+11.3f}{added_ratio(pa, fa):>14}{p['median'] / d['median']:>8.2f}"
              f"{_cpu(res, key, 'proxy_ms_per_proxied_request'):>10}"
              f"{_cpu(res, key, f'{FLOOR}_ms_per_{FLOOR}_request'):>11}")
    print("(medians in ms; +med = added over direct; ctxp+/floor+ = ctxproxy's added time / the floor's; x = "
          "ctxproxy / direct; CPU = ms of the process per request of its own over the recorded loop)")
    chat = added.get("chat", 0.0)
    for short, value in added.items():
        if short != "chat":
            ratio = f"{value / chat:.2f}" if chat > 0 else "n/a"
            print(f"small request: ctxproxy adds {value:.3f} ms to a {short} request and {chat:.3f} ms to a chat one:"
                  f" {short} / chat = {ratio} (target: within 10%, not asserted)")
