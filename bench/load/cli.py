"""``python -m bench.load``: arguments, the run, the report, and the JSON and markdown files."""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
from typing import Any

from bench import hostile
from bench import load as package
from bench.load.config import FULL, QUICK, TARGET_STREAMS
from bench.load.mock import serve_mock
from bench.load.phases import run, run_hostile
from bench.load.processes import LoadProcesses
from bench.load.report import report
from bench.machine import machine_facts


def _parser() -> argparse.ArgumentParser:
    """The command line: the three phases' sizes, the mock's pace, the hostile run, outputs."""
    ap = argparse.ArgumentParser(description=(package.__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s per phase-1 run, 1 stream round, 15 s long run")
    ap.add_argument("--hostile", action="store_true", help="only the hostile-neighbour comparison (bench/hostile.py, "
                                                           "about a minute)")
    ap.add_argument("--hostile-concurrency", type=int, default=hostile.DEFAULTS["concurrency"],
                    help="small requests in flight in the hostile run (8)")
    ap.add_argument("--hostile-duration", type=float, default=hostile.DEFAULTS["duration"],
                    help="seconds per quiet or hostile run (12)")
    ap.add_argument("--hostile-rounds", type=int, default=hostile.DEFAULTS["rounds"],
                    help="quiet + hostile pairs (2)")
    ap.add_argument("--concurrency", default="16,64,128", help="phase-1 levels (default 16,64,128)")
    ap.add_argument("--duration", type=float, help="seconds per phase-1 run (15; quick 5)")
    ap.add_argument("--streams", type=int, default=TARGET_STREAMS, help="concurrent streams in phase 2")
    ap.add_argument("--stream-rounds", type=int, help="phase-2 batches per target (3; quick 1)")
    ap.add_argument("--agents", type=int, default=48, help="simulated agents in phase 3")
    ap.add_argument("--long-duration", type=float, help="seconds of phase 3 (60; quick 15)")
    ap.add_argument("--delay", type=float, default=0.05, help="mock: seconds before answering (0.05)")
    ap.add_argument("--chunk-delay", type=float, default=0.02, help="mock: seconds between stream chunks (0.02)")
    ap.add_argument("--no-profile", action="store_true", help="skip the py-spy run")
    ap.add_argument("--profile-seconds", type=float, help="py-spy duration (10; quick 5)")
    ap.add_argument("--keep-profile", metavar="PATH", help="copy py-spy's collapsed stacks to PATH")
    ap.add_argument("--proxy-cmd", help="command to run the proxy instead of `ctxproxy` "
                                        "(`serve --host --port` are appended)")
    ap.add_argument("--keep-log", metavar="PATH", help="copy the proxies' logs to PATH (phases 1-2) and PATH.2 "
                                                       "(phase 3)")
    ap.add_argument("--json", metavar="PATH", help="also write every figure (and the RSS samples) to PATH")
    ap.add_argument("--md", metavar="PATH", help="also write the report to PATH (markdown, figures in a code block)")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="hard limit for the whole run (600)")
    ap.add_argument("--serve-mock", action="store_true", help=argparse.SUPPRESS)
    return ap


def _json_safe(o: Any) -> Any:
    """NaN and infinities (no samples, no reading) as null, so the JSON file is standard JSON."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_json_safe(v) for v in o]
    return o


def _read_proxy_logs(procs: LoadProcesses, keep_log: str | None) -> int:
    """Warning, error and unparsed lines in every proxy's log; the logs copied to `keep_log` (PATH for the
    first proxy, PATH.2 for the phase-3 one) when asked."""
    warnings = 0
    for i, path in enumerate(procs.logs):
        with open(path, errors="replace") as f:
            for line in f:
                try:
                    level = json.loads(line).get("level")
                except ValueError:
                    level = "unparsed"
                warnings += level in ("warning", "error", "critical", "unparsed")
        if keep_log:
            shutil.copyfile(path, keep_log + (f".{i + 1}" if i else ""))
    return warnings


def main(argv: list[str] | None = None) -> int:
    """Run the three phases (or the hostile run), print the report, write the files asked for; 0 on success."""
    ap = _parser()
    args = ap.parse_args(argv)
    if args.serve_mock:
        return serve_mock()

    cfg = dict(QUICK if args.quick else FULL)
    for k in ("duration", "stream_rounds", "long_duration", "profile_seconds"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    for name, v in (("concurrency", min(args.concurrency, default=0)), ("streams", args.streams),
                    ("agents", args.agents)):
        if not 1 <= v <= 2000:
            ap.error(f"--{name} must be between 1 and 2000")

    try:
        import uvloop
        uvloop.install()
        client_loop = "uvloop"
    except ImportError:
        client_loop = "asyncio"

    res: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.load", *sys.argv[1:]]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_facts(), "client_loop": client_loop, "mode": "quick" if args.quick else "full",
        "config": cfg, "delay_ms": args.delay * 1000, "chunk_delay_ms": args.chunk_delay * 1000,
    }
    if args.hostile:
        res["mode"] = "hostile"
    with tempfile.TemporaryDirectory(prefix="ctxproxy-load-") as tmp:
        procs = LoadProcesses(tmp, shlex.split(args.proxy_cmd) if args.proxy_cmd else None)
        try:
            main_run = run_hostile(args, procs) if args.hostile else run(args, procs, cfg)
            res.update(asyncio.run(asyncio.wait_for(main_run, timeout=args.max_seconds)))
        except BaseException:
            procs.stop()
            if os.path.exists(procs.proxy_log):
                with open(procs.proxy_log, errors="replace") as f:
                    tail = f.read()[-3000:]
                print(f"--- last lines of the proxy's log ---\n{tail}", file=sys.stderr)
            raise
        procs.stop()
        res["proxy_command"] = " ".join(getattr(procs, "proxy_cmd_run", []))
        res["proxy_log_warnings"] = _read_proxy_logs(procs, args.keep_log)
        if args.hostile and procs.logs:
            res["hostile"]["big_overhead_ms"] = hostile.big_overheads(procs.logs[0])
    text = report(res)
    if res["proxy_log_warnings"]:
        text += f"\nnote: {res['proxy_log_warnings']} warning/error/unparsed lines in the proxy's log"
    print()
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(f"# Load benchmark ({res['date'][:10]})\n\n```\n{text}\n```\n")
        print(f"\nreport written to {args.md}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_json_safe(res), f, indent=1)
            f.write("\n")
        print(f"figures written to {args.json}")
    return 0
