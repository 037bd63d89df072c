"""The turns' fast lane: a POST to /v1/chat/completions, /v1/responses or /v1/messages (or under /r/{route})
goes straight to its handler, past Starlette's and FastAPI's generic per-request layers.

Through the FastAPI stack a turn passes FastAPI's and Starlette's __call__,
ServerErrorMiddleware, FastAPI's exception telemetry, CountEveryAnswer,
ExceptionMiddleware, an AsyncExitStack, the router's matching and two exception
wrappers; each message it sends passes a closure of most of them, and each time
its task resumes, every one of their frames does. None of it does anything for a
turn the lane cannot do once. The lane (proxy/app.py calls it first) does what
they do, once: the answer counted (proxy/http/answers.py), a
ProxyError answered by the same handler, any other exception answered, logged and
re-raised to the server as ServerErrorMiddleware does (proxy/http/error_handlers.py).

Guarantees: a turn gets the same status, headers, body, count and log line either
way (tests/test_fast_lane.py compares them); every other request - another method
or path, a WebSocket, the lifespan, a scope with a root_path - goes to the app
unchanged, and so does anything the lane does not recognise exactly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.errors import ProxyError
from proxy.http.answers import Answer
from proxy.http.error_handlers import http_error, proxy_error, unexpected_error

Handler = Callable[[Request], Awaitable[Response]]
ROUTE_PREFIX = "/r/"  # /r/{route}/v1/...: Starlette's `{route}` is one non-empty path segment
_STARTED = "Caught handled exception, but response already started."  # Starlette's words for the same case


def turn_of(scope: Scope, turns: Mapping[str, Handler]) -> Handler | None:
    """The handler of a turn (`turns` maps /v1/chat/completions... to the handler the app's router has for that
    path and for /r/{route} + path), its `path_params` put in the scope as the router would; None for any other
    request, which the app serves."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    path: str = scope["path"]
    handler = turns.get(path)
    if handler is not None:
        scope["path_params"] = {}
        return handler
    if not path.startswith(ROUTE_PREFIX):
        return None
    route, slash, rest = path[len(ROUTE_PREFIX):].partition("/")
    handler = turns.get("/" + rest) if route and slash else None
    if handler is not None:
        scope["path_params"] = {"route": route}
    return handler


async def serve(handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
    """One turn, answered as the FastAPI stack answers it (the module docstring says what that covers)."""
    answer = Answer(scope, send)
    request = Request(scope, receive, send)
    try:
        try:
            response = await handler(request)
            await response(scope, receive, answer.send)
        except (ProxyError, HTTPException) as exc:  # the app's exception handlers for these, as Starlette calls them
            if answer.started:
                raise RuntimeError(_STARTED) from exc
            on_error = proxy_error if isinstance(exc, ProxyError) else http_error
            response = await on_error(request, exc)
            await response(scope, receive, answer.send)
            exc.__traceback__ = None  # as Starlette does: an instance raised again gathers no old frames
    except Exception as exc:  # ServerErrorMiddleware's part, after CountEveryAnswer's
        answer.failed()
        error = await unexpected_error(request, exc)
        if not answer.started:
            await error(scope, receive, send)
        raise
