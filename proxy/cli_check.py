"""`ctxproxy check`: what a configuration will do, said before it serves; and what `serve` warns about at start.

Validating the file is not enough to know the proxy will work: `check` also
prints each route's effective window and thresholds and, unless `--offline`,
asks the store and each route's upstream (with a short timeout), so a dead
store is said out loud instead of quietly turning context management off.
"""

from __future__ import annotations

import re
import sys
from urllib.parse import urlsplit

from proxy.config import Settings
from proxy.errors import ProxyError
from proxy.http.routing import resolve_route
from proxy.redact import redact


def check(settings: Settings) -> None:
    print(f"store: {redact(settings.store)}")
    for r in settings.routes:
        glob = r.match.model or "-"
        key = f"key from ${r.upstream.api_key_env}" if r.upstream.api_key_env else "client's key"
        api = r.upstream.speaks() or "openai+anthropic"
        print(f"route {r.name}: model {glob} -> {redact(r.upstream.base_url)} ({api} API, {key})")
    for api, path in (("openai", "/v1/chat/completions, /v1/responses"), ("anthropic", "/v1/messages")):
        try:
            taker = resolve_route(settings, None, {}, None, api).name  # type: ignore[arg-type]
        except ProxyError:
            taker = None
        print(f"{path} without a route: " + (f"route {taker}" if taker else
              f"refused (no route's upstream speaks the {api} API; set upstream.api on one)"))
    for w in config_warnings(settings):
        print(f"warning: {w}", file=sys.stderr)


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
    return out


def startup_line(settings: Settings, source: str) -> str:
    """One line that says where requests will go, where state is kept and which config was read."""
    routes = ", ".join(f"{r.name} -> {redact(r.upstream.base_url)}" for r in settings.routes)
    return (f"ctxproxy: listening on http://{settings.server.host}:{settings.server.port}; routes: {routes}; "
            f"store: {redact(settings.store)}; config: {source}")
