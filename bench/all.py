#!/usr/bin/env python3
"""Every table of bench/RESULTS.md from one command, in one run, on one snapshot of the proxy.

    python bench/all.py [--out DIR] [--quick] [--skip NAME,...]

Why one command: the figures are only comparable when they come from the same
code on the same machine in the same sitting (these 2-core machines are
noisy), and a reader should be able to reproduce the published page without
piecing commands together. The proxy is snapshotted first (`git archive HEAD
proxy`), so editing the working tree while this runs changes nothing measured.

Steps, in order, each one a benchmark script run as a subprocess with its
stdout kept in DIR/<step>.txt and its JSON in DIR/<step>.json:

  replay-32k    replay.py --window 32000 --settings compress,ctxproxy-status-replace,frontier
  replay-128k   replay.py --window 128000 --settings compress,ctxproxy-status-replace
  offload       replay.py --settings offload (issue 3's check, 128k), and the same two ctxproxy
                settings with the status bar off
  overhead      overhead.py --litellm (direct / ctxproxy / LiteLLM interleaved)
  scaling       scaling.py (CPU per request, 10 to 1,000 messages)
  tokens        token_count.py
  plot          plot.py DIR/replay-32k.json -o DIR/results.png

The timing steps (overhead, scaling, tokens) run after the token-deterministic
replays, so nothing else of this script competes with them for the CPU. The
total is about 10 minutes (`--quick`: fewer timed requests, about 6).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def steps(out: str, src: str, quick: bool) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, argv, extra environment) of every step, in the order they run."""
    py = sys.executable
    snap_env = {"PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    replay = [py, os.path.join(HERE, "replay.py"), "--per-trace", "--quiet", "--proxy-src", src]
    return [
        ("replay-32k", replay + ["--window", "32000", "--settings", "compress,ctxproxy-status-replace,frontier",
                                 "--json", f"{out}/replay-32k.json"], {}),
        ("replay-128k", replay + ["--window", "128000", "--settings", "compress,ctxproxy-status-replace",
                                  "--json", f"{out}/replay-128k.json"], {}),
        ("offload", replay + ["--settings", "offload,ctxproxy+status_bar.enabled=false,"
                              "ctxproxy+status_bar.enabled=false+offload.tool_result_tokens=1000",
                              "--json", f"{out}/offload.json"], {}),
        ("overhead", [py, os.path.join(HERE, "overhead.py"), "--litellm", *(["--quick"] if quick else []),
                      "--proxy-cmd", f"{shlex.quote(py)} -m proxy.cli", "--json", f"{out}/overhead.json"], snap_env),
        ("scaling", [py, os.path.join(HERE, "scaling.py"), "--proxy-src", src, *(["--runs", "8"] if quick else []),
                     "--json", f"{out}/scaling.json"], {}),
        ("tokens", [py, os.path.join(HERE, "token_count.py")], snap_env),
        ("plot", [py, os.path.join(HERE, "plot.py"), f"{out}/replay-32k.json", "-o", f"{out}/results.png"], {}),
    ]


def snapshot(dest: str) -> str:
    """`git archive HEAD proxy` into dest; returns the commit measured."""
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "-C", ROOT, "archive", "HEAD", "proxy"], stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as t:
            t.extractall(dest, filter="data")
    return commit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"ctxproxy-bench-{stamp}"))
    ap.add_argument("--quick", action="store_true", help="fewer timed requests (overhead, scaling)")
    ap.add_argument("--skip", default="", help="comma-separated step names to leave out")
    args = ap.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    os.makedirs(args.out, exist_ok=True)
    src = os.path.join(args.out, "proxy-src")
    try:
        commit = snapshot(src)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"all.py: cannot snapshot the proxy with git archive ({e}); run it inside the repository",
              file=sys.stderr)
        return 2
    print(f"ctxproxy {commit}, snapshot in {src}; outputs in {args.out}", flush=True)
    failed = []
    for name, cmd, env in steps(args.out, src, args.quick):
        if name in skip:
            continue
        t0 = time.perf_counter()
        print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        with open(os.path.join(args.out, f"{name}.txt"), "w", encoding="utf-8") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env={**os.environ, **env}).returncode
        print(f"   {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.perf_counter() - t0:.0f} s: "
              f"{args.out}/{name}.txt", flush=True)
        if rc:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)} (their output files say why)", file=sys.stderr)
        return 1
    print(f"all done: tables in {args.out}/*.txt, plot {args.out}/results.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
