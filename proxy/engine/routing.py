"""Request → route, tenant and session.

The tenant is a keyed hash of the client's API key, never the key itself; every
stored thing is namespaced by it. The session is the one the client names:
`X-Session-Id`, else the agent's own session header (Claude Code's
`X-Claude-Code-Session-Id`, opencode's `session-id`, Codex's `session_id`), else
the conversation its body names (`prompt_cache_key`, Claude Code's
`metadata.user_id`, a Responses `conversation`); else it is derived from what
every turn of one agent run re-sends unchanged: tenant, route, system
message(s) and the first user message. A Claude Code subagent (its request
class, sent with `CLAUDE_CODE_GATEWAY_HINT_HEADERS=1`) is a session of its own,
named after its parent's: `<parent>/agent-<id>`.

A request trusted for where it comes from (a route that injects the operator's
key) must name the proxy in its `Host` (proxy/http/local_guard.py says why).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from fnmatch import fnmatchcase
from urllib.parse import unquote_plus

from proxy.config import DEFAULT_ROUTE, Route, ServerSettings, Settings
from proxy.errors import BadRequest, NotFound, ProxyError
from proxy.request import Conversation
from proxy.wire.dialects import DIALECTS, OPENAI

ROUTE_HEADER = "x-ctx-route"
SESSION_HEADER = "x-session-id"
# Agents' own names for their conversation, in the order they are read: Claude Code's, opencode's, Codex's.
AGENT_SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "session_id")
REQUEST_CLASS_HEADER = "x-claude-code-request-class"  # main, subagent, compaction, auxiliary, ... (hint headers)
AGENT_ID_HEADER = "x-claude-code-agent-id"
_ANONYMOUS = "anonymous"
_MAX_SESSION_ID = 200  # characters of a client-given session id


API = str  # a dialect's name (proxy/wire/dialects.py)


def injected_key(route: Route) -> tuple[str, str] | None:
    """The operator's key for the route's upstream (`api_key_env`), in the header its dialect reads it from
    (OpenAI's Authorization when the upstream may speak any)."""
    key = route.upstream.api_key()
    if not key:
        return None
    return DIALECTS[route.upstream.speaks() or OPENAI.name].key(key)


def _takes(route: Route, api: API | None) -> bool:
    speaks = route.upstream.speaks()
    return api is None or speaks is None or speaks == api


def resolve_route(settings: Settings, path_route: str | None, headers: Mapping[str, str],
                  model: str | None, api: API | None = None) -> Route:
    """Path prefix, else `X-Ctx-Route`, else first `match.model` glob, else `default`.

    `api`: the API the client speaks. A route named by path or header whose
    upstream speaks another is refused with a message saying so (no translation
    between APIs). Otherwise the first route that takes it: Claude Code sets only
    a base URL, so its bare /v1/messages finds the route whose upstream is Anthropic's.
    """
    for name, how in ((path_route, "path /r/{route}/v1"), (headers.get(ROUTE_HEADER), "header X-Ctx-Route")):
        if name:
            route = settings.route(name)
            if route is None:
                known = ", ".join(r.name for r in settings.routes)
                raise NotFound(f"unknown route {name!r} (from {how}); configured routes: {known}",
                               code="route_not_found")
            if not _takes(route, api):
                raise _wrong_api(settings, route, api)
            return route
    if model:
        for route in settings.routes:
            if route.match.model and fnmatchcase(model, route.match.model) and _takes(route, api):
                return route
    route = settings.route(DEFAULT_ROUTE)
    assert route is not None  # build_settings always adds it
    if _takes(route, api):
        return route
    for other in settings.routes:
        if other.upstream.speaks() == api:
            return other
    raise _wrong_api(settings, route, api)


def _wrong_api(settings: Settings, route: Route, api: API | None) -> BadRequest:
    names = {d.name: d.title for d in DIALECTS.values()}
    speaks = route.upstream.speaks() or ""
    takers = [r.name for r in settings.routes if _takes(r, api)]
    hint = (f"use route {takers[0]!r} (/r/{takers[0]}/v1)" if takers
            else f"add a route whose upstream speaks it (upstream.api: {api}) in config.yaml, as the shipped "
                 f"config.yaml's `anthropic` and `gemini` routes do")
    return BadRequest(f"route {route.name!r} forwards to {route.upstream.base_url}, which speaks "
                      f"{names.get(speaks, speaks)}, not {names.get(api or '', api)}; ctxproxy does not translate "
                      f"between APIs: {hint}", code="wrong_api")


# Headers that carry a client's credentials to providers (OpenAI/Azure/Anthropic/Google spellings).
_KEY_HEADERS = ("api-key", "x-api-key", "x-goog-api-key")


def api_key_of(headers: Mapping[str, str], query_key: str | None = None) -> str | None:
    """The client's credentials as one string: what makes two clients distinct tenants.

    Any `Authorization` scheme counts (Basic, Digest, a custom one), not only
    Bearer: two users whose credentials differ must never share a tenant. A lone
    Bearer token is the token itself, so tenant ids stay what they always were.
    None only when the request carries no credentials at all (the local single-user case).
    `query_key`: a key the client sent in the URL instead (Google's `?key=`).
    """
    auth = headers.get("authorization", "").strip()
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer":
        auth = token.strip()
    parts = [auth] if auth else []
    parts += [f"{name}={v}" for name in _KEY_HEADERS if (v := headers.get(name, "").strip())]
    if query_key:
        parts.append(f"x-goog-api-key={query_key}")  # the same tenant as the same key in Google's header
    if len(parts) == 1 and not auth:
        parts = [parts[0].split("=", 1)[1]]  # one key header alone: the key, as before
    return "\0".join(parts) or None


def query_key(query: str, name: str | None) -> str | None:
    """The key a client sends as the query parameter `name` (Google's clients may: `?key=`), if it does."""
    if not name or name + "=" not in query:
        return None
    for pair in query.split("&"):
        k, _, v = pair.partition("=")
        if k == name and v:
            return unquote_plus(v)
    return None


def forwarded_query(query: str, route: Route, key_param: str | None) -> str:
    """The query string sent upstream: the client's, less a key of its own (`?key=`) where the route injects the
    operator's key (as the client's key headers are replaced, proxy/upstream/client.py request_headers)."""
    if not key_param or not route.upstream.api_key_env or key_param + "=" not in query:
        return query
    return "&".join(p for p in query.split("&") if p.partition("=")[0] != key_param)


def tenant_id(api_key: str | None, salt: str) -> str:
    """A keyed hash of the key: stable across replicas sharing the salt, useless to an attacker."""
    if not api_key:
        return _ANONYMOUS
    return _keyed(api_key, salt)


@functools.lru_cache(maxsize=1024)  # a client sends the same key on every turn: the HMAC once per key
def _keyed(api_key: str, salt: str) -> str:
    return hmac.new(salt.encode(), api_key.encode(), hashlib.sha256).hexdigest()[:24]


def _valid_session(given: str) -> bool:
    return bool(given) and len(given) <= _MAX_SESSION_ID and given.isprintable() and given.isascii()


def named_session(headers: Mapping[str, str]) -> str | None:
    """The session a request names in its headers (X-Session-Id, else the agent's own), if it names a usable one:
    what a request the proxy refuses before reading its body is counted under."""
    given = headers.get(SESSION_HEADER)
    if given is None:
        given = _agent_session(headers)
    given = (given or "").strip()
    return given if _valid_session(given) else None


def _agent_session(headers: Mapping[str, str]) -> str | None:
    """The agent's own session header, if one is usable (never a reason to refuse a request)."""
    for name in AGENT_SESSION_HEADERS:
        given = headers.get(name, "").strip()
        if _valid_session(given):
            return given
    return None


def request_class(headers: Mapping[str, str]) -> str | None:
    """What Claude Code says a request is (main, subagent, compaction, auxiliary, ...), when it says."""
    value = headers.get(REQUEST_CLASS_HEADER, "").strip().lower()
    return value or None


def session_id(headers: Mapping[str, str], tenant: str, route: Route, conv: Conversation) -> tuple[str, bool]:
    """The request's session, and whether it was derived from the conversation's opening (no name anywhere: two
    conversations with one opening derive the same, and the engine tells them apart, Previous.branch)."""
    given = headers.get(SESSION_HEADER)
    if given is not None:
        given = given.strip()
        if not _valid_session(given):
            raise BadRequest(f"X-Session-Id must be 1-{_MAX_SESSION_ID} printable characters", param="X-Session-Id")
        return given, False
    session = _agent_session(headers)
    opening = session is None and conv.wire.session_hint(conv.body) is None
    session = session or _derived(tenant, route, conv)
    agent = headers.get(AGENT_ID_HEADER, "").strip()
    if request_class(headers) == "subagent" and agent:  # its own history, tied to its parent's by name
        session = f"{session}/agent-{agent}"[:_MAX_SESSION_ID]
    return session, opening


def _derived(tenant: str, route: Route, conv: Conversation) -> str:
    """The session of a request that names none by header: the conversation its body names, else its opening."""
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{tenant}\0{route.name}\0".encode())
    hint = conv.wire.session_hint(conv.body)
    if hint is not None:  # the client names its conversation: its turns are one session, whatever they carry
        h.update(b"hint\0" + hint.encode("utf-8", "surrogatepass"))
        return "s-" + h.hexdigest()
    role = conv.wire.role
    for m in conv.client_messages:
        if role(m) == "system":
            h.update(conv.digest(m))
        elif role(m) == "user":
            h.update(conv.digest(m))
            break
    return "s-" + h.hexdigest()


INJECTS_KEY = "this route injects the operator's key"


class Forbidden(ProxyError):
    status = 403
    type = "permission_error"
    code = "forbidden"


def _hostname(host: str) -> str:
    """`Host`'s name, lower-cased, without its port, brackets or trailing dot."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def names_proxy(host: str | None, server: ServerSettings) -> bool:
    """Whether a `Host` header names this proxy rather than some other name resolving to it (no header: HTTP/1.0,
    which no browser sends)."""
    if host is None:
        return True
    name = _hostname(host)
    if name == "localhost" or name.endswith(".localhost") or name == server.host.lower():
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return any(fnmatchcase(name, pattern.lower()) for pattern in server.allowed_hosts)


def require_proxy_host(headers: Mapping[str, str], server: ServerSettings, why: str) -> None:
    """Refuse a request trusted for where it comes from (`why` says for what) unless its `Host` names the proxy."""
    host = headers.get("host")
    if not names_proxy(host, server):
        raise Forbidden(f"Host {(host or '')[:200]!r} does not name this proxy, and {why}: refused (a DNS-rebinding "
                        "page would look like this); add the name to server.allowed_hosts if it is yours",
                        code="host_not_allowed")
