"""The turns' fast lane: a POST to /v1/chat/completions, /v1/responses or /v1/messages (or under /r/{route})
goes straight to its handler, past Starlette's and FastAPI's generic per-request layers.

Through the FastAPI stack a turn passes ServerErrorMiddleware, FastAPI's exception
telemetry, CountEveryAnswer, ExceptionMiddleware, an AsyncExitStack, the router's
matching and two exception wrappers, and each message it sends passes a closure of
most of them: none of it does anything for a turn the lane cannot do once. The
lane does what they do, once: the answer counted (proxy/http/answers.py), a
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
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.errors import ProxyError
from proxy.http.answers import Answer
from proxy.http.error_handlers import http_error, proxy_error, unexpected_error

Handler = Callable[[Request], Awaitable[Response]]
ROUTE_PREFIX = "/r/"  # /r/{route}/v1/...: Starlette's `{route}` is one non-empty path segment
_STARTED = "Caught handled exception, but response already started."  # Starlette's words for the same case


class FastLane:
    """The app with its turns served directly: `turns` maps a path (/v1/chat/completions...) to its handler,
    the same one the app's router has for that path and for /r/{route} + path."""

    def __init__(self, app: ASGIApp, turns: Mapping[str, Handler]) -> None:
        self.app = app
        self.turns = dict(turns)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path: str = scope["path"]
            handler = self.turns.get(path)
            if handler is not None:
                scope["path_params"] = {}
                await serve(handler, scope, receive, send)
                return
            if path.startswith(ROUTE_PREFIX):
                route, slash, rest = path[len(ROUTE_PREFIX):].partition("/")
                handler = self.turns.get("/" + rest) if route and slash else None
                if handler is not None:
                    scope["path_params"] = {"route": route}
                    await serve(handler, scope, receive, send)
                    return
        await self.app(scope, receive, send)


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
