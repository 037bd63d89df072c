"""config.yaml → typed, validated settings with per-route overrides.

Shape: global `defaults` for every transform section, per-model facts, and a
list of routes that override any default. A route's effective section is the
deep merge of `defaults.<section>` and `routes[i].<section>`; each pipeline
transform declares the pydantic model of its own section (see
`proxy.rewrite.SECTION_MODELS`), so adding a transform never touches this file.

Invalid configuration fails at start with one line naming the key and the fault:
an unknown key with the nearest valid one (proxy/config_keys.py), settings that
cannot work together with both keys, at the place they were set (a route's own
section or the `defaults` it inherits).
Precedence, highest first: CLI flag, environment (`CTXPROXY_*`), file, built-in.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from proxy.config_keys import keys_at, unknown
from proxy.errors import ConfigError
from proxy.rewrite.settings import SECTION_MODELS, Impossible
from proxy.store.redis_url import SCHEMES as REDIS_SCHEMES
from proxy.store.redis_url import parse_redis_url
from proxy.wire.dialects import DIALECTS, dialect_of_host

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

RENAMED_SECTIONS = {"cache": "cache_hints"}  # old section name -> current; the old one still reads

DEFAULT_UPSTREAM = "https://api.openai.com/v1"
DEFAULT_STORE = "sqlite:///./ctxproxy.db"
# Deadline (seconds) of one store call. A store that does not answer in time counts as
# down: the request goes upstream unmodified (x-ctxproxy-degraded) instead of waiting.
# A healthy Redis or SQLite answers in well under a millisecond.
DEFAULT_STORE_TIMEOUT = 0.5
# Bytes of archived text (offloaded and cleared results, archived spans) one tenant may
# keep; past it, the tenant's oldest stored text is evicted first. 0 or null: unlimited.
DEFAULT_STORE_QUOTA_BYTES = 256 * 1024 * 1024
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
# Largest request body accepted (bytes). Agent histories with offloadable tool
# output reach a few MB; 32 MiB leaves room while bounding memory per request.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# Connection guards (server section). Headers come in one packet from any real
# client; a body of 32 MiB needs ~0.5 MB/s to arrive in 60 s; uvicorn's own
# keep-alive default; a sidecar serves one agent's connections, 2048 is ample.
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_KEEP_ALIVE_TIMEOUT = 5.0
DEFAULT_MAX_CONNECTIONS = 2048
DEFAULT_MAX_WEBSOCKETS = 512
DEFAULT_WEBSOCKET_IDLE_TIMEOUT = 900.0  # Codex keeps one socket per session between turns
DEFAULT_WEBSOCKET_QUEUE_BYTES = 1024 * 1024  # Codex sends its next turn after the answer: nothing queues
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
DEFAULT_ROUTE = "default"
# Context window assumed for a model found neither in `models:` nor in the
# built-in table (proxy/upstream/windows.py); a route may set its own `context_window`.
DEFAULT_CONTEXT_WINDOW = 128_000
ROUTE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class UpstreamSettings(_Strict):
    """Where a route forwards to, and with which credentials."""

    base_url: str = DEFAULT_UPSTREAM
    # The API the upstream speaks, a dialect's name (proxy/wire/dialects.py): "openai" (Chat Completions,
    # Responses), "anthropic" (Messages) or "google" (Gemini). Null: inferred from the host (api.openai.com,
    # api.anthropic.com, *.googleapis.com), else any (a gateway such as LiteLLM).
    api: str | None = None
    # None: forward the client's Authorization header. Otherwise the name of an
    # environment variable holding the key the proxy injects instead.
    api_key_env: str | None = None
    connect_timeout: float = Field(default=10.0, gt=0)  # seconds to open a connection
    read_timeout: float = Field(default=600.0, gt=0)  # seconds between bytes; long generations

    @field_validator("api")
    @classmethod
    def _known_api(cls, v: str | None) -> str | None:
        if v is not None and v not in DIALECTS:
            raise ValueError(f"must be one of {', '.join(DIALECTS)} (or null: inferred from base_url), got {v!r}")
        return v

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {v!r}")
        authority = v.split("://", 1)[1].split("/", 1)[0]
        if "@" in authority:
            # Credentials in the URL would ride on every request, and be printed wherever the URL is.
            raise ValueError("must not contain credentials (user:password@); put the key in an environment "
                             "variable and name it in api_key_env")
        if any(c <= " " or c == "\x7f" for c in v):
            raise ValueError("must not contain spaces or control characters")
        try:
            parts = urlsplit(v)
            parts.port  # noqa: B018 - raises for a port that is not a number in range
        except ValueError as e:
            raise ValueError(f"is not a valid URL ({e})") from None
        if not parts.hostname:
            raise ValueError(f"has no host: {v!r}")
        return v.rstrip("/")

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def speaks(self) -> str | None:
        """The name of the dialect this upstream takes; None: any (the request's path says which)."""
        if self.api is not None:
            return self.api
        return _api_of_url(self.base_url)


@functools.lru_cache(maxsize=256)  # a few configured upstreams, asked on every request (routing, headers)
def _api_of_url(base_url: str) -> str | None:
    """The dialect a provider's own host speaks (a urlsplit per request, without the cache)."""
    dialect = dialect_of_host(urlsplit(base_url).hostname or "")
    return dialect.name if dialect is not None else None


class Price(_Strict):
    """What a model's tokens cost, in US dollars per million, as the provider bills them (for figures in dollars)."""

    input: float = Field(ge=0)  # an uncached prompt token
    cached_input: float | None = Field(default=None, ge=0)  # a prompt token read from the cache; null: as input
    cache_write: float | None = Field(default=None, ge=0)  # a prompt token written to the cache; null: as input
    output: float = Field(default=0, ge=0)  # a completion token (reasoning included)


class ModelFacts(_Strict):
    """What the proxy cannot guess about a model."""

    context_window: int | None = Field(default=None, gt=0)
    encoding: Literal["o200k_base", "cl100k_base"] | None = None  # counts its tokens; null: by the model's name
    price: Price | None = None  # null: its figures are in tokens only


class RouteMatch(_Strict):
    model: str | None = None  # fnmatch glob on the request's `model`


class ServerSettings(_Strict):
    """How `ctxproxy serve` listens, and what bounds a client's connection (proxy/http/server.py)."""

    host: str = DEFAULT_HOST
    port: int = Field(default=DEFAULT_PORT, ge=1, le=65535)
    # A request body's bytes, as sent and (compressed: proxy/http/content_coding.py) as decoded; larger: 413.
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    # Seconds for a request's headers to arrive, from the connection opening; then it is closed.
    header_timeout: float = Field(default=DEFAULT_HEADER_TIMEOUT, gt=0)
    # Seconds for a whole request body to arrive, from its headers; then 408.
    body_timeout: float = Field(default=DEFAULT_BODY_TIMEOUT, gt=0)
    # Seconds an idle connection is kept open after a response.
    keep_alive_timeout: float = Field(default=DEFAULT_KEEP_ALIVE_TIMEOUT, gt=0)
    # Open connections (or requests in flight) at most; past that, 503 at once.
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, gt=0)
    max_header_bytes: int = Field(default=DEFAULT_MAX_HEADER_BYTES, gt=0)  # a request's headers, larger: 431
    # The Responses API over WebSocket (proxy/http/responses_ws.py): open sockets at most, seconds a socket
    # may sit with no request before it is closed, and the bytes of history one socket may hold.
    max_websockets: int = Field(default=DEFAULT_MAX_WEBSOCKETS, gt=0)
    websocket_idle_timeout: float = Field(default=DEFAULT_WEBSOCKET_IDLE_TIMEOUT, gt=0)
    websocket_history_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    # Bytes of frames a socket queues behind its running turn; past them it is not read until the turn ends.
    websocket_queue_bytes: int = Field(default=DEFAULT_WEBSOCKET_QUEUE_BYTES, gt=0)
    # Processes serving the one listening socket (proxy/cli/workers.py); the limits above are per worker.
    workers: int = Field(default=1, ge=1)
    # Browsers (proxy/http/local_guard.py): web origins whose pages may call the proxy (none: agents, SDKs and curl
    # send no Origin; "*": any), and names besides loopback, IP literals and `host` that name the proxy in `Host`
    # (fnmatch globs, e.g. a Kubernetes Service name), for requests trusted for where they come from.
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for origin in v:
            if origin != "*" and not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#\s]+/?", origin):
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], e.g. http://localhost:3000)")
        return tuple(o.lower().rstrip("/") for o in v)


