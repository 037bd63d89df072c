"""The HTTP side of the turn engine (proxy/engine/): a request handed over as an `Inbound`, the `Answer` framed.

Each API of the registry (proxy/wire/apis.py) is served at its path, and under
`/r/{route}`: its turns (POST, answered as JSON or as an event stream), its
token counts (Messages, Gemini), the context engine's calls from a gateway (/v1/compress, /v1/retrieve), and
every other path under an API's root (/v1/*, /v1beta/*) passed through unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from proxy.engine import gateway, turn
from proxy.engine import passthrough as passing
from proxy.engine.run import Answer, Inbound
from proxy.http.answers import known
from proxy.http.relay import client_codec, query_of, read_body, relay_response, relay_stream
from proxy.state import state_of
from proxy.wire.codec import Codec


def inbound(request: Request, *, decode: bool = True) -> Inbound:
    """The request as the engine takes it; its body read bounded when the engine asks for it (decoded unless
    `decode=False`: a pass-through forwards it with its Content-Encoding)."""
    server = state_of(request).settings.server
    return Inbound(request.method, request.scope["path"], query_of(request), request.headers.items(),
                   request.path_params.get("route"), lambda: read_body(request, server, decode=decode),
                   known=known(request.scope))


def framed(answer: Answer) -> Response:
    """The engine's answer as an HTTP response: whole (with Content-Length), or streamed as it arrives."""
    if answer.chunks is not None:
        return relay_stream(answer.chunks, answer.status, answer.upstream_headers, answer.headers)
    return relay_response(answer.content, answer.status, answer.upstream_headers, answer.headers, then=answer.then)


def turns(wire: Codec) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one API's turns (the codec bound to what the path says: Gemini's model)."""
    async def endpoint(request: Request) -> Response:
        return framed(await turn.turn(state_of(request), inbound(request), wire.at(request.path_params)))
    endpoint.__name__ = f"{wire.api}_turn"
    return endpoint


def count_tokens(wire: Codec) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of one API's token counts."""
    async def endpoint(request: Request) -> Response:
        return framed(await turn.count(state_of(request), inbound(request), wire.at(request.path_params)))
    endpoint.__name__ = f"{wire.api}_count"
    return endpoint


async def passthrough(request: Request) -> Response:
    answer = await passing.passthrough(state_of(request), inbound(request, decode=False), client_codec(request),
                                       request.path_params["path"])
    return framed(answer)


async def compress(request: Request) -> Response:
    """The context engine's call from a gateway (proxy/engine/gateway.py)."""
    return framed(await gateway.compress(state_of(request), inbound(request)))


async def retrieve(request: Request) -> Response:
    return framed(await gateway.retrieve(state_of(request), inbound(request), request.path_params["hash"]))
