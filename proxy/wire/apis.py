"""The registry of client APIs the proxy manages: one line each, read by the app, routing and error shaping.

Each entry is a codec (the client's shape and, through its dialect, the
provider's: proxy/wire/dialects.py) and the path it is served at, below the
proxy's root and below `/r/{route}`, with the path's parameters in braces
(Gemini's model): its turns, or its token counts (`counts`). Anything else
under an API's version root (`/v1/`, `/v1beta/`) passes through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from proxy.wire.chat.codec import CHAT
from proxy.wire.codec import Codec
from proxy.wire.gemini.codec import GEMINI, GEMINI_COUNT, GEMINI_STREAM
from proxy.wire.messages.codec import COUNTING, MESSAGES
from proxy.wire.responses.codec import RESPONSES


@dataclass(frozen=True)
class Api:
    codec: Codec
    path: str  # where it is POSTed, e.g. "/v1/chat/completions", "/v1beta/models/{model}:generateContent"
    counts: bool = False  # a token count (a turn stopped before it is sent), not a turn
    websocket: bool = False  # its turns are also served over a WebSocket at `path`

    @property
    def root(self) -> str:
        """The API version's root ("/v1"): what else is under it passes through to the route's upstream."""
        return "/" + self.path.split("/")[1]


APIS: tuple[Api, ...] = (
    Api(CHAT, "/v1/chat/completions"),
    Api(RESPONSES, "/v1/responses", websocket=True),
    Api(MESSAGES, "/v1/messages"),
    Api(COUNTING, "/v1/messages/count_tokens", counts=True),
    *(api for root in ("/v1beta", "/v1") for api in (  # Gemini CLI calls v1beta; Google's Python SDK v1
        Api(GEMINI, root + "/models/{model}:generateContent"),
        Api(GEMINI_STREAM, root + "/models/{model}:streamGenerateContent"),
        Api(GEMINI_COUNT, root + "/models/{model}:countTokens", counts=True))),
)
ROOTS: tuple[str, ...] = tuple(dict.fromkeys(api.root for api in APIS))


def codec_for(path: str, headers: Mapping[str, str]) -> Codec:
    """The API a request speaks as far as its path and headers say (for the shape of an error to a request the
    engine did not parse): the API whose path it is under, else the one whose clients' header it carries, else
    Chat Completions (OpenAI's error shape, which most clients read)."""
    for api in APIS:
        if api.path.partition("{")[0] in path:
            return api.codec
    for api in APIS:
        marker = api.codec.dialect.marker_header
        if marker is not None and marker in headers:
            return api.codec
    return CHAT
