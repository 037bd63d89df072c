"""What `ctxproxy replay` prints: per-turn tables and the totals (rich), or one JSON document."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from proxy.replay.drive import CACHED_PRICE, Side, Totals, Turn
from proxy.replay.traces import Trace


def banner_lines(simulated: bool, upstream: str | None, window: int) -> list[str]:
    if simulated:
        return ["SIMULATION: no model was called and no API key was used.",
                "provider: ctxproxy's built-in simulator (proxy/replay/simulator.py), "
                f"context window {window:,} tokens:",
                "          o200k_base token counts, OpenAI-style prefix caching, \"ok\" answers, extractive summaries",
                "no proxy: the same turns sent straight to a fresh simulator"]
    return [f"provider: {upstream} (real; its own figures), context window set to {window:,} tokens",
            f"no proxy: SIMULATED, the same turns counted by ctxproxy's built-in simulator (window {window:,})"]


API_NAMES = {"chat": "Chat Completions (POST /v1/chat/completions)", "responses": "Responses (POST /v1/responses)",
             "messages": "Anthropic Messages (POST /v1/messages; cached at cache_control breakpoints, as Anthropic "
                         "caches)"}


def api_of(traces: Sequence[Trace]) -> str:
    """The API the replay sent its turns in: "chat", "responses", or both ("chat+responses")."""
    return "+".join(sorted({t.api for t in traces})) or "chat"


def api_line(traces: Sequence[Trace]) -> str:
    """Which API the turns were sent in, and for Responses / Messages how many traces were converted from chat."""
    parts = []
    for api in sorted({t.api for t in traces}):
        part = API_NAMES[api]
        if api in ("responses", "messages"):
            group = [t for t in traces if t.api == api]
            native = sum(t.native for t in group)
            notes = ([f"{native} recorded in it"] if native else []) + \
                ([f"{len(group) - native} converted from chat"] if native < len(group) else [])
            part += f" ({', '.join(notes)})"
        parts.append(part)
    return "API replayed: " + "; ".join(parts)


def banner(simulated: bool, upstream: str | None, window: int) -> str:
    return " ".join(" ".join(line.split()) for line in banner_lines(simulated, upstream, window))


def _n(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _did(side: Side) -> str:
    a, out = side.actions, []
    if a.get("offloaded"):
        out.append(f"offloaded {a['offloaded']} (-{a.get('offload_saved', 0):,})")
    if a.get("read_rounds"):
        out.append(f"read back {a['read_rounds']}")
    if a.get("compacted"):
        out.append(f"compacted: {a['compacted']} {a.get('tokens_before', 0):,}->{a.get('tokens_after', 0):,}")
    if side.own_calls:
        out.append(f"summarizer x{side.own_calls} ({side.own_prompt:,} tok)")
    if a.get("retried"):
        out.append(f"retried x{a['retried']} after the provider's 400")
    if a.get("window_learned"):
        out.append(f"learned window {a['window_learned']:,}")
    if a.get("cache_break"):
        out.append(f"cache break ({a['cache_break']})")
    if a.get("degraded"):
        out.append(f"degraded ({a['degraded']})")
    if a.get("status_bar"):
        out.append("status bar")
    return "; ".join(out) or "passed through"


def _sent(side: Side) -> Text:
    if side.status == 200:
        return Text(_n(side.prompt))
    if side.rejected:
        return Text.assemble(("REJECTED ", "bold red"), _n(side.prompt))
    return Text(f"error {side.status or ''} {side.error or ''}".strip(), style="red")


def turn_table(trace: Trace, turns: Sequence[Turn]) -> Table:
    unit = "items" if trace.api == "responses" else "messages"  # (Messages: its own messages, merged by role)
    t = Table(title=f"{trace.name}  |  model {trace.model}  |  {trace.api}  |  {len(trace.entries)} {unit}, "
                    f"{len(turns)} turns",
              title_justify="left", box=box.SIMPLE_HEAD, row_styles=["", "dim"] if len(turns) > 12 else None,
              pad_edge=False)
    t.add_column("turn", justify="right")
    t.add_column("msgs", justify="right")
    t.add_column("agent sent", justify="right")
    t.add_column("no proxy\nprovider got", justify="right", style="red")
    t.add_column("no proxy\ncached", justify="right")
    t.add_column("ctxproxy\nprovider got", justify="right", style="blue")
    t.add_column("ctxproxy\ncached", justify="right")
    t.add_column("what ctxproxy did", overflow="fold", ratio=1)
    for row in turns:
        t.add_row(str(row.turn), str(row.messages), _n(row.client_tokens), _sent(row.no_proxy),
                  _n(row.no_proxy.cached), _sent(row.ctxproxy), _n(row.ctxproxy.cached), _did(row.ctxproxy))
    return t


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _change(a: float, b: float) -> str:
    if not a:
        return "-"
    return f"{(b - a) / a * 100:+.1f}%"


def totals_table(base: Totals, proxy: Totals, traces: int, both: dict[str, Any]) -> Table:
    t = Table(title=f"totals over {base.turns} turns of {traces} trace{'s' if traces != 1 else ''}",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("")
    t.add_column("no proxy", justify="right", style="red")
    t.add_column("ctxproxy", justify="right", style="blue")
    t.add_column("change", justify="right")
    t.add_row("turns answered", f"{base.answered}/{base.turns}", f"{proxy.answered}/{proxy.turns}", "")
    t.add_row("rejected (context_length_exceeded)", str(base.rejected), str(proxy.rejected), "")
    if base.failed or proxy.failed:
        t.add_row("other errors", str(base.failed), str(proxy.failed), "")
    t.add_row("provider requests (proxy's own included)", _n(base.provider_requests), _n(proxy.provider_requests), "")
    t.add_row("prompt tokens billed", _n(base.prompt_tokens), _n(proxy.prompt_tokens),
              _change(base.prompt_tokens, proxy.prompt_tokens))
    t.add_row("cached tokens", _n(base.cached_tokens), _n(proxy.cached_tokens),
              _change(base.cached_tokens, proxy.cached_tokens))
    t.add_row("hit rate (cached / prompt)", _pct(base.hit_rate), _pct(proxy.hit_rate), "")
    t.add_row(f"effective cost (uncached + {CACHED_PRICE:g} x cached)", f"{base.effective_cost:,.1f}",
              f"{proxy.effective_cost:,.1f}", _change(base.effective_cost, proxy.effective_cost))
    t.add_row("  of which the proxy's own calls", "-",
              f"{proxy.own_calls} calls, {proxy.own_prompt_tokens:,} prompt tok", "")
    if both["turns"] < max(base.turns, proxy.turns):
        a, b = both["no_proxy"]["effective_cost"], both["ctxproxy"]["effective_cost"]
        t.add_row(f"  over only the {both['turns']} turns both answered", f"{a:,.1f}", f"{b:,.1f}", _change(a, b))
    layers = ", ".join(f"{k} {v}" for k, v in sorted(proxy.compactions.items())) or "0"
    t.add_row("offloads / compactions / cache breaks", "-",
              f"{proxy.offloads} / {layers} / {proxy.cache_breaks}", "")
    if proxy.read_rounds:
        t.add_row("hidden read rounds (context_read)", "-", f"{proxy.read_rounds}", "")
    return t


def print_report(console: Console, *, traces: Sequence[Trace], turns: Sequence[Turn], base: Totals, proxy: Totals,
                 both: dict[str, Any], simulated: bool, upstream: str | None, window: int, proxy_log: Sequence[str],
                 plot: dict[str, Any] | None) -> None:
    for line in [*banner_lines(simulated, upstream, window), api_line(traces)]:
        console.print(Text(line, style="bold yellow" if line.startswith("SIMULATION") else "yellow"))
    console.print()
    for trace in traces:
        console.print(turn_table(trace, [t for t in turns if t.trace == trace.name]))
    console.print(totals_table(base, proxy, len(traces), both))
    notes = []
    if base.rejected:
        notes.append(f"\"no proxy\" billed only the {base.answered} turns the provider accepted; its "
                     f"{base.rejected} rejected turn{'s' if base.rejected != 1 else ''} would have stopped the agent.")
    worse = [f"{t.trace} turn {t.turn}" for t in turns if t.no_proxy.status == 200 and t.ctxproxy.status != 200]
    if worse:
        notes.append(f"Through ctxproxy, {len(worse)} turn{'s' if len(worse) != 1 else ''} failed that the provider "
                     f"accepted without it: {', '.join(worse[:5])}{', ...' if len(worse) > 5 else ''}.")
    if simulated:
        notes.append("agent sent: ctxproxy's own count of the request (proxy/tokens/counter.py); "
                     "provider got: the simulator's "
                     "prompt_tokens (its own rendering).")
    if plot:
        notes.append(f"Plot: {plot['path']} ({plot['backend']}; {plot['legend']}).")
    if proxy_log:
        notes.append(f"The proxy logged {len(proxy_log)} warning(s)/error(s); first: {proxy_log[0]}")
    for note in notes:
        warn = note.startswith(("The proxy logged", "Through ctxproxy"))
        console.print(Text(note, style="yellow" if warn else "dim"))


def json_document(*, traces: Sequence[Trace], turns: Sequence[Turn], base: Totals, proxy: Totals,
                  both: dict[str, Any], simulated: bool,
                  upstream: str | None, window: int, config: str | None, route: str | None,
                  proxy_log: Sequence[str], plot: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "simulated": simulated,
        "note": banner(simulated, upstream, window),
        "provider": "ctxproxy-simulator" if simulated else upstream,
        "baseline": "ctxproxy-simulator",
        "window": window,
        "api": api_of(traces),
        "config": config,
        "route": route,
        "cached_price": CACHED_PRICE,
        "traces": [{"name": t.name, "path": t.path, "model": t.model, "api": t.api, "native": t.native,
                    "messages": len(t.entries),
                    "turns": len(t.turns()), "tools": len(t.tools or []), "license": t.meta.get("license"),
                    "source": t.meta.get("source")} for t in traces],
        "turns": [t.to_json() for t in turns],
        "totals": {"no_proxy": base.to_json(), "ctxproxy": proxy.to_json(), "both_answered": both},
        "proxy_log": list(proxy_log),
        "plot": plot,
    }
