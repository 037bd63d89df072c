"""POST /v1/chat/completions: the request path (proxy/http/handler.py) with the Chat Completions codec."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from proxy.http.handler import handle
from proxy.wire.chat.codec import CHAT


async def chat_completions(request: Request) -> Response:
    return await handle(request, CHAT)
