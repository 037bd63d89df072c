"""Request → route, tenant and session.

The tenant is a keyed hash of the client's API key, never the key itself; every
stored thing is namespaced by it. The session id is the client's
`X-Session-Id`, else derived from what every turn of one agent run re-sends
unchanged: tenant, route, system message(s) and the first user message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from fnmatch import fnmatchcase

from proxy.config import DEFAULT_ROUTE, Route, Settings
from proxy.errors import BadRequest, NotFound
from proxy.wire.conversation import Conversation

ROUTE_HEADER = "x-ctx-route"
SESSION_HEADER = "x-session-id"
_ANONYMOUS = "anonymous"
_MAX_SESSION_ID = 200  # characters of a client-given session id


def resolve_route(settings: Settings, path_route: str | None, headers: Mapping[str, str],
                  model: str | None) -> Route:
    """Path prefix, else `X-Ctx-Route`, else first `match.model` glob, else `default`."""
    for name, how in ((path_route, "path /r/{route}/v1"), (headers.get(ROUTE_HEADER), "header X-Ctx-Route")):
        if name:
            route = settings.route(name)
            if route is None:
                known = ", ".join(r.name for r in settings.routes)
                raise NotFound(f"unknown route {name!r} (from {how}); configured routes: {known}",
                               code="route_not_found")
            return route
    if model:
        for route in settings.routes:
            if route.match.model and fnmatchcase(model, route.match.model):
                return route
    route = settings.route(DEFAULT_ROUTE)
    assert route is not None  # build_settings always adds it
    return route


# Headers that carry a client's credentials to providers (OpenAI/Azure/Anthropic/Google spellings).
_KEY_HEADERS = ("api-key", "x-api-key", "x-goog-api-key")


def api_key_of(headers: Mapping[str, str]) -> str | None:
    """The client's credentials as one string: what makes two clients distinct tenants.

    Any `Authorization` scheme counts (Basic, Digest, a custom one), not only
    Bearer: two users whose credentials differ must never share a tenant. A lone
    Bearer token is the token itself, so tenant ids stay what they always were.
    None only when the request carries no credentials at all (the local single-user case).
    """
    auth = headers.get("authorization", "").strip()
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer":
        auth = token.strip()
    parts = [auth] if auth else []
    parts += [f"{name}={v}" for name in _KEY_HEADERS if (v := headers.get(name, "").strip())]
    if len(parts) == 1 and not auth:
        parts = [parts[0].split("=", 1)[1]]  # one key header alone: the key, as before
    return "\0".join(parts) or None


def tenant_id(api_key: str | None, salt: str) -> str:
    """A keyed hash of the key: stable across replicas sharing the salt, useless to an attacker."""
    if not api_key:
        return _ANONYMOUS
    return hmac.new(salt.encode(), api_key.encode(), hashlib.sha256).hexdigest()[:24]


def session_id(headers: Mapping[str, str], tenant: str, route: Route, conv: Conversation) -> str:
    given = headers.get(SESSION_HEADER)
    if given is not None:
        given = given.strip()
        if not given or len(given) > _MAX_SESSION_ID or not given.isprintable() or not given.isascii():
            raise BadRequest(f"X-Session-Id must be 1-{_MAX_SESSION_ID} printable characters", param="X-Session-Id")
        return given
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