class LoggingSettings(_Strict):
    level: str = "info"
    # The client's message content never reaches the log or the inspector's record unless this is on.
    log_content: bool = False

    @field_validator("level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return v.lower()


class Route(_Strict):
    """One route with its sections already merged over the global defaults."""

    name: str
    match: RouteMatch = RouteMatch()
    upstream: UpstreamSettings
    context_window: int = DEFAULT_CONTEXT_WINDOW  # for models the proxy knows nothing about
    # Anthropic's /v1/messages/count_tokens: "rewritten" counts what the proxy would send, "raw" the client's
    count_tokens: Literal["rewritten", "raw"] = "rewritten"
    # The context engine's calls (/v1/compress, from a gateway): true answers every one unchanged and records what
    # it would have done (a gateway's first step: see before it touches traffic)
    audit: bool = False
    sections: Mapping[str, BaseModel] = Field(default_factory=dict)

    def section(self, name: str) -> Any:
        return self.sections.get(name)


class Settings(_Strict):
    upstream: UpstreamSettings = UpstreamSettings()
    store: str = DEFAULT_STORE
    store_timeout: float = Field(default=DEFAULT_STORE_TIMEOUT, gt=0)
    store_quota_bytes: int | None = Field(default=DEFAULT_STORE_QUOTA_BYTES, ge=0)  # per tenant; 0/None: unlimited
    admin_token: str | None = None
    # Key for the tenant hash; replicas sharing a store must share it.
    tenant_salt: str = "ctxproxy-tenant-v1"
    server: ServerSettings = ServerSettings()
    logging: LoggingSettings = LoggingSettings()
    models: Mapping[str, ModelFacts] = Field(default_factory=dict)
    routes: tuple[Route, ...] = ()
    # The OTEL_* variables of the environment the settings were read from: tracing is configured from
    # these alone (proxy/telemetry/), so each app built from settings traces as its own settings say.
    otel_env: Mapping[str, str] = Field(default_factory=dict)
    # The upstream client honours the environment's HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY and SSL_CERT_FILE
    # as httpx and the provider SDKs do; off only for the replay's simulator, on loopback in its own process.
    trust_env: bool = True

    def route(self, name: str) -> Route | None:
        for r in self.routes:
            if r.name == name:
                return r
        return None


class _RouteFile(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    match: RouteMatch = RouteMatch()
    upstream: dict[str, Any] = Field(default_factory=dict)
    context_window: int | None = Field(default=None, gt=0)
    count_tokens: Literal["rewritten", "raw"] = "rewritten"
    audit: bool = False


class _ConfigFile(_Strict):
    upstream: dict[str, Any] = Field(default_factory=dict)
    store: str = DEFAULT_STORE
    store_timeout: float = Field(default=DEFAULT_STORE_TIMEOUT, gt=0)
    store_quota_bytes: int | None = Field(default=DEFAULT_STORE_QUOTA_BYTES, ge=0)
    admin_token_env: str | None = None
    tenant_salt: str = "ctxproxy-tenant-v1"
    server: ServerSettings = ServerSettings()
    logging: LoggingSettings = LoggingSettings()
    models: dict[str, ModelFacts] = Field(default_factory=dict)
    default_context_window: int = Field(default=DEFAULT_CONTEXT_WINDOW, gt=0)
    defaults: dict[str, dict[str, Any]] = Field(default_factory=dict)
    routes: list[_RouteFile] = Field(default_factory=list)


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _where(prefix: str, err: ErrorDetails) -> str:
    parts = [prefix] if prefix else []
    for p in err["loc"]:
        if isinstance(p, int):
            parts[-1:] = [f"{parts[-1]}[{p}]"] if parts else [f"[{p}]"]
        else:
            parts.append(str(p))
    return ".".join(parts)


def _validate(model: type[BaseModel], data: Any, prefix: str, source: str,
              blame: Callable[[tuple[str, ...]], str] | None = None) -> Any:
    """`model` from `data`, or a ConfigError naming the key; `blame(keys)`: the prefix where those keys were set."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        loc = tuple(err["loc"])
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            msg = unknown(str(loc[-1]), keys_at(model, loc[:-1]))
        error = (err.get("ctx") or {}).get("error")
        keys = error.keys if isinstance(error, Impossible) else tuple(str(p) for p in loc[:1])
        raise ConfigError(f"{source}: {_where(blame(keys) if blame else prefix, err)}: {msg}") from None


def _set_in(over: Mapping[str, Any], dotted: str) -> bool:
    """Whether a dotted key (`context.at`) is given in a section's mapping."""
    head, _, rest = dotted.partition(".")
    if head not in over:
        return False
    return not rest or (isinstance(over[head], Mapping) and _set_in(over[head], rest))


def _section_models() -> Mapping[str, type[BaseModel]]:
    return SECTION_MODELS


def _renamed(sections: Mapping[str, Any]) -> dict[str, Any]:
    """Sections under their current names (`cache` was `cache_hints`' name before)."""
    out = dict(sections)
    for old, new in RENAMED_SECTIONS.items():
        if old in out and new not in out:
            out[new] = out.pop(old)
    return out


def build_settings(raw: Mapping[str, Any] | None, env: Mapping[str, str] | None = None,
                   source: str = "config") -> Settings:
    """Validate a parsed config mapping (plus environment overrides) into Settings."""
    env = os.environ if env is None else env
    raw = dict(raw or {})
    if "CTXPROXY_STORE" in env:
        raw["store"] = env["CTXPROXY_STORE"]
    file = _validate(_ConfigFile, raw, "", source)
    upstream_raw = dict(file.upstream)
    if "CTXPROXY_UPSTREAM" in env:
        upstream_raw["base_url"] = env["CTXPROXY_UPSTREAM"]
    upstream = _validate(UpstreamSettings, upstream_raw, "upstream", source)
    server = file.server.model_dump()
    for key in ("host", "port", "workers"):
        if f"CTXPROXY_{key.upper()}" in env:
            server[key] = env[f"CTXPROXY_{key.upper()}"]
    server_s = _validate(ServerSettings, server, "server", f"{source} (or CTXPROXY_HOST/PORT/WORKERS)")
    if not file.store.startswith(("sqlite://", *(f"{s}://" for s in REDIS_SCHEMES))):
        scheme = file.store.split("://", 1)[0] if "://" in file.store else file.store[:20]
        raise ConfigError(f"{source}: store: expected sqlite:///path.db, redis://host:port/db, "
                          f"redis+cluster://host:port,... or redis+sentinel://host:port,.../service, "
                          f"got scheme {scheme!r}")
    if not file.store.startswith("sqlite://"):
        try:
            parse_redis_url(file.store)
        except ValueError as e:  # names the scheme or the option, never the URL (it may hold a password)
            raise ConfigError(f"{source}: store: {e}") from None

    models = _section_models()
    defaults = _renamed(file.defaults)
    for name in defaults:
        if name not in models:
            raise ConfigError(f"{source}: defaults.{name}: {unknown(name, [*models], 'section')}")

    routes: list[Route] = []
    route_files = list(file.routes)
    if not any(r.name == DEFAULT_ROUTE for r in route_files):
        route_files.append(_RouteFile(name=DEFAULT_ROUTE))
    seen: set[str] = set()
    for i, rf in enumerate(route_files):
        where = f"routes[{i}]"
        if not ROUTE_NAME.match(rf.name):
            raise ConfigError(f"{source}: {where}.name: only letters, digits, '.', '_' and '-' allowed, "
                              f"got {rf.name!r}")
        if rf.name in seen:
            raise ConfigError(f"{source}: {where}.name: duplicate route name {rf.name!r}")
        seen.add(rf.name)
        extra = _renamed(rf.model_extra or {})
        for name in extra:
            if name not in models:
                known = [*_RouteFile.model_fields, *models]
                raise ConfigError(f"{source}: {where}.{name}: {unknown(name, known)}")
        sections = {}
        for name, model in models.items():
            own = extra.get(name) or {}
            merged = _deep_merge(defaults.get(name, {}), own)

            def blame(keys: tuple[str, ...], own: Any = own, name: str = name, where: str = where) -> str:
                mine = isinstance(own, Mapping) and any(_set_in(own, k) for k in keys)
                return f"{where}.{name}" if mine or name not in defaults else f"defaults.{name}"
            sections[name] = _validate(model, merged, f"{where}.{name}", source, blame)
        route_up = _validate(UpstreamSettings, _deep_merge(upstream.model_dump(), rf.upstream),
                             f"{where}.upstream", source)
        routes.append(Route(name=rf.name, match=rf.match, upstream=route_up, sections=sections,
                            count_tokens=rf.count_tokens, audit=rf.audit,
                            context_window=rf.context_window or file.default_context_window))

    admin = env.get("CTXPROXY_ADMIN_TOKEN") or (env.get(file.admin_token_env) if file.admin_token_env else None)
    return Settings(upstream=upstream, store=file.store, store_timeout=file.store_timeout,
                    store_quota_bytes=file.store_quota_bytes or None, admin_token=admin or None,
                    tenant_salt=env.get("CTXPROXY_TENANT_SALT", file.tenant_salt), server=server_s,
                    logging=file.logging, models=file.models, routes=tuple(routes),
                    otel_env={k: v for k, v in env.items() if k.startswith("OTEL_")})


def load_settings(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read the config file (explicit path, else $CTXPROXY_CONFIG, else built-in defaults)."""
    env = os.environ if env is None else env
    path = path or env.get("CTXPROXY_CONFIG")
    if not path:
        return build_settings({}, env, source="built-in defaults")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config file: {e.strerror}") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{p}: not valid YAML{line}: {getattr(e, 'problem', e)}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(f"{p}: top level must be a mapping of settings")
    return build_settings(raw, env, source=str(p))
