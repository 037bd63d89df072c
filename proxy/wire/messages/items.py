"""Anthropic messages as the proxy's items, and back: tool results lifted out of their user turn (proxy/wire/turns.py).

A Messages user turn may hold several `tool_result` blocks and text after
them: each `tool_result` block becomes an item of its own, each run of its
other blocks one user item.
"""

from __future__ import annotations

from typing import Any

from proxy.wire.turns import Origins, Turns

ORIGINS = "\x00ctxproxy.origins"  # body key of the split messages' origins; never serialized
TOOL_RESULT = "tool_result"


def is_block(item: Any) -> bool:
    """A tool_result block lifted out of its user turn (messages have a role; blocks have none)."""
    return isinstance(item, dict) and "role" not in item


TURNS = Turns("content", "assistant", lambda b: isinstance(b, dict) and b.get("type") == TOOL_RESULT, is_block)


def split(messages: list[Any]) -> tuple[list[Any], Origins]:
    return TURNS.split(messages)


def join(items: list[Any], origins: Origins) -> list[Any]:
    return TURNS.join(items, origins)
