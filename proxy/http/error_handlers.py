"""The app's answers to what its handlers raise: one place.

FastAPI calls them as exception handlers (proxy/app.py registers them); the
browser guard (proxy/http/local_guard.py) answers its refusals with the same
function, so an error reads the same whichever way its request went.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import BadRequest, NotFound, ProxyError
from proxy.http.answers import note_error
from proxy.http.relay import client_codec, error_response
from proxy.logs import log


async def proxy_error(request: Request, exc: Exception) -> Response:
    """A refusal of the proxy's own (ProxyError): its status and code, in the client's API shape."""
    assert isinstance(exc, ProxyError)
    note_error(request.scope, exc)
    return error_response(exc, client_codec(request))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405 (a path or method the proxy does not serve), as the proxy's own errors."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        missing = NotFound(f"no such endpoint: {request.method} {request.url.path}")
        note_error(request.scope, missing)
        return error_response(missing, client_codec(request))
    err = BadRequest(str(exc.detail), code="method_not_allowed" if exc.status_code == 405 else "http_error")
    err.status = exc.status_code
    note_error(request.scope, err)
    return error_response(err, client_codec(request))


async def unexpected_error(request: Request, exc: Exception) -> Response:
    """A bug: logged with its traceback, answered as a 500 in the client's API shape (the exception is then
    re-raised to the server by whoever called this)."""
    log.error("unexpected error", exc_info=exc, extra={"fields": {"path": request.url.path}})
    return error_response(ProxyError("internal proxy error; see the proxy log"), client_codec(request))
