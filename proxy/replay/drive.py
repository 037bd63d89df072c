"""Sending recorded turns: straight to a fresh simulator (the "no proxy" baseline) and through an in-process ctxproxy.

The proxy is the real application (`proxy.app.create_app`) with the user's
configuration (or the built-in defaults), a temporary SQLite store, every
route's upstream pointed at the simulator (or at ``--upstream``), and the
replayed models' window set to ``--window``. It runs under uvicorn on a free
127.0.0.1 port in a thread, and the turns reach it over real HTTP, one after
the other, as an agent sends them: each trace in its API (``POST
/v1/chat/completions``, ``POST /v1/responses`` or ``POST /v1/messages``,
proxy/replay/traces.py). Messages requests carry Anthropic's headers
(``x-api-key``, ``anthropic-version``) instead of ``Authorization``.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import orjson

from proxy.replay.proxy_setup import proxy_settings, quiet_logs
from proxy.replay.simulator import SimRecord, Simulator
from proxy.replay.threaded_server import ThreadedServer
from proxy.replay.traces import Trace
from proxy.tokens.counter import default_counter
from proxy.wire.usage import parse_usage

if TYPE_CHECKING:
    from proxy.state import ProxyState

SIMULATED_KEY = "sk-ctxproxy-simulated"  # the Authorization the replay sends to the simulator (no real key)
CACHED_PRICE = 0.1  # a cached prompt token costs about a tenth of an uncached one
OWN_KINDS = ("summary", "facts")
_RESULTED_IN = re.compile(r"resulted in ([\d,]+) tokens|requested ([\d,]+) tokens")
# Anthropic's two context-window errors (400 invalid_request_error, no code): the prompt, then the window.
_ANTHROPIC_WINDOW = re.compile(r"^(?:prompt is too long: ([\d,]+) tokens > [\d,]+ maximum|input length and "
                               r"`max_tokens` exceed context limit: ([\d,]+) \+ [\d,]+ > [\d,]+)")
ANTHROPIC_VERSION = "2023-06-01"


class ReplayError(Exception):
    """One line for stderr; `code` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Side:
    """One turn as one side (no proxy / ctxproxy) got it."""

    status: int | None = None  # the HTTP status the agent got (None: no answer at all)
    error: str | None = None  # the error code, e.g. "context_length_exceeded"
    prompt: int | None = None  # tokens of the agent's request as the provider counted them (billed or not)
    cached: int | None = None  # cached tokens the provider reported for it
    billed: bool = False  # the provider accepted (and billed) it
    provider_requests: int | None = None  # agent requests the provider received for this turn (retries included)
    own_calls: int = 0  # the proxy's own calls (summarizer) made during this turn
    own_prompt: int = 0
    own_cached: int = 0
    actions: dict[str, Any] = field(default_factory=dict)  # what ctxproxy did, from its response headers

    @property
    def rejected(self) -> bool:
        return self.error == "context_length_exceeded"


