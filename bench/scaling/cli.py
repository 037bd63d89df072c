"""``python -m bench.scaling``: arguments, ``--proxy-src`` before anything imports ``proxy``, the run, the report."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shlex
import sys
import tempfile
from typing import Any

from bench import scaling as package
from bench.machine import git_state, machine_facts
from bench.overhead.processes import Processes
from bench.proxy_src import import_proxy_from
from bench.scaling.config import CONFIGS, PASSTHROUGH, SIZES
from bench.scaling.history import build_history
from bench.scaling.measure import measure_config
from bench.scaling.report import print_report


def main(argv: list[str] | None = None) -> int:
    """Measure each config at each size, print the report (and write the JSON file); 0 on success."""
    ap = argparse.ArgumentParser(description=(package.__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="history sizes (messages)")
    ap.add_argument("--runs", type=int, default=20, help="measured requests per size and config")
    ap.add_argument("--warm", type=int, default=3, help="unmeasured requests per size and config first")
    ap.add_argument("--configs", default=",".join([*CONFIGS, PASSTHROUGH]),
                    help=f"from: {', '.join(CONFIGS)}, {PASSTHROUGH} (the reference floor)")
    ap.add_argument("--proxy-src", help="directory holding the `proxy` package to import (e.g. a git archive)")
    ap.add_argument("--no-profile", action="store_true", help="skip the cProfile pass at the largest size")
    ap.add_argument("--max-seconds", type=float, default=120.0, help="time budget per size and config")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    args = ap.parse_args(argv)
    if args.proxy_src:
        import_proxy_from(args.proxy_src)  # before anything below imports `proxy`
    sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    names = [x.strip() for x in args.configs.split(",") if x.strip()]
    unknown = [n for n in names if n not in CONFIGS and n != PASSTHROUGH]
    if unknown or not sizes or sizes[0] < 2:
        ap.error(f"unknown config(s) {unknown} or bad sizes {sizes}")

    import proxy

    try:
        import uvloop
        uvloop.install()
        loop_name = "uvloop"
    except ImportError:
        loop_name = "asyncio"

    history, tools = build_history(max(sizes))
    res: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.scaling", *sys.argv[1:]]) if argv is None else argv,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "git": git_state(), "machine": machine_facts(), "loop": loop_name, "runs": args.runs, "warm": args.warm,
        "proxy_from": os.path.dirname(os.path.abspath(proxy.__file__)),
        "history": f"{len(history)} messages from the mini-swe-agent trajectories, {len(tools)} tool(s); "
                   f"{args.warm} warm + {args.runs} measured requests per size, each n-1 seen + 1 new",
    }
    with tempfile.TemporaryDirectory(prefix="ctxproxy-scaling-") as tmp:
        procs = Processes(tmp, None)
        try:
            mock_url = procs.start_mock()

            async def go() -> list[dict[str, Any]]:
                out = []
                for n in names:
                    print(f"config {n} ...", flush=True)
                    out.append(await measure_config(n, CONFIGS.get(n, {}), mock_url, history, tools, sizes, args.runs,
                                                    args.warm, tmp,
                                                    None if args.no_profile or n == PASSTHROUGH else max(sizes),
                                                    args.max_seconds))
                return out

            res["configs"] = asyncio.run(go())
        finally:
            procs.stop()
    print_report(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        print(f"\nfigures written to {args.json}")
    return 0
