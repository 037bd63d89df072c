"""`ctxproxy replay`: recorded agent trajectories through an in-process ctxproxy, turn by turn, against no proxy.

    ctxproxy replay [TRACE ...] [--simulate | --upstream URL] [--api chat|responses|messages] [--route NAME]
                    [--window N] [--config PATH] [--json] [--plot FILE.png] [--read-back]

Each assistant message of a trajectory is one turn: the agent's request (the
messages before it, with the tools) is sent through the proxy; the answer is
ignored. The same turns also go straight to a fresh provider simulator, and
the two are compared: rejections, prompt and cached tokens, hit rate and
effective cost (the proxy's own summarizer calls included).

With ``--simulate`` (the default without ``--upstream``) the provider is the
built-in simulator (proxy/replay/simulator.py): no key, no network, every figure
labelled as simulated. Without TRACE, ``--simulate`` replays the trajectories
shipped in proxy/examples/; a TRACE that is not a file may name one of them
(e.g. ``07`` or ``07_swe-agent_ctf_forensics-flash``).

``--api responses`` sends the turns as OpenAI Responses requests (``POST
/v1/responses``): chat trajectories are converted to Responses items
(proxy/replay/traces_responses.py). A trace recorded in the Responses API (the
shared traces-native format, ``api: "responses"``) is replayed as recorded,
one turn per tool output; it needs no ``--api`` and refuses ``--api chat``.

``--api messages`` sends them as Anthropic Messages requests (``POST
/v1/messages``, with ``max_tokens`` and Claude Code's cache breakpoints):
chat trajectories are converted (proxy/replay/traces_messages.py), and a trace
recorded in the Messages API (``api: "messages"``, Claude Code) is replayed as
recorded, one turn per message of tool results; it refuses the other APIs.
With ``--upstream`` the key comes from $ANTHROPIC_API_KEY (sent as
``x-api-key``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from proxy.replay.traces import Trace, TraceError, as_messages, as_responses, example_paths, load_trace

DEFAULT_WINDOW = 32_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", nargs="*", metavar="TRACE",
                   help="trajectory files (JSON: {\"messages\": [...], \"tools\": [...]} or a list of messages, or a "
                        "Responses or Messages trace {\"api\": \"responses\" | \"messages\", \"items\": [...], ...}); "
                        "none: the shipped examples (with --simulate)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--simulate", action="store_true",
                       help="use the built-in provider simulator (the default without --upstream): no key, no network")
    where.add_argument("--upstream", metavar="URL",
                       help="a real provider's base URL for the proxy (key from $OPENAI_API_KEY, or "
                            "$ANTHROPIC_API_KEY with --api messages); the no-proxy baseline stays simulated")
    p.add_argument("--api", choices=("chat", "responses", "messages"),
                   help="the API the turns are sent in: chat (POST /v1/chat/completions, the default), responses "
                        "(POST /v1/responses; chat trajectories are converted to Responses items) or messages "
                        "(Anthropic's POST /v1/messages; chat trajectories converted to Messages). A trace recorded "
                        "in the Responses or the Messages API is always replayed in it")
    p.add_argument("--route", metavar="NAME", help="send the turns to this route (/r/NAME/v1)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, metavar="N",
                   help=f"context window of the replayed models, for the proxy and the simulator "
                        f"(default {DEFAULT_WINDOW})")
    p.add_argument("--config", metavar="PATH", help="the proxy's config file (default: built-in defaults); its "
                                                     "upstreams and store are replaced for the replay")
    p.add_argument("--json", action="store_true", help="print one JSON document (per-turn rows and totals)")
    p.add_argument("--plot", metavar="FILE.png", help="write a PNG: context per turn with and without the proxy")
    p.add_argument("--read-back", action="store_true",
                   help="with --simulate: the simulated model reads each offloaded output back once (a context_read "
                        "call the proxy answers in a hidden round), as a model that wants the rest would")


class _Fail(Exception):
    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _api_name(api: str) -> str:
    return {"chat": "Chat Completions", "responses": "Responses", "messages": "Messages"}.get(api, api)


def _resolve(arg: str) -> Path:
    p = Path(arg)
    if p.exists():
        return p
    examples = example_paths()
    hits = [e for e in examples if e.stem == arg or e.name == arg] or [e for e in examples if e.stem.startswith(arg)]
    return hits[0] if len(hits) == 1 else p


def load_traces(args: argparse.Namespace) -> list[Trace]:
    names = args.traces
    if not names:
        if args.upstream:
            raise _Fail("name the TRACE files to send to --upstream (the shipped examples replay only with "
                        "--simulate)", 2)
        paths = example_paths()
    else:
        paths = [_resolve(a) for a in names]
    traces = []
    api = args.api
    for arg, path in zip(names or [str(p) for p in paths], paths):
        try:
            trace = load_trace(path)
        except TraceError as e:
            hint = ""
            if not path.exists() and names:
                hint = f" (shipped examples: {', '.join(x.stem for x in example_paths())})"
            raise _Fail(f"cannot read trace {arg}: {e}{hint}") from None
        if trace.native and api is not None and api != trace.api:
            raise _Fail(f"trace {arg} was recorded in the {_api_name(trace.api)} API: replay it with --api "
                        f"{trace.api}", 2)
        traces.append(as_responses(trace) if api == "responses" else as_messages(trace) if api == "messages"
                      else trace)
    seen: dict[str, int] = {}
    for t in traces:  # two traces of one name: keep their rows apart
        seen[t.name] = seen.get(t.name, 0) + 1
        if seen[t.name] > 1:
            t.name = f"{t.name}#{seen[t.name]}"
    return traces


@contextmanager
def _progress(enabled: bool, total_base: int, total_proxy: int) -> Iterator[tuple[Callable[[], None],
                                                                                   Callable[[], None]]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=Console(stderr=True), transient=True, disable=not enabled)
    with progress:
        a = progress.add_task("no proxy (simulator)", total=total_base)
        b = progress.add_task("through ctxproxy    ", total=total_proxy)
        yield (lambda: progress.advance(a)), (lambda: progress.advance(b))


def run(args: argparse.Namespace) -> int:
    from proxy.errors import ConfigError
    from proxy.replay import drive, output
    from proxy.replay.plot import LEGEND, plot
    from proxy.replay.sim_prompt import ENCODING
    from proxy.tokens.encodings import TokenizerUnavailable, ensure_encodings, get_encoding

    if args.window < 1000:
        raise _Fail(f"--window must be at least 1000 tokens, got {args.window}", 2)
    if args.plot and not args.plot.lower().endswith(".png"):
        raise _Fail(f"--plot writes a PNG: give a file name ending in .png, got {args.plot!r}", 2)
    traces = load_traces(args)
    try:
        ensure_encodings()
        get_encoding(ENCODING)
    except TokenizerUnavailable as e:
        raise _Fail(str(e)) from None
    simulated = not args.upstream
    authorization = f"Bearer {drive.SIMULATED_KEY}" if simulated else (
        f"Bearer {os.environ['OPENAI_API_KEY']}" if os.environ.get("OPENAI_API_KEY") else None)
    anthropic_key = drive.SIMULATED_KEY if simulated else os.environ.get("ANTHROPIC_API_KEY")
    n = sum(len(t.turns()) for t in traces)
    live = sys.stderr.isatty() and not args.json
    try:
        with _progress(live, n, n) as (tick_base, tick_proxy):
            base_sides, base_sim = drive.no_proxy(traces, args.window, f"Bearer {drive.SIMULATED_KEY}", tick_base)
            run_ = drive.through_proxy(traces, args.window, upstream=args.upstream, config=args.config,
                                       route=args.route, authorization=authorization, tick=tick_proxy,
                                       anthropic_key=anthropic_key, read_back=args.read_back)
    except ConfigError as e:
        raise _Fail(f"invalid configuration: {e}", 2) from None
    except drive.ReplayError as e:
        raise _Fail(str(e), e.code) from None
    turns, k = [], 0
    for trace in traces:
        for j, i in enumerate(trace.turns(), 1):
            turns.append(drive.Turn(trace.name, j, i, i, drive.client_tokens(trace, i), base_sides[k],
                                    run_.sides[k]))
            k += 1
    base = drive.totals_of(base_sides, base_sim.log)
    proxy = drive.totals_of(run_.sides, run_.log)
    plot_info = None
    if args.plot:
        separators, acc = [], 0
        for trace in traces[:-1]:
            acc += len(trace.turns())
            separators.append(acc)
        title = ("ctxproxy replay - simulated" if simulated else "ctxproxy replay") + f" - window {args.window}"
        try:
            backend = plot(args.plot, [t.no_proxy.prompt for t in turns], [t.ctxproxy.prompt for t in turns],
                           args.window, separators, title,
                           rejected=[k for k, t in enumerate(turns, 1) if t.no_proxy.rejected],
                           compactions=[k for k, t in enumerate(turns, 1) if t.ctxproxy.actions.get("compacted")])
        except OSError as e:
            raise _Fail(f"cannot write {args.plot}: {e.strerror or e}") from None
        plot_info = {"path": args.plot, "backend": backend, "legend": LEGEND}
    common = dict(traces=traces, turns=turns, base=base, proxy=proxy, both=drive.both_answered(turns),
                  simulated=simulated, upstream=args.upstream, window=args.window, proxy_log=run_.proxy_log,
                  plot=plot_info)
    if args.json:
        doc = output.json_document(**common, config=args.config, route=args.route)
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 140, highlight=False)
        output.print_report(console, **common)
    return 0


def main(args: argparse.Namespace) -> int:
    """Entry point from proxy.cli: one line on stderr and a non-zero status on failure, never a traceback."""
    try:
        return run(args)
    except _Fail as e:
        print(f"ctxproxy: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def parse(argv: list[str]) -> argparse.Namespace:
    """For tests and `python -m proxy.replay`."""
    p = argparse.ArgumentParser(prog="ctxproxy replay")
    add_arguments(p)
    return p.parse_args(argv)


__all__ = ["Trace", "add_arguments", "load_traces", "main", "parse", "run"]