@dataclass
class Turn:
    trace: str
    turn: int  # 1-based within its trace
    index: int  # the assistant message this request was answered with (Responses: the items sent)
    messages: int  # messages the agent sent (Responses: input items)
    client_tokens: int  # proxy.tokens.counter.default_counter.count_request of what the agent sent
    no_proxy: Side
    ctxproxy: Side

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Totals:
    turns: int = 0
    answered: int = 0  # turns answered with HTTP 200
    rejected: int = 0  # turns answered with context_length_exceeded
    failed: int = 0  # other errors
    provider_requests: int | None = 0  # every request the provider received, the proxy's own included
    prompt_tokens: int = 0  # billed: accepted requests only, the proxy's own calls included
    cached_tokens: int = 0
    own_calls: int = 0
    own_prompt_tokens: int = 0
    own_cached_tokens: int = 0
    offloads: int = 0
    compactions: dict[str, int] = field(default_factory=dict)  # by layer
    cache_breaks: int = 0
    status_bars: int = 0
    read_rounds: int = 0  # hidden context_read rounds the proxy answered

    @property
    def hit_rate(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def effective_cost(self) -> float:
        return self.prompt_tokens - self.cached_tokens + CACHED_PRICE * self.cached_tokens

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["hit_rate"] = None if self.hit_rate is None else round(self.hit_rate, 4)
        out["effective_cost"] = round(self.effective_cost, 1)
        return out


def totals_of(sides: Sequence[Side], log: Sequence[SimRecord] | None) -> Totals:
    """Per side; with the simulator's log, every request it received counts (the log is the bill)."""
    t = Totals(turns=len(sides))
    for s in sides:
        t.answered += s.status == 200
        t.rejected += s.rejected
        t.failed += s.status != 200 and not s.rejected
        t.offloads += int(s.actions.get("offloaded_new", 0))  # each counted once, by the turn that stored it
        if s.actions.get("compacted"):
            t.compactions[s.actions["compacted"]] = t.compactions.get(s.actions["compacted"], 0) + 1
        t.cache_breaks += bool(s.actions.get("cache_break"))
        t.status_bars += bool(s.actions.get("status_bar"))
        t.read_rounds += int(s.actions.get("read_rounds", 0))
    if log is not None:
        billed = [r for r in log if r.billed]
        own = [r for r in billed if r.kind in OWN_KINDS]
        t.provider_requests = len(log)
        t.prompt_tokens = sum(r.prompt_tokens for r in billed)
        t.cached_tokens = sum(r.cached_tokens for r in billed)
        t.own_calls = sum(1 for r in log if r.kind in OWN_KINDS)
        t.own_prompt_tokens = sum(r.prompt_tokens for r in own)
        t.own_cached_tokens = sum(r.cached_tokens for r in own)
    else:  # a real upstream: what its responses and the proxy's accounting say
        t.provider_requests = None
        t.prompt_tokens = sum(s.prompt or 0 for s in sides if s.billed) + sum(s.own_prompt for s in sides)
        t.cached_tokens = sum(s.cached or 0 for s in sides if s.billed) + sum(s.own_cached for s in sides)
        t.own_calls = sum(s.own_calls for s in sides)
        t.own_prompt_tokens = sum(s.own_prompt for s in sides)
        t.own_cached_tokens = sum(s.own_cached for s in sides)
    return t


def both_answered(turns: Sequence[Turn]) -> dict[str, Any]:
    """Prompt, cached tokens and effective cost over only the turns both sides answered (a like-for-like bill)."""
    pairs = [t for t in turns if t.no_proxy.status == 200 and t.ctxproxy.status == 200]

    def bill(sides: list[Side]) -> dict[str, Any]:
        prompt = sum((s.prompt or 0) + s.own_prompt for s in sides)
        cached = sum((s.cached or 0) + s.own_cached for s in sides)
        return {"prompt_tokens": prompt, "cached_tokens": cached,
                "effective_cost": round(prompt - cached + CACHED_PRICE * cached, 1)}

    return {"turns": len(pairs), "no_proxy": bill([t.no_proxy for t in pairs]),
            "ctxproxy": bill([t.ctxproxy for t in pairs])}


# --------------------------------------------------------------------------- the baseline

def no_proxy(traces: Sequence[Trace], window: int, authorization: str,
             tick: Callable[[], None]) -> tuple[list[Side], Simulator]:
    """Every turn straight to a fresh simulator, in process."""
    sim = Simulator(window)
    sides = []
    answers = {"chat": sim.complete, "responses": sim.respond, "messages": sim.messages}
    for trace in traces:
        for i in trace.turns():
            status, body = answers[trace.api](trace.request(i), authorization)
            rec = sim.log[-1]
            err = body.get("error") if status != 200 else None
            sides.append(Side(status=status, error=error_code(err)[0] if isinstance(err, dict) else None,
                              prompt=rec.prompt_tokens, cached=rec.cached_tokens if rec.billed else None,
                              billed=rec.billed, provider_requests=1))
            tick()
    return sides, sim


# --------------------------------------------------------------------------- the proxy


def _actions(headers: httpx.Headers) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if headers.get("x-ctxproxy-offloaded"):
        out["offloaded"] = int(headers["x-ctxproxy-offloaded"])  # placeholders in effect in this turn
        out["offloaded_new"] = int(headers.get("x-ctxproxy-offloaded-new") or 0)  # stored by this turn
        out["offload_saved"] = int(headers.get("x-ctxproxy-tokens-saved") or 0)
    if headers.get("x-ctxproxy-compacted"):
        out["compacted"] = headers["x-ctxproxy-compacted"]
        out["tokens_before"] = int(headers.get("x-ctxproxy-tokens-before") or 0)
        out["tokens_after"] = int(headers.get("x-ctxproxy-tokens-after") or 0)
    if headers.get("x-ctxproxy-status-bar"):
        out["status_bar"] = True
    if int(headers.get("x-ctxproxy-read-rounds") or 0):
        out["read_rounds"] = int(headers["x-ctxproxy-read-rounds"])
    if headers.get("x-ctxproxy-cache-break"):
        out["cache_break"] = headers["x-ctxproxy-cache-break"]
    if headers.get("x-ctxproxy-window-learned"):
        out["window_learned"] = int(headers["x-ctxproxy-window-learned"])
    if headers.get("x-ctxproxy-degraded"):
        out["degraded"] = headers["x-ctxproxy-degraded"]
    return out


def error_code(err: dict[str, Any]) -> tuple[str, int | None]:
    """An error object's code (Anthropic's window errors, which have none, as "context_length_exceeded") and
    the prompt size its message states, if any."""
    message = str(err.get("message") or "")
    if m := _ANTHROPIC_WINDOW.match(message):
        return "context_length_exceeded", int((m.group(1) or m.group(2)).replace(",", ""))
    m = _RESULTED_IN.search(message)
    return str(err.get("code") or err.get("type") or "error"), int((m.group(1) or m.group(2)).replace(",", "")) \
        if m else None


def _error_code(content: bytes) -> tuple[str | None, int | None]:
    try:
        err = orjson.loads(content).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return "unreadable_error", None
    if not isinstance(err, dict):
        return "error", None
    return error_code(err)


@dataclass
class ProxyRun:
    sides: list[Side]
    log: list[SimRecord] | None  # the simulator's log (None with a real upstream)
    proxy_log: list[str]
    sessions: list[str]


def through_proxy(traces: Sequence[Trace], window: int, *, upstream: str | None, config: str | None,
                  route: str | None, authorization: str | None, tick: Callable[[], None],
                  anthropic_key: str | None = None, read_back: bool = False) -> ProxyRun:
    """Every turn through an in-process ctxproxy, to a fresh simulator (upstream None) or to `upstream`.

    `authorization` goes with chat and Responses turns, `anthropic_key` (as x-api-key) with Messages turns.
    """
    from proxy.app import create_app

    simulate = upstream is None
    sim = Simulator(window, read_back=read_back) if simulate else None
    with tempfile.TemporaryDirectory(prefix="ctxproxy-replay-") as tmp, quiet_logs() as logs:
        sim_server = ThreadedServer(sim, lifespan="off", name="simulator") if sim else None
        try:
            base = (sim_server.start() + "/v1") if sim_server else str(upstream)
            apis = sorted({"anthropic" if t.api == "messages" else "openai" for t in traces})
            settings = proxy_settings(config, base, tmp, sorted({t.model for t in traces}), window, simulate, apis)
            if route and settings.route(route) is None:
                known = ", ".join(r.name for r in settings.routes)
                raise ReplayError(f"unknown route {route!r}; configured routes: {known}", code=2)
            prefix = f"/r/{route}/v1" if route else "/v1"
            headers = {"content-type": "application/json"}
            per_api = {"chat": {"authorization": authorization} if authorization else {},
                       "responses": {"authorization": authorization} if authorization else {},
                       "messages": {"anthropic-version": ANTHROPIC_VERSION,
                                    **({"x-api-key": anthropic_key} if anthropic_key else {})}}
            with ThreadedServer(create_app(settings), name="ctxproxy") as proxy, \
                    httpx.Client(base_url=proxy.url, headers=headers, trust_env=False,  # loopback: no env proxy
                                 timeout=httpx.Timeout(900.0, connect=10.0)) as client:
                sides, ids, sessions = [], [], []
                credentials: dict[str, dict[str, str]] = {}  # session -> the headers its turns were sent with
                for n, trace in enumerate(traces, 1):
                    # One session per recorded run: two runs that open alike (same system prompt and first
                    # user message) would otherwise share the session the proxy derives from them.
                    sid = {"x-session-id": f"replay-{n}-{trace.name}"[:200], **per_api[trace.api]}
                    path = prefix + _PATHS[trace.api]
                    for i in trace.turns():
                        before = len(sim.log) if sim else 0
                        side, rid, session = _send(client, path, trace.request(i), sid)
                        if sim:
                            _from_log(side, sim.log[before:])
                        sides.append(side)
                        ids.append(rid)
                        if session and session not in sessions:
                            sessions.append(session)
                            credentials[session] = per_api[trace.api]
                        tick()
                _summaries_written(proxy.app.state.proxy)  # the provider bills them, used or not
                if not simulate:
                    _own_calls_from_timeline(client, sessions, ids, sides, credentials)
        except RuntimeError as e:  # a server that did not start
            raise ReplayError(str(e)) from None
        finally:
            if sim_server:
                sim_server.stop()
    return ProxyRun(sides, list(sim.log) if sim else None, logs.lines, sessions)


_PATHS = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}


