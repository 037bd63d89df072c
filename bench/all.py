"""Every table of bench/RESULTS.md from one command, in one run, on one snapshot of the proxy.

    python -m bench.all [--out DIR] [--quick] [--skip NAME,...] [--traces-dir DIR]

Why one command: the figures are only comparable when they come from the same
code on the same machine in the same sitting (these 2-core machines are
noisy), and a reader should be able to reproduce the published page without
piecing commands together. The proxy is snapshotted first (`git archive HEAD
proxy`), so editing the working tree while this runs changes nothing measured.

Steps, in order, each one a benchmark module run as a subprocess
(``python -P -m bench.<name>``) with its stdout kept in DIR/<step>.txt and its
JSON in DIR/<step>.json:

  replay-32k    bench.replay --window 32000 --settings compress,ctxproxy+status_bar.mode=append,frontier
  replay-128k   bench.replay --window 128000 --settings compress,ctxproxy+status_bar.mode=append
  offload       bench.replay --settings offload (the offload checks, 128k), and the same two ctxproxy
                settings with the status bar off
  overhead      bench.overhead (direct / ctxproxy / floor interleaved: issue 27's floor targets, as checked)
  overhead-litellm  the same with LiteLLM in the rotation (the peer's latency and throughput beside ours)
  scaling       bench.scaling (CPU per request, 10 to 1,000 messages)
  tokens        bench.token_count
  precompute    bench.precompute (what the request crossing the trigger waits), and precompute-think at 1.5 s
  workers       bench.workers (1 against 2 workers on Redis; needs Redis on 127.0.0.1:6379)
  exact-json    bench.exact_json (the exact parse of a body full of long digit runs, against orjson)
  plot          bench.plot DIR/replay-32k.json -o DIR/results.png

Every step runs with ``PYTHONPATH=<snapshot>:<repository>``: ``proxy`` is
imported from the snapshot, ``bench`` and ``tests`` from the repository; ``-P``
keeps the current directory (the working tree, with its own ``proxy/``) off
the front of the import path, so it cannot shadow the snapshot. The trajectory
corpus is ``--traces-dir``, default ``$CTXPROXY_TRACES_DIR``.

The timing steps (overhead, scaling, tokens, precompute, workers) run after the
token-deterministic replays, so nothing else of this script competes with them
for the CPU. The floor targets come from a run without LiteLLM, as the issue
checks them: LiteLLM spends about 18 ms of CPU per request on the same two
cores, and with it in the rotation the mock's and the client's own CPU per
request came out about twice as high (2026-12-03), which moves every ratio. The total is
about 20 minutes (`--quick`: fewer timed requests, about 12).
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

from bench.paths import PROXY_CLI, ROOT, TRACES_ENV, default_traces_dir, traces_dir


def module(name: str) -> list[str]:
    """argv of one benchmark module: `python -P -m bench.<name>` (see the module docstring for -P)."""
    return [sys.executable, "-P", "-m", f"bench.{name}"]


def step_env(src: str, corpus: str) -> dict[str, str]:
    """The environment every step adds: the snapshot, then the repository, on the import path; the corpus."""
    path = os.pathsep.join(filter(None, [src, ROOT, os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, TRACES_ENV: corpus}


def steps(out: str, src: str, quick: bool) -> list[tuple[str, list[str]]]:
    """(name, argv) of every step, in the order they run."""
    py = sys.executable
    replay = module("replay") + ["--per-trace", "--quiet", "--proxy-src", src]
    return [
        ("replay-32k", replay + ["--window", "32000", "--settings",
                                 "compress,ctxproxy+status_bar.mode=append,frontier",
                                 "--json", f"{out}/replay-32k.json"]),
        ("replay-128k", replay + ["--window", "128000", "--settings", "compress,ctxproxy+status_bar.mode=append",
                                  "--json", f"{out}/replay-128k.json"]),
        ("offload", replay + ["--settings", "offload,ctxproxy+status_bar.enabled=false,"
                              "ctxproxy+status_bar.enabled=false+offload.tool_result_tokens=1000",
                              "--json", f"{out}/offload.json"]),
        ("overhead", module("overhead") + [*(["--quick"] if quick else []),
                                           "--proxy-cmd", f"{shlex.quote(py)} -m {PROXY_CLI}",
                                           "--json", f"{out}/overhead.json"]),
        ("overhead-litellm", module("overhead") + ["--litellm", *(["--quick"] if quick else []),
                                                   "--proxy-cmd", f"{shlex.quote(py)} -m {PROXY_CLI}",
                                                   "--json", f"{out}/overhead-litellm.json"]),
        ("scaling", module("scaling") + ["--proxy-src", src, *(["--runs", "8"] if quick else []),
                                         "--json", f"{out}/scaling.json"]),
        ("tokens", module("token_count")),
        ("precompute", module("precompute") + ["--json", f"{out}/precompute.json"]),
        ("precompute-think", module("precompute") + ["--think", "1.5", "--json", f"{out}/precompute-think.json"]),
        ("workers", module("workers") + [*(["--rounds", "2"] if quick else []), "--json", f"{out}/workers.json"]),
        ("exact-json", module("exact_json")),
        ("plot", module("plot") + [f"{out}/replay-32k.json", "-o", f"{out}/results.png"]),
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
    """Snapshot the proxy, run every step not skipped; 0 when all succeeded."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), f"ctxproxy-bench-{stamp}"))
    ap.add_argument("--quick", action="store_true", help="fewer timed requests (overhead, scaling)")
    ap.add_argument("--skip", default="", help="comma-separated step names to leave out")
    ap.add_argument("--traces-dir", default=default_traces_dir(), help=f"the trajectory corpus (default ${TRACES_ENV})")
    args = ap.parse_args(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    corpus = os.path.abspath(traces_dir(args.traces_dir))
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    src = os.path.join(args.out, "proxy-src")
    try:
        commit = snapshot(src)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"bench.all: cannot snapshot the proxy with git archive ({e}); run it inside the repository",
              file=sys.stderr)
        return 2
    print(f"ctxproxy {commit}, snapshot in {src}; outputs in {args.out}", flush=True)
    failed = []
    env = {**os.environ, **step_env(src, corpus)}
    for name, cmd in steps(args.out, src, args.quick):
        if name in skip:
            continue
        t0 = time.perf_counter()
        print(f"== {name}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        with open(os.path.join(args.out, f"{name}.txt"), "w", encoding="utf-8") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env).returncode
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
