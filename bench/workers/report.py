"""The figures per proxy (medians over the rounds), side by side, and their ratio."""

from __future__ import annotations

from statistics import median
from typing import Any


def summary(rounds: list[dict[str, Any]], names: list[str], requests: int) -> dict[str, Any]:
    """Per proxy: median requests/s, CPU ms per request (parent + workers), each process's share of that CPU,
    and the mock's and the client's CPU per request."""
    out: dict[str, Any] = {}
    for name in names:
        rs = [r[name] for r in rounds]
        cpu = [sum(r["cpu_ms"]) for r in rs]
        per_process = [sum(r["cpu_ms"][k] for r in rs) for k in range(len(rs[0]["cpu_ms"]))]
        out[name] = {"requests_per_s": median(requests / r["wall_s"] for r in rs),
                     "cpu_ms_per_request": median(c / requests for c in cpu),
                     "cpu_share": [x / max(1e-9, sum(per_process)) for x in per_process],
                     "mock_cpu_ms_per_request": median(r["mock_cpu_ms"] / requests for r in rs),
                     "client_cpu_ms_per_request": median(r["client_cpu_ms"] / requests for r in rs)}
    return out


def print_report(res: dict[str, Any]) -> None:
    s = res["summary"]
    names = list(s)
    m = res["machine"]
    print(f"\nbench.workers: {res['settings']}; {m.get('cpu_count', '?')} CPUs ({m.get('cpu_model', '?')}), "
          f"load average at start {m.get('loadavg_at_start')}; {res['date']}")
    width = 16
    print(f"{'':34}" + "".join(f"{n:>{width}}" for n in names) + f"{'ratio':>{width}}")

    def row(label: str, key: str, fmt: str) -> None:
        values = [s[n][key] for n in names]
        ratio = values[-1] / values[0] if values[0] else float("nan")
        print(f"{label:34}" + "".join(f"{v:>{width}{fmt}}" for v in values) + f"{ratio:>{width}.2f}")

    row("requests/s (median)", "requests_per_s", ".0f")
    row("proxy CPU ms/request (all procs)", "cpu_ms_per_request", ".2f")
    row("mock CPU ms/request", "mock_cpu_ms_per_request", ".2f")
    row("client CPU ms/request", "client_cpu_ms_per_request", ".2f")
    shares = ["/".join(f"{x:.0%}" for x in s[n]["cpu_share"]) for n in names]
    print(f"{'CPU share (parent / each worker)':34}" + "".join(f"{x:>{width}}" for x in shares))