def _send(client: httpx.Client, path: str, body: dict[str, Any],
          headers: dict[str, str]) -> tuple[Side, str | None, str | None]:
    try:
        r = client.post(path, content=orjson.dumps(body), headers=headers)
    except httpx.HTTPError as e:
        return Side(status=None, error=f"no answer from the proxy ({type(e).__name__}: {e})"), None, None
    side = Side(status=r.status_code, actions=_actions(r.headers))
    if r.status_code == 200:
        try:
            u = parse_usage(orjson.loads(r.content).get("usage"))
        except (orjson.JSONDecodeError, AttributeError):
            u = None
        side.billed = True
        if u is not None:
            side.prompt, side.cached = u.prompt, u.cached
    else:
        side.error, side.prompt = _error_code(r.content)
    return side, r.headers.get("x-ctxproxy-request-id"), r.headers.get("x-ctxproxy-session")


def _from_log(side: Side, records: Sequence[SimRecord]) -> None:
    """What the simulator received during this turn: the agent's request(s) and the proxy's own calls."""
    agent = [r for r in records if r.kind not in OWN_KINDS]
    own = [r for r in records if r.kind in OWN_KINDS]
    side.provider_requests = len(agent)
    if agent:
        last = agent[-1]
        side.prompt, side.billed = last.prompt_tokens, last.billed
        side.cached = last.cached_tokens if last.billed else None
        if len(agent) > 1:
            side.actions["retried"] = len(agent) - 1
    else:
        side.prompt, side.cached, side.billed = None, None, False
    side.own_calls = len(own)
    side.own_prompt = sum(r.prompt_tokens for r in own if r.billed)
    side.own_cached = sum(r.cached_tokens for r in own if r.billed)


