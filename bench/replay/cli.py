"""``python -m bench.replay``: the arguments, the run over every setting, and what is printed and written."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from typing import Any

from bench import replay as package
from bench.paths import ROOT, TRACES_ENV, default_traces_dir, traces_dir
from bench.replay.apis import CHAT, MESSAGES, RESPONSES, AnyTrace, Api
from bench.replay.costs import cost_criteria, cost_markdown
from bench.replay.criteria import compare, compression_criteria, offload_criteria, over_trigger_traces
from bench.replay.native import default_native_dir, load_native, load_native_messages
from bench.replay.run import replay_setting
from bench.replay.settings import (
    BASELINE,
    COMPRESS_SETTINGS,
    DEFAULT_SETTINGS,
    SETTING_GROUPS,
    SETTINGS,
    STATUS_BAR_SETTINGS,
    derived_setting,
)
from bench.replay.tables import (
    api_markdown,
    available,
    compaction_detail,
    compress_markdown,
    compress_per_trace_markdown,
    corpus_label,
    criteria_markdown,
    markdown,
    per_trace_markdown,
    ranking_markdown,
    rejected_detail,
    status_bar_markdown,
)
from bench.replay.traces import load_traces
from tests import mock_upstream as mu


def git_state() -> dict[str, Any]:
    """HEAD of this repository and whether proxy/ differs from it (parallel edits)."""
    def git(*a: str) -> str:
        try:
            return subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"head": git("rev-parse", "HEAD"),
            "proxy_dirty": bool(git("status", "--porcelain", "--", "proxy"))}


def machine() -> dict[str, Any]:
    """Python, platform, CPU count and the date, for the JSON file."""
    return {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}


def load_native_has(directory: str, api: str, select: list[str] | None) -> bool:
    """Whether `directory` holds a native session of `api` (`--api both/all` skips a kind it has none of)."""
    if api == "messages":
        return bool(load_native_messages(directory, select))
    try:
        return bool(load_native(directory, select))
    except SystemExit:
        return False


def _setting_names(ap: argparse.ArgumentParser, spec: str) -> list[str]:
    """The settings `--settings` names, groups expanded, in order, each registered (derived ones on the fly)."""
    names = []
    for s in (x.strip() for x in spec.split(",")):
        names += SETTING_GROUPS.get(s, [s] if s else [])
    names = list(dict.fromkeys(names))
    for n in names:
        if n not in SETTINGS:
            try:
                derived_setting(n)
            except ValueError as e:
                ap.error(str(e))
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        ap.error(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)} "
                 f"(groups: {', '.join(SETTING_GROUPS)})")
    return names


def _print_compress_report(results: list[dict[str, Any]], ok: list[dict[str, Any]], checks: list[dict[str, Any]],
                           subset: list[str], window: int) -> None:
    """The compression tables: settings side by side, the ranking, the checks, the status bar, compactions."""
    print(compress_markdown(results, subset))
    print()
    print(cost_markdown(results))
    verdict = ranking_markdown(results)
    if verdict:
        print()
        print(verdict)
    if checks:
        print()
        print(criteria_markdown(checks, "compression check"))
    sb = status_bar_markdown(results)
    if sb:
        print()
        print(sb)
    print(f"\ntrajectories over the trigger (0.85 x {window:,}) as the client sends them: "
          f"{', '.join(subset) or 'none'}")
    for r in ok:
        if r["setting"] != BASELINE and (r["total"]["cache_breaks"] or r["total"]["proxy_calls"]
                                         or r["total"]["compactions"]):
            print()
            print(compaction_detail(r))
    for r in results:
        if "total" not in r:
            print(f"\n{r['setting']}: not run, {r['unavailable']['stage']} failed:\n{r['unavailable']['error']}")
    print()


def main(argv: list[str] | None = None) -> int:
    """Replay every trajectory through each setting named, print the tables; 0 on success."""
    ap = argparse.ArgumentParser(description=(package.__doc__ or "").split("\n\n")[0])
    ap.add_argument("--window", type=int, default=mu.DEFAULT_WINDOW, help="the mock's context window for gpt-4o")
    ap.add_argument("--settings", default=",".join(DEFAULT_SETTINGS),
                    help=f"comma-separated, from: {', '.join(SETTINGS)}; or a group: "
                         + "; ".join(f"{k} = {','.join(v)}" for k, v in SETTING_GROUPS.items()))
    ap.add_argument("--traces", default="", help="comma-separated trajectory ids (01,19); default all")
    ap.add_argument("--traces-dir", default=default_traces_dir(),
                    help=f"the trajectory corpus (default ${TRACES_ENV})")
    ap.add_argument("--json", dest="json_path", help="write all results (with per-request rows) here")
    ap.add_argument("--proxy-mode", choices=("subprocess", "inprocess"), default="subprocess")
    ap.add_argument("--final-turn", action="store_true",
                    help="also send each whole trajectory that ends on a tool/user message (the next turn)")
    ap.add_argument("--proxy-src", help="directory with the proxy package to run (subprocess mode), e.g. a "
                                        "`git archive HEAD proxy` snapshot; default: the installed one")
    ap.add_argument("--per-trace", action="store_true", help="also print the per-trajectory table")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    ap.add_argument("--api", choices=("chat", "responses", "messages", "both", "all"), default="chat",
                    help="replay in chat completions (default), the Responses API (the chat corpus converted to "
                         "Responses items, and the native Codex sessions), Anthropic's Messages API (the chat "
                         "corpus converted, and the native Claude Code sessions), both (chat and Responses) or "
                         "all three, side by side")
    ap.add_argument("--native", default=None,
                    help="the native sessions (Codex: Responses; Claude Code: Messages) replayed in their API "
                         "(default: shared/traces-native beside the repository, else traces-native beside the "
                         "corpus; 'none': skip them)")
    ap.add_argument("--native-traces", default="", help="comma-separated native session ids (01,03,08); "
                                                         "default all")
    args = ap.parse_args(argv)

    names = _setting_names(ap, args.settings)
    corpus_dir = traces_dir(args.traces_dir)
    traces = load_traces(corpus_dir, [s for s in args.traces.split(",") if s.strip()] or None)
    groups: list[tuple[Api, str, list[AnyTrace]]] = []
    native_dir = default_native_dir(corpus_dir) if args.native is None else args.native
    if native_dir == "none":
        native_dir = None
    if native_dir and not os.path.isdir(native_dir):
        ap.error(f"--native {native_dir!r} is not a directory")
    native_ids = [s for s in args.native_traces.split(",") if s.strip()] or None
    if args.api in ("chat", "both", "all"):
        groups.append((CHAT, "trajectories", list(traces)))
    if args.api in ("responses", "both", "all"):
        groups.append((RESPONSES, "trajectories", list(traces)))
        if native_dir and (args.api == "responses" or load_native_has(native_dir, "responses", native_ids)):
            groups.append((RESPONSES, "native", list(load_native(native_dir, native_ids))))
    if args.api in ("messages", "all"):
        groups.append((MESSAGES, "trajectories", list(traces)))
        claude = load_native_messages(native_dir, native_ids) if native_dir else []
        if claude:
            groups.append((MESSAGES, "native", list(claude)))
        elif native_dir:
            print(f"replay: no Claude Code session (api: messages) in {native_dir}", file=sys.stderr)

    t0 = time.perf_counter()
    results = []
    with mu.MockUpstream() as mock:
        for api, corpus, group in groups:
            for name in names:
                results.append(replay_setting(SETTINGS[name], group, mock, args.window, args.proxy_mode,
                                              final_turn=args.final_turn, progress=not args.quiet,
                                              proxy_src=args.proxy_src, api=api, corpus=corpus))
    runtime = time.perf_counter() - t0
    compress_mode = any(n in COMPRESS_SETTINGS[1:] + STATUS_BAR_SETTINGS for n in names)
    criteria: list[dict[str, Any]] = []
    compress_checks: list[dict[str, Any]] = []
    subsets: dict[str, list[str]] = {}
    for api, corpus, group in groups:
        part = [r for r in results if r["api"] == api.name and r["corpus"] == corpus]
        ok = available(part)
        compare(ok)
        # the offload checks are about the default 128k window; at another window they would mislead
        crit = offload_criteria(ok) if args.window == mu.DEFAULT_WINDOW else []
        subset = over_trigger_traces(group, args.window, args.final_turn, api=api) if compress_mode else []
        checks = compression_criteria(part, args.window, subset) + cost_criteria(part, args.window) \
            if compress_mode else []
        for c in crit + checks:
            c.update(api=api.name, corpus=corpus)
        criteria += crit
        compress_checks += checks
        subsets[f"{api.name}/{corpus}"] = subset
        if len(groups) > 1:
            print(f"## {api.name} API, {corpus_label(api.name, corpus)} ({len(group)} conversations, "
                  f"{sum(len(t.turns(args.final_turn)) for t in group)} requests per setting)\n")
        if compress_mode:
            _print_compress_report(part, ok, checks, subset, args.window)
        print(markdown(ok, crit))
        if args.per_trace:
            print()
            print(compress_per_trace_markdown(ok, subset) if compress_mode else per_trace_markdown(ok))
        for r in part:  # (compress mode lists them in its report; chat alone keeps its output as it was)
            if "total" not in r and not compress_mode and len(groups) > 1:
                print(f"\n{r['setting']}: not run, {r['unavailable']['stage']}: {r['unavailable']['error']}")
        if len(groups) > 1:
            print()
    if len(groups) > 1:
        names = list(dict.fromkeys({"chat": "chat", "responses": "Responses", "messages": "Messages"}[a.name]
                                   for a, _, _ in groups))
        print(f"## {' and '.join([', '.join(names[:-1]), names[-1]])} side by side\n" if len(names) > 1
              else f"## {names[0]}: the chat corpus and the native sessions side by side\n")
        print(api_markdown(results))
        detail = rejected_detail(results)
        if detail:
            print("\nrequests rejected through a proxy (turn = messages or input items sent):")
            print(detail)
    print(f"\n{len(traces)} trajectories, {sum(len(t.turns(args.final_turn)) for t in traces)} requests per setting "
          f"({'with' if args.final_turn else 'without'} final turns), window {args.window:,}, "
          f"proxy {args.proxy_mode}; "
          + "".join(f"{len(g)} {corpus_label(a.name, c)} ({sum(len(t.turns(args.final_turn)) for t in g)} requests "
                    "per setting); " for a, c, g in groups if c == "native")
          + f"total runtime {runtime:.1f}s")
    if args.json_path:
        command = shlex.join([sys.executable, "-m", "bench.replay", *sys.argv[1:]]) if argv is None else argv
        out = {"command": command,
               "window": args.window, "proxy_mode": args.proxy_mode, "final_turn": args.final_turn,
               "api": args.api, "proxy_src": os.path.abspath(args.proxy_src) if args.proxy_src else None,
               "git": git_state(), "machine": machine(),
               "over_trigger_traces": next(iter(subsets.values()), []), "over_trigger_traces_by_api": subsets,
               "runtime_s": round(runtime, 2), "criteria": criteria, "criteria_compress": compress_checks,
               "results": results}
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)
    return 0
