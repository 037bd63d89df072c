"""Facts a request asks for several times are computed once, and stay exact when what they depend on changes.

The rewrite pipeline and accounting ask for the prompt's head (tools, system prompt)
several times per request; each answer must be the one a fresh count gives.
"""

from __future__ import annotations

import orjson

from proxy.request import Conversation
from proxy.tokens.counter import default_counter
from proxy.wire.chat.codec import CHAT

TOOLS = [{"type": "function", "function": {"name": n, "description": "Run " + n, "parameters": {"type": "object"}}}
         for n in ("bash", "read_file")]


def _conv(**body: object) -> Conversation:
    raw = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], **body})
    return Conversation.parse(raw, CHAT)


def test_the_tool_count_follows_the_tools_and_the_model_as_sent():
    conv = _conv(tools=TOOLS)
    assert conv.tool_tokens() == default_counter.count_tools(TOOLS, "gpt-4o")
    assert conv.head_tokens() == conv.tool_tokens()  # no system prompt outside the items in Chat
    read = {"type": "function", "function": {"name": "context_read", "parameters": {"type": "object"}}}
    more = [*(conv.tools or []), read]
    conv.set_tools(more)  # the counted list plus one: its count follows from the known one
    assert conv._tool_tokens is not None and conv._tool_tokens[0] is more
    assert conv.tool_tokens() == default_counter.count_tools(more, "gpt-4o") > default_counter.count_tools(TOOLS)
    conv.set_tools(more[1:])  # not an extension: counted afresh
    assert conv.tool_tokens() == default_counter.count_tools(more[1:], "gpt-4o")
    conv.set_tools(more)
    conv.body["model"] = "gpt-4"  # another encoding: counted again
    assert conv.tool_tokens() == default_counter.count_tools(more, "gpt-4")
    conv.set_messages([{"role": "user", "content": "hello"}])
    assert conv.tool_tokens() == default_counter.count_tools(more, "gpt-4")


def test_no_tools_count_nothing():
    assert _conv().tool_tokens() == 0