def _summaries_written(state: ProxyState) -> None:
    """Wait out the background summaries the last turns started (proxy/rewrite/compress/precompute.py): each is
    in the provider's bill and the proxy's figures once answered, whether or not a turn used it."""
    longest = state.summarizing()
    deadline = time.monotonic() + longest
    while longest and time.monotonic() < deadline:
        time.sleep(0.01)
        longest = state.summarizing()


def _own_calls_from_timeline(client: httpx.Client, sessions: list[str], ids: list[str | None],
                             sides: list[Side], credentials: dict[str, dict[str, str]]) -> None:
    """With a real upstream, the proxy's own calls come from its accounting (written in the background): each is a
    timeline entry of its own (proxy/accounting/own_calls.py), told to the turn that made it (`started_by`)."""
    wanted = {rid for rid in ids if rid}
    entries: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for s in sessions:
            try:
                r = client.get(f"/ctx/v1/sessions/{s}", headers=credentials.get(s) or {})
                if r.status_code == 200:
                    for e in r.json().get("requests") or []:
                        entries[e.get("request_id")] = e
            except (httpx.HTTPError, ValueError):
                pass
        if wanted <= entries.keys():
            break
        time.sleep(0.1)
    own: dict[str, list[dict[str, Any]]] = {}
    for e in entries.values():
        if e.get("started_by"):
            own.setdefault(e["started_by"], []).append(e)
    for rid, side in zip(ids, sides):
        calls = own.get(rid or "", [])
        side.own_calls = sum(int(e.get("own_calls") or 0) for e in calls)
        side.own_prompt = sum(int(e.get("own_prompt") or 0) for e in calls)
        side.own_cached = sum(int(e.get("own_cached") or 0) for e in calls)


def client_tokens(trace: Trace, i: int) -> int:
    """ctxproxy's own count of what the agent sent for turn `i` (proxy/tokens/counter.py); for a Responses request
    its input items, tools and instructions; for a Messages request its messages, tools and system."""
    body = trace.request(i)
    if trace.api == "messages":
        n = default_counter.count_messages(body["messages"], trace.model)
        n += default_counter.count_tools(body.get("tools"), trace.model)
        system = body.get("system")
        texts = [system] if isinstance(system, str) else [b.get("text", "") for b in system or []
                                                         if isinstance(b, dict)]
        return n + sum(default_counter.count_text(t, trace.model) for t in texts if t)
    if trace.api != "responses":
        return default_counter.count_request(body)
    n = default_counter.count_messages(body["input"], trace.model) + default_counter.count_tools(body.get("tools"),
                                                                                                  trace.model)
    return n + (default_counter.count_text(trace.instructions, trace.model) if trace.instructions else 0)
