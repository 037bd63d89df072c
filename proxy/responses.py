"""Small HTTP helpers shared by the handlers: bounded body reads and OpenAI-shaped errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from proxy.errors import BadRequest, PayloadTooLarge, ProxyError

JSON = "application/json"


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes (never read whole first)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        except ValueError:
            raise BadRequest("invalid Content-Length header") from None
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise BadRequest("client disconnected while sending the body", code="client_disconnected") from None
    return b"".join(chunks)


def error_response(err: ProxyError, headers: dict[str, str] | None = None) -> Response:
    return Response(err.body(), status_code=err.status, media_type=JSON, headers=headers)


def _raw(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def relay_response(content: bytes, status: int, headers: list[tuple[str, str]]) -> Response:
    """A whole body with the provider's headers kept as a list (repeated headers survive)."""
    out = Response(content, status_code=status)
    out.raw_headers = _raw(headers) + [(b"content-length", str(len(content)).encode())]
    return out


def relay_stream(chunks: AsyncIterator[bytes], status: int, headers: list[tuple[str, str]]) -> StreamingResponse:
    out = StreamingResponse(chunks, status_code=status)
    out.raw_headers = _raw(headers)
    return out
