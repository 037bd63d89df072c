"""POST /v1/responses: the request path (proxy/http/handler.py) with the Responses codec.

The other Responses endpoints (a stored response, input_tokens, compact, cancel,
input_items) pass through unchanged (proxy/http/passthrough.py): Codex's own
compaction goes to the provider as it sent it. Over WebSocket the same path
serves each turn (proxy/http/responses_ws.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy.http.handler import handle
from proxy.wire.responses.codec import RESPONSES


async def responses(request: Request) -> Response:
    return await handle(request, RESPONSES)
