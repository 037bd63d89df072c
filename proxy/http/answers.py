"""Every answer the proxy gives a client is counted once: those the request path accounts, and all the others.

A turn the provider was asked is accounted by its ledger (proxy/accounting/ledger.py)
with everything it measured. Every other answer - the proxy's own refusals (a body
that is not JSON, an unknown route, a body over the limit, a path it does not serve,
its own 500), count_tokens, pass-through - is counted here, as its response starts:
per route, model and status in the counters and /metrics, and in the session's
timeline when the request names or implies one. A handler says what it knows of its
request (`known(scope)`): its kind, route, model, tenant, session, error code, and
whether a ledger accounts it. The proxy's own endpoints (/healthz, /readyz, /metrics,
/ctx/..., and the icon a browser asks for beside the dashboard) are not client traffic.

A pure ASGI middleware: it wraps `send` to see the status and adds nothing else to
a request (no body is read or copied).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.engine.routing import api_key_of, named_session, resolve_route, tenant_id
from proxy.errors import ProxyError
from proxy.request.flow import Known
from proxy.state import ProxyState

KNOWN = "ctxproxy.known"  # the scope key of a request's Known
_OWN_PATHS = ("/healthz", "/readyz", "/metrics", "/ctx/", "/favicon.ico")  # the last: the dashboard's browser
_ROUTE_PREFIX = "/r/"


def known(scope: Scope) -> Known:
    """The request's Known, made on first use."""
    found: Known | None = scope.get(KNOWN)
    if found is None:
        found = scope[KNOWN] = Known()
    return found


def note_error(scope: Scope, err: ProxyError) -> None:
    """An error answered by the app's handlers: its code goes with the count."""
    known(scope).error = err.code


class CountEveryAnswer:
    """The app wrapped so that no answer to a client goes uncounted (the module docstring says which)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(_OWN_PATHS):
            await self.app(scope, receive, send)
            return
        answer = CountedAnswer(scope, send)
        try:
            await self.app(scope, receive, answer.send)
        except Exception:
            answer.failed()
            raise


class CountedAnswer:
    """One client request's answer, counted once: as its response starts, or as the 500 it gets when the app
    fails before one started (rendered outside, by the outermost error handler). Also used by the browser guard
    (proxy/http/local_guard.py), whose refusals never reach CountEveryAnswer but are counted all the same."""

    __slots__ = ("scope", "started", "_send")

    def __init__(self, scope: Scope, send: Send) -> None:
        self.scope, self._send, self.started = scope, send, False

    async def send(self, message: Message) -> None:
        """The app's `send`: the first response start is counted, every message passed on unchanged."""
        if not self.started and message["type"] == "http.response.start":
            self.started = True
            _count(self.scope, message["status"])
        await self._send(message)

    def failed(self) -> None:
        """The app raised: unless a response had started, the answer is the outermost handler's 500."""
        if not self.started:
            k = known(self.scope)
            k.error = k.error or "internal_error"
            _count(self.scope, 500)


def _count(scope: Scope, status: int) -> None:
    k = known(scope)
    if k.accounted:
        return
    st: ProxyState | None = getattr(scope["app"].state, "proxy", None)
    if st is None:  # not started (a request during start-up)
        return
    headers = Headers(scope=scope)
    tenant = k.tenant or tenant_id(api_key_of(headers), st.settings.tenant_salt)
    session = k.session or named_session(headers)
    route = k.route if k.route is not None else _route_of(st, scope["path"], headers, k.model)
    st.accounting.answered(k.kind, k.request_id or "", tenant, route, k.model, session, status, k.error)


def _route_of(st: ProxyState, path: str, headers: Mapping[str, str], model: str | None) -> str:
    """The route a request would have taken, as far as its path and headers say; "" if they name none that
    exists (a made-up name is never a label)."""
    named = path[len(_ROUTE_PREFIX):].split("/", 1)[0] if path.startswith(_ROUTE_PREFIX) else None
    try:
        return resolve_route(st.settings, named, headers, model).name
    except ProxyError:
        return ""
