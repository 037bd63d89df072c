"""Context read: gives the model the proxy-owned `context_read` whenever it has something to read.

Added after the client's tools on every request that carries tools (so the
tool list never changes within a session), and also on a request without
tools once the proxy has put a placeholder with a handle into it - otherwise
the placeholder would name a tool the model does not have. The tools are where
the request's codec says they are (a Responses Lite request's are in an
`additional_tools` input item: the read tool joins them there). Calls to it are
answered by the proxy in hidden rounds (proxy/rewrite/context_read/loop.py),
which this transform's response-side hook starts.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel

from proxy.request import Conversation, ReadTool, RequestContext
from proxy.request.events import PLACEHOLDER_EVENTS
from proxy.rewrite.context_read.loop import ReadLoop, Send
from proxy.rewrite.context_read.tool import tool_name_for, tool_spec
from proxy.rewrite.settings import ContextReadSettings, Peers
from proxy.store.archive import Archive
from proxy.wire.codec import Codec


class ContextRead:
    name: ClassVar[str] = "context_read"
    Settings: ClassVar[type[BaseModel]] = ContextReadSettings

    def __init__(self, settings: ContextReadSettings, peers: Peers) -> None:
        self.settings = settings

    async def apply(self, conv: Conversation, ctx: RequestContext) -> Conversation:
        tools = conv.tools
        sent = tools_as_sent(self.settings, conv.wire, tools, has_placeholders(conv))
        if sent is tools or sent is None:
            return conv
        conv.set_tools(sent)
        conv.read_tool = ReadTool(tool_name_for(conv.wire, tools), self.settings.rounds, self.settings.max_chars)
        return conv

    def on_response(self, conv: Conversation, ctx: RequestContext, send: Send, url: str) -> ReadLoop | None:
        """The hidden rounds of a request the read tool went out with (None where its API cannot have them)."""
        tool = conv.read_tool
        shape = conv.wire.read_shape(conv.body, tool.name) if tool is not None else None
        if tool is None or shape is None:
            return None
        return ReadLoop(conv, shape, tool, Archive(ctx.store, ctx.tenant, fallback=ctx.fallback), send, url)


def has_placeholders(conv: Conversation) -> bool:
    """Whether the proxy has put a placeholder naming a handle into this request so far."""
    return any(isinstance(e, PLACEHOLDER_EVENTS) for e in conv.events)


def tools_as_sent(settings: ContextReadSettings | None, wire: Codec, tools: list[Any] | None,
                  placeholders: bool) -> list[Any] | None:
    """The `tools` array the provider gets: the client's, then the read tool when there is something to read.

    One rule for the transform and for the summarizer's cached-shape call, which must send the same bytes.
    """
    if settings is None or not settings.enabled or (not tools and not placeholders):
        return tools
    return [*(tools or []), wire.tool_definition(tool_spec(tool_name_for(wire, tools)))]
