"""Benchmark: parsing a body full of long digit runs, exactly, against plain orjson.

A body that holds integers beyond 64 bits is parsed by the exact (stdlib)
parser so no digit is lost (proxy/wire/jsonio.py: orjson's value shows such an
integer as a float of 2**63 or more, and only then are the raw bytes looked at).
Two 600-700 KB chat bodies of 200 tool results each:

* ``strings``: each result's text full of 19-digit numbers, inside the string (the
  common case: the numbers are text; nothing is parsed exactly);
* ``integers``: the same, each message also carrying ``"ids"``, 40 integers of 21
  digits as JSON numbers (the exact parser runs).

Best of ``--runs`` for ``Conversation.parse`` (the proxy's whole parse) and for
``orjson.loads``, side by side in one process. Target: under 3x orjson plus 2 ms.

Usage: ``python -m bench.exact_json [--runs 30]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from proxy.request import Conversation
from proxy.wire.chat.codec import CHAT


def body(integers: bool = False) -> bytes:
    msgs = [{"role": "tool", "tool_call_id": f"c{i}", "content": f"{i} 1700000000000000000 " * 150}
            for i in range(200)]
    if not integers:
        return orjson.dumps({"model": "gpt-4o", "messages": msgs})
    ids = ", ".join(str(170000000000000000000 + k) for k in range(40))  # beyond 64 bits: orjson cannot hold them
    text = orjson.dumps({"model": "gpt-4o", "messages": msgs}).decode()
    return text.replace('"role":"tool",', f'"role":"tool","ids":[{ids}],').encode()


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
    for name, raw in (("strings", body()), ("integers", body(integers=True))):
        exact = best(lambda raw=raw: Conversation.parse(raw, CHAT), args.runs)
        plain = best(lambda raw=raw: orjson.loads(raw), args.runs)  # past 64 bits orjson gives a float: not exact
        target = 3 * plain + 0.002
        print(f"{name:8s} body {len(raw):,} bytes: Conversation.parse {exact * 1000:.2f} ms, orjson.loads "
              f"{plain * 1000:.2f} ms, ratio {exact / plain:.2f}; target < {target * 1000:.2f} ms: "
              f"{'met' if exact < target else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
