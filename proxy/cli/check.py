"""`ctxproxy check`: what a configuration will do, said before it serves; and what `serve` warns about at start.

Validating the file is not enough to know the proxy will work: `check` also
prints each route's effective window and thresholds and, unless `--offline`,
asks the store and each route's upstream (with a short timeout), so a dead
store is said out loud instead of quietly turning context management off.
"""

from __future__ import annotations

import re
import sys
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from proxy.cli import probe
from proxy.config import Route, Settings
from proxy.engine.routing import resolve_route
from proxy.errors import ProxyError
from proxy.redact import redact, redact_url
from proxy.upstream.windows import BUILTIN_WINDOWS
from proxy.wire.apis import APIS


def _tokens(n: float) -> str:
    return f"{int(n):,}"


def route_lines(settings: Settings, r: Route) -> list[str]:
    """A route's effective window and thresholds, as its transforms will apply them (the settings' own methods)."""
    w = r.context_window
    out = [f"  window: {_tokens(w)} tokens for a model neither in models: nor in the built-in table"]
    mine = [(m, f.context_window) for m, f in settings.models.items()
            if f.context_window and r.match.model and fnmatchcase(m, r.match.model)]
    if mine:
        out.append("  its models: " + ", ".join(f"{m} {_tokens(n)}" for m, n in mine))
    off, comp = r.section("offload"), r.section("compress")
    if off is not None and off.enabled:
        out.append(f"  offload: tool results over {_tokens(off.threshold('tool', w))} tokens, user messages over "
                   f"{_tokens(off.threshold('user', w))} (at this window)")
    else:
        out.append("  offload: off")
    if comp is not None and comp.enabled:
        pre = f"precompute at {comp.precompute:.0%} ({_tokens(comp.precompute * w)})" \
            if comp.precompute is not None and comp.precompute < comp.trigger else "no precompute"
        summary = ("summary by " + (comp.summary_model or "the request's model")) if comp.summary else "no summary"
        out.append(f"  compress: trigger {comp.trigger:.0%} ({_tokens(comp.trigger * w)} tokens), target "
                   f"{comp.target:.0%} ({_tokens(comp.target * w)}), newest {_tokens(comp.recent_tokens(w))} kept "
                   f"verbatim, {pre}, {summary}")
    else:
        out.append("  compress: off")
    read, bar, hints = (r.section(n) for n in ("context_read", "status_bar", "cache_hints"))
    out.append("  " + "; ".join((
        f"context_read: {read.rounds} rounds" if read is not None and read.enabled else "context_read: off",
        f"status_bar: {bar.mode}, full every {bar.full_every} turns" if bar is not None and bar.enabled
        else "status_bar: off",
        f"cache_hints: key {hints.prompt_cache_key}, breakpoints {hints.breakpoints}"
        if hints is not None and hints.enabled else "cache_hints: off")))
    return out


def check(settings: Settings, offline: bool = False) -> int:
    """Print what the configuration will do; 0, or 1 when the store does not answer (the reason on stderr)."""
    store_problem = None if offline else probe.store_problem(settings.store)
    state = "not asked (--offline)" if offline else ("answers" if store_problem is None else "UNREACHABLE")
    print(f"store: {redact_url(settings.store)}: {state}")
    facts = [f"{m} {_tokens(f.context_window)}" for m, f in settings.models.items() if f.context_window]
    print("model windows, from models: " + (", ".join(facts) or "none"))
    print("  built-in: " + ", ".join(f"{g} {_tokens(n)}" for g, n in BUILTIN_WINDOWS))
    print("  a provider's context-length error teaches the real window, per route and model")
    reached = {} if offline else probe.upstream_problems(sorted({r.upstream.base_url for r in settings.routes}))
    for r in settings.routes:
        glob = r.match.model or "-"
        key = f"key from ${r.upstream.api_key_env}" if r.upstream.api_key_env else "client's key"
        api = r.upstream.speaks() or "openai+anthropic"
        print(f"route {r.name}: model {glob} -> {redact_url(r.upstream.base_url)} ({api} API, {key})")
        if not offline:
            why = reached.get(r.upstream.base_url)
            print("  upstream: " + ("answers" if why is None else redact(f"UNREACHABLE ({why})")))
        for line in route_lines(settings, r):
            print(line)
    for dialect in dict.fromkeys(a.codec.dialect for a in APIS):
        api, path = dialect.name, next(a.path for a in APIS if a.codec.dialect is dialect)
        try:  # what a request there would be told, word for word
            said = f"route {resolve_route(settings, None, {}, None, api).name}"
        except ProxyError as refused:
            said = f"refused with 400: {refused.message}"
        print(f"{path} without a route: {said}")
    warnings = config_warnings(settings)
    warnings += [f"route {r.name}: upstream {r.upstream.base_url} is unreachable: {why}; its requests will fail "
                 f"with 502 until it answers" for r in settings.routes if (why := reached.get(r.upstream.base_url))]
    for w in warnings:
        print(redact(f"warning: {w}"), file=sys.stderr)
    if store_problem is not None:
        why = store_problem.rstrip(".")
        print(redact(f"ctxproxy: store {redact_url(settings.store)} is unreachable: {why}; requests would be "
                     f"forwarded unmodified (no offload, compression or status bar)"), file=sys.stderr)
        return 1
    return 0


_VERSION_PATH = re.compile(r"/v\d+[a-z0-9]*(?:/|$)", re.IGNORECASE)


def config_warnings(settings: Settings) -> list[str]:
    """What is valid but probably not meant: said at start-up and by `check`, never fatal."""
    out = []
    for r in settings.routes:
        base = r.upstream.base_url
        host = (urlsplit(base).hostname or "").lower()
        for api, domain in (("anthropic", "openai.com"), ("openai", "anthropic.com")):
            if r.upstream.api == api and (host == domain or host.endswith("." + domain)):
                out.append(f"route {r.name}: upstream.api is {api}, but {base} is {domain}'s; requests of that "
                           f"API will be refused there")
        if not _VERSION_PATH.search(urlsplit(base).path):
            out.append(f"route {r.name}: upstream {base} has no version path such as /v1; chat requests will go "
                       f"to {base}/chat/completions (most providers want {base}/v1)")
        comp = r.section("compress")
        if comp is not None and comp.enabled and comp.summary and comp.precompute is not None \
                and comp.precompute >= comp.trigger:
            out.append(f"route {r.name}: compress.precompute ({comp.precompute:g}, its default) is not below "
                       f"compress.trigger ({comp.trigger:g}): no summary is written ahead; set it below the "
                       f"trigger, or null")
    return out


def startup_line(settings: Settings, source: str) -> str:
    """One line that says where requests will go, where state is kept and which config was read."""
    routes = ", ".join(f"{r.name} -> {redact_url(r.upstream.base_url)}" for r in settings.routes)
    workers = f" with {settings.server.workers} workers" if settings.server.workers > 1 else ""
    return (f"ctxproxy: listening on http://{settings.server.host}:{settings.server.port}{workers}; routes: {routes}; "
            f"store: {redact_url(settings.store)}; config: {source}")
