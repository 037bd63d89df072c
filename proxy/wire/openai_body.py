"""What OpenAI's two APIs (Chat Completions, Responses) spell alike: model, stream, tools, usage in `usage`, a path.

One implementation for both codecs, so the two cannot drift apart; each codec keeps
only what its API spells its own way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import orjson

from proxy.wire.codec import Body, CodecBase
from proxy.wire.dialects import OPENAI, Dialect
from proxy.wire.usage import Usage, parse_usage


class OpenAIBody(CodecBase):
    dialect: ClassVar[Dialect] = OPENAI
    routing_fields: ClassVar[bool] = True
    reads_cache_at_breakpoints: ClassVar[bool] = False

    path: ClassVar[str]  # its endpoint below the upstream's base URL, e.g. "chat/completions"

    def at(self, params: Mapping[str, str]) -> Self:
        return self  # nothing of the request is in its path

    def upstream_path(self, model: str | None, stream: bool) -> str:
        return self.path

    def render(self, body: Body) -> Body:
        return body  # the items are the API's own list

    def model(self, body: Body) -> str | None:
        model = body.get("model")
        return model if isinstance(model, str) else None

    def is_stream(self, body: Body) -> bool:
        return body.get("stream") is True

    def tools(self, body: Body) -> list[Any] | None:
        tools = body.get("tools")
        return tools if isinstance(tools, list) else None

    def set_tools(self, body: Body, tools: list[Any]) -> None:
        body["tools"] = tools

    def raw_usage(self, data: Any) -> dict[str, Any]:
        usage = data.get("usage") if isinstance(data, dict) else None
        return usage if isinstance(usage, dict) else {}

    def usage_of_reply(self, content: bytes) -> Usage | None:
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            return None
        return parse_usage(data.get("usage")) if isinstance(data, dict) else None
