"""POST /v1/responses: the request path (proxy/http/handler.py) with the Responses codec.

The other Responses endpoints (a stored response, input_tokens, compact, cancel,
input_items) pass through unchanged (proxy/http/passthrough.py): Codex's own
compaction goes to the provider as it sent it. WebSocket mode is not served.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from proxy.http.handler import handle
from proxy.wire.responses.codec import RESPONSES

WEBSOCKET_REFUSED = ("ctxproxy serves /v1/responses over HTTP only; in Codex set supports_websockets = false "
                     "on the provider")


async def responses(request: Request) -> Response:
    return await handle(request, RESPONSES)


async def responses_websocket(websocket: WebSocket) -> None:
    """A WebSocket upgrade gets a clear refusal: accepted, then closed at once with code 1008 (policy) and the
    reason, which clients show; refusing the handshake instead would only say "HTTP 403"."""
    await websocket.accept()
    await websocket.close(code=1008, reason=WEBSOCKET_REFUSED)
