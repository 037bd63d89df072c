"""Small HTTP helpers shared by the handlers: bounded body reads and errors in the client's API shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.config import ServerSettings
from proxy.engine.run import refusal
from proxy.errors import BadRequest, PayloadTooLarge, ProxyError, RequestTimeout
from proxy.http.content_coding import IDENTITY, Decoder, decoder_for
from proxy.wire.apis import codec_for
from proxy.wire.codec import Codec

JSON = "application/json"
# Decoded bytes of a compressed body between two turns the loop gives the other requests.
_DECODED_PER_TURN = 1 << 20


async def read_body(request: Request, server: ServerSettings, *, decode: bool = True) -> bytes:
    """The request body, bounded in size and in time, its Content-Encoding undone.

    Refused with 413 as soon as it passes `server.max_body_bytes` (never read
    whole first), with 408 if it has not all arrived `server.body_timeout`
    seconds after its headers: a client trickling a body a byte at a time
    must not hold a connection and a task forever. A compressed body is
    decoded as it arrives (proxy/http/content_coding.py) and its decoded size
    held to the same limit, so a compression bomb is refused after one piece
    past the limit, never inflated whole. `decode=False`: the bytes as sent
    (a passthrough forwards them with their Content-Encoding).
    """
    coding = ", ".join(request.headers.getlist("content-encoding")) if decode else ""
    decoder = decoder_for(coding) if coding else IDENTITY  # no header (the usual case): nothing to look up
    try:
        async with asyncio.timeout(server.body_timeout):
            return await _read_body(request, server.max_body_bytes, decoder)
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {server.body_timeout:g} s "
                             "(server.body_timeout)") from None


async def _read_body(request: Request, limit: int, decoder: Decoder) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise PayloadTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        except ValueError:
            raise BadRequest("invalid Content-Length header") from None
    chunks: list[bytes] = []
    received = held = since_turn = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            for piece in decoder.feed(chunk):
                held += len(piece)
                if held > limit:
                    raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes once decoded "
                                          f"(Content-Encoding: {decoder.name})")
                chunks.append(piece)
                since_turn += len(piece)
                if since_turn >= _DECODED_PER_TURN:  # a few ms of inflating at most between two loop turns
                    since_turn = 0
                    await asyncio.sleep(0)
        decoder.close()
    except ClientDisconnect:
        raise BadRequest("client disconnected while sending the body", code="client_disconnected") from None
    return b"".join(chunks)


def query_of(request: Request) -> str:
    """The request's raw query string, without building Starlette's whole URL object for it."""
    raw: bytes = request.scope.get("query_string", b"")
    return raw.decode("latin-1")


def client_codec(request: Request) -> Codec:
    """The API a request without a codec of its own speaks, for its errors (proxy/wire/apis.py codec_for)."""
    return codec_for(request.scope["path"], request.headers)


def error_response(err: ProxyError, wire: Codec) -> Response:
    """The proxy's own error, in the shape of the API the client speaks: the engine's refusal, framed."""
    answer = refusal(err, wire)
    return Response(answer.content, status_code=answer.status, media_type=JSON, headers=answer.headers)


Own = dict[str, str] | list[tuple[str, str]]  # the proxy's own response headers (x-ctxproxy-*)
Raw = list[tuple[bytes, bytes]]  # the provider's, as proxy/upstream/client.py response_headers gives them


def _raw(upstream: Raw, own: Own) -> Raw:
    items = own.items() if isinstance(own, dict) else own
    return upstream + [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in items]


class _WholeThen(Response):
    """A whole body, then `then()`: work the client need not wait for, done however the sending went (a
    client gone mid-send still has its request accounted)."""

    def __init__(self, content: bytes, status: int, then: Callable[[], None]) -> None:
        super().__init__(content, status_code=status)
        self.then = then

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
            # uvloop writes what a callback queued once the callback returns: one turn of the loop puts the
            # body on the wire first. A request that arrives meanwhile is queued behind this task's next step.
            await asyncio.sleep(0)
        finally:
            self.then()


def relay_response(content: bytes, status: int, upstream: Raw, own: Own,
                   then: Callable[[], None] | None = None) -> Response:
    """A whole body with the provider's headers kept as a list (repeated headers survive), then the proxy's.

    `then`: called once the body is sent, in the same task and before the app returns (so a reader's next
    request sees what it did), however the sending ended."""
    out = Response(content, status_code=status) if then is None else _WholeThen(content, status, then)
    out.raw_headers = _raw(upstream, own) + [(b"content-length", str(len(content)).encode())]
    return out


def relay_stream(chunks: AsyncIterator[bytes], status: int, upstream: Raw, own: Own) -> StreamingResponse:
    out = StreamingResponse(chunks, status_code=status)
    out.raw_headers = _raw(upstream, own)
    return out
