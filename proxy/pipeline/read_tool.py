"""Read tool: gives the model the proxy-owned `context_read` whenever it has something to read.

Added after the client's tools on every request that carries tools (so the
tool list never changes within a session), and also on a request without
tools once the proxy has put a placeholder with a handle into it - otherwise
the placeholder would name a tool the model does not have. Calls to it are
answered by the proxy in hidden rounds (proxy/toolloop.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from proxy.conversation import Conversation, ReadTool, RequestContext
from proxy.readback import tool_definition, tool_name_for

_PLACEHOLDER_EVENTS = frozenset({"offload", "compaction", "compact"})


class ReadToolSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    rounds: int = Field(default=4, ge=0, le=16)  # context_read rounds answered per client request
    max_chars: int = Field(default=20_000, ge=1000)  # characters one context_read answer returns at most


class ReadToolTransform:
    name: ClassVar[str] = "context_read"
    Settings: ClassVar[type[BaseModel]] = ReadToolSettings

    def __init__(self, settings: ReadToolSettings) -> None:
        self.settings = settings

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        tools = conv.body.get("tools")
        sent = tools_as_sent(self.settings, tools, has_placeholders(conv))
        if sent is tools:
            return conv
        conv.body["tools"] = sent
        conv.changed = True
        conv.read_tool = ReadTool(tool_name_for(tools or []), self.settings.rounds, self.settings.max_chars)
        return conv


def has_placeholders(conv: Conversation) -> bool:
    """Whether the proxy has put a placeholder naming a handle into this request so far."""
    return any(e.kind in _PLACEHOLDER_EVENTS for e in conv.events)


def tools_as_sent(settings: ReadToolSettings | None, tools: list[Any] | None, placeholders: bool) -> list[Any] | None:
    """The `tools` array the provider gets: the client's, then the read tool when there is something to read.

    One rule for the transform and for the summarizer's cached-shape call, which must send the same bytes.
    """
    if settings is None or not settings.enabled or (not tools and not placeholders):
        return tools
    return [*(tools or []), tool_definition(tool_name_for(tools or []))]
