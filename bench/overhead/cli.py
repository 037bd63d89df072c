"""``python -m bench.overhead``: arguments, the run, the report and the JSON file."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shlex
import shutil
import sys
import tempfile
from typing import Any

from bench import overhead as package
from bench.machine import machine_facts
from bench.overhead.config import LITELLM_REQUIREMENT, TARGET_ADDED_MEDIAN_MS
from bench.overhead.mock import serve_mock
from bench.overhead.processes import Processes
from bench.overhead.proxy_log import proxy_log_breakdown
from bench.overhead.report import print_report
from bench.overhead.scenarios import run
from bench.overhead.stats import floor_added
from bench.overhead.targets import floor_targets


def _print_log_tails(procs: Processes) -> None:
    """After a failure: the end of each subprocess's log, on stderr."""
    for what, proc, path in (("the proxy", procs.proxy, procs.proxy_log), ("the floor", procs.floor, procs.floor_log),
                             ("LiteLLM", procs.litellm, procs.litellm_log)):
        if proc is not None and os.path.exists(path):
            with open(path, errors="replace") as f:
                tail = f.read()[-3000:]
            print(f"--- last lines of {what}'s log ---\n{tail}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run every scenario against every target, print the report (and write the JSON file); 0 on success."""
    ap = argparse.ArgumentParser(description=(package.__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (about a fifth)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures to PATH as JSON")
    ap.add_argument("--max-seconds", type=float, default=300.0,
                    help="time budget per scenario phase; stops early (fewer samples) past it")
    ap.add_argument("--proxy-cmd", help="command to run the proxy instead of `ctxproxy` "
                                        "(`serve --host --port` are appended)")
    ap.add_argument("--keep-log", metavar="PATH", help="copy the proxy's log to PATH")
    ap.add_argument("--litellm", action="store_true",
                    help="add LiteLLM's proxy as another target (installed into bench/.venvs/litellm on first use)")
    ap.add_argument("--litellm-requirement", default=LITELLM_REQUIREMENT, help=argparse.SUPPRESS)
    ap.add_argument("--serve-mock", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve_mock:
        return serve_mock()

    try:
        import uvloop
        uvloop.install()
        client_loop = "uvloop"
    except ImportError:
        client_loop = "asyncio"

    res: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.overhead", *sys.argv[1:]]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_facts(),
        "client_loop": client_loop,
        "target_added_median_ms": TARGET_ADDED_MEDIAN_MS,
    }
    with tempfile.TemporaryDirectory(prefix="ctxproxy-bench-") as tmp:
        procs = Processes(tmp, shlex.split(args.proxy_cmd) if args.proxy_cmd else None)
        try:
            res.update(asyncio.run(run(args, procs)))
        except BaseException:
            procs.stop()
            _print_log_tails(procs)
            raise
        procs.stop()
        res["proxy_command"] = " ".join(getattr(procs, "proxy_cmd_run", []))
        ids = res.pop("_request_ids", {})
        res["proxy_log"] = proxy_log_breakdown(procs.proxy_log, ids)
        if args.keep_log:
            shutil.copyfile(procs.proxy_log, args.keep_log)
        if procs.litellm is not None and os.path.exists(procs.litellm_log):
            with open(procs.litellm_log, errors="replace") as f:
                text = f.read()
            res.setdefault("litellm", {})["log_error_lines"] = sum(
                1 for line in text.splitlines() if "Traceback" in line or "ERROR" in line or "Exception" in line)
            res["litellm"]["log_tail"] = text[-1500:]
    res["floor_small_request"] = floor_added(res)
    res["floor_small_responses"] = floor_added(res, "small_responses")
    res["floor_small_messages"] = floor_added(res, "small_messages")
    res["floor_targets"] = floor_targets(res)
    samples = res.pop("samples_ms", {})
    print_report(res)
    if args.json:
        res["samples_ms"] = {k: {t: [round(x, 4) for x in xs] for t, xs in v.items()}
                             for k, v in samples.items()}
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
            f.write("\n")
        print(f"\nfigures written to {args.json}")
    return 0
