"""The registry of client APIs the proxy manages: one line each, read by the app, routing and error shaping.

Each entry is a codec (the client's shape and, through its dialect, the
provider's: proxy/wire/dialects.py) and the path its turns are served at, below
the proxy's root and below `/r/{route}`. Anything else under /v1/ passes through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.wire.chat.codec import CHAT
from proxy.wire.codec import Codec
from proxy.wire.messages.codec import COUNT_PATH, MESSAGES
from proxy.wire.responses.codec import RESPONSES


@dataclass(frozen=True)
class Api:
    codec: Codec
    path: str  # where its turns are POSTed, e.g. "/v1/chat/completions"
    count_path: str | None = None  # where its token counts are POSTed, if it has an endpoint for them
    websocket: bool = False  # its turns are also served over a WebSocket at `path`


APIS: tuple[Api, ...] = (
    Api(CHAT, "/v1/chat/completions"),
    Api(RESPONSES, "/v1/responses", websocket=True),
    Api(MESSAGES, "/v1/messages", count_path="/v1/" + COUNT_PATH),
)


def codec_for(path: str, headers: Mapping[str, str]) -> Codec:
    """The API a request speaks as far as its path and headers say (for the shape of an error to a request the
    engine did not parse): the API whose path it is under, else the one whose clients' header it carries, else
    Chat Completions (OpenAI's error shape, which most clients read)."""
    for api in APIS:
        if api.path in path:
            return api.codec
    for api in APIS:
        marker = api.codec.dialect.marker_header
        if marker is not None and marker in headers:
            return api.codec
    return CHAT
