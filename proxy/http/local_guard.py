"""Browsers cannot drive a local proxy: a foreign `Origin` is refused, and what is trusted for where it comes from
must name the proxy in its `Host`.

ctxproxy usually listens on a developer's loopback, often with a route that
injects the operator's provider key (`api_key_env`). Any page the developer
visits may POST to http://127.0.0.1:8080 as `text/plain` or open a WebSocket to
it without a CORS preflight; the browser then sends `Origin`, which agents, SDKs
and curl never do. So a request with an `Origin` that is neither listed in
`server.allowed_origins` nor the proxy's own (the dashboard's fetches) is refused
before anything is read or sent upstream, and no answer carries a CORS grant.

DNS rebinding is the other way in: a page on rebind.evil.example whose name
later resolves to 127.0.0.1 talks to the proxy "same-origin"; its GET carries no
`Origin`, only `Host: rebind.evil.example`. A request trusted for where it comes
from rather than for a credential (the keyless loopback admin view, a route
injecting the operator's key) must therefore carry a `Host` naming the proxy:
an IP literal (a rebinding page always has a name of its own), `localhost`,
`server.host`, or one of `server.allowed_hosts` (e.g. a Kubernetes Service name).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from proxy.config import ServerSettings
from proxy.engine.routing import Forbidden, names_proxy
from proxy.errors import ProxyError
from proxy.http.answers import CountedAnswer
from proxy.http.error_handlers import proxy_error
from proxy.logs import event


def origin_refusal(origin: str | None, host: str | None, server: ServerSettings) -> Forbidden | None:
    """Why a request from a browser page is refused; None if it has no `Origin`, an allowed one, or the proxy's own
    (the dashboard, served from the proxy's own name)."""
    if origin is None:
        return None
    wanted = origin.strip().lower().rstrip("/")
    if wanted in server.allowed_origins or "*" in server.allowed_origins:
        return None
    try:
        same = host is not None and urlsplit(wanted).netloc == host.strip().lower()
    except ValueError:
        same = False
    if same and names_proxy(host, server):
        return None
    return Forbidden(f"requests from the web origin {origin[:200]!r} are refused: a browser page may not drive "
                     "this proxy (list the origin in server.allowed_origins to allow it)", code="origin_not_allowed")


async def refuse(err: ProxyError, scope: Scope, receive: Receive, send: Send) -> None:
    """Answer a request refused before it was read: over HTTP as the app answers any ProxyError (in the client's API
    shape, counted and logged); a WebSocket handshake with the same status and JSON, the socket never opened."""
    if scope["type"] == "http":
        answer = CountedAnswer(scope, send)  # counted as every answer is (CountEveryAnswer never sees it)
        response = await proxy_error(Request(scope, receive), err)
        await response(scope, receive, answer.send)
        return
    event("websocket refused", path=scope.get("path"), status=err.status, error=err.code)
    await receive()  # websocket.connect
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})  # the server answers the handshake 403
        return
    body = err.body()
    await send({"type": "websocket.http.response.start", "status": err.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "websocket.http.response.body", "body": body})
