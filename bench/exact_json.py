"""Benchmark: parsing a body full of long digit runs, exactly, against plain orjson.

A body that may hold integers beyond 64 bits is parsed by the exact (stdlib)
parser so no digit is lost (proxy/wire/jsonio.py); this measures what that costs
on a 600 KB chat body with 200 tool results, each full of 19-digit numbers (more
than 256 long runs, so the exact parser runs): best of ``--runs`` for
``Conversation.parse`` (the proxy's whole parse) and for ``orjson.loads``, side by
side in one process. Target: under 3x orjson plus 2 ms.

Usage: ``python -m bench.exact_json [--runs 30]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from proxy.request import Conversation
from proxy.wire.chat.codec import CHAT


def body() -> bytes:
    msgs = [{"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} 1700000000000000000 " * 150} for i in range(200)]
    return orjson.dumps({"model": "gpt-4o", "messages": msgs})


def best(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args(argv)
    raw = body()
    exact = best(lambda: Conversation.parse(raw, CHAT), args.runs)
    plain = best(lambda: orjson.loads(raw), args.runs)
    target = 3 * plain + 0.002
    print(f"body {len(raw):,} bytes: Conversation.parse {exact * 1000:.2f} ms, orjson.loads {plain * 1000:.2f} ms, "
          f"ratio {exact / plain:.2f}; target < {target * 1000:.2f} ms: {'met' if exact < target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
