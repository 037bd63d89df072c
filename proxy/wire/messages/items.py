"""Anthropic messages as the proxy's items, and back: tool results lifted out of their user turn.

The transforms see a conversation as chat does: an assistant item carrying its
calls, then one item per tool result. A Messages user turn may hold several
`tool_result` blocks and text after them, so at parse such a turn is split:
each `tool_result` block becomes an item of its own (the client's block
object itself), and each run of its other blocks one user item. Every other
message is an item as it came.

At render, consecutive items of one role are joined into one message (the API
wants turns to alternate; it would combine them anyway), and a run that is
exactly the items one client message was split into is emitted as that very
message object: what no transform changed is the client's bytes. A `system`
role item the proxy made (a status bar or summary note configured as system)
joins the user turn it sits in; a client's own `system` message (the API's
mid-conversation system messages, which Claude Code sends) stays a message of
its own, as it came.
"""

from __future__ import annotations

from typing import Any

ORIGINS = "\x00ctxproxy.origins"  # body key of the split messages' origins; never serialized
TOOL_RESULT = "tool_result"

Origins = dict[int, tuple[dict[str, Any], tuple[Any, ...]]]  # id(first item) -> (client message, its items)


def is_block(item: Any) -> bool:
    """A tool_result block lifted out of its user turn (messages have a role; blocks have none)."""
    return isinstance(item, dict) and "role" not in item


def turn_role(item: Any) -> str:
    """The Messages turn an item belongs to: "user" or "assistant"."""
    if is_block(item):
        return "user"
    return "assistant" if item.get("role") == "assistant" else "user"


def split(messages: list[Any]) -> tuple[list[Any], Origins]:
    """The items of the client's messages, and where each split message's items came from."""
    items: list[Any] = []
    origins: Origins = {}
    for m in messages:
        content = m.get("content")
        if isinstance(m, dict) and m.get("role") == "system":
            origins[id(m)] = (m, (m,))  # the client's own: rendered back as itself (`join`)
        if m.get("role") != "user" or not isinstance(content, list) \
                or not any(isinstance(b, dict) and b.get("type") == TOOL_RESULT for b in content):
            items.append(m)
            continue
        parts: list[Any] = []
        rest: list[Any] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == TOOL_RESULT:
                if rest:
                    parts.append({"role": "user", "content": rest})
                    rest = []
                parts.append(block)
            else:
                rest.append(block)
        if rest:
            parts.append({"role": "user", "content": rest})
        origins[id(parts[0])] = (m, tuple(parts))
        items.extend(parts)
    return items, origins


def _blocks(item: Any) -> list[Any]:
    if is_block(item):
        return [item]
    content = item.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content) if isinstance(content, list) else []


def join(items: list[Any], origins: Origins) -> list[Any]:
    """The Messages turns of the items: alternating roles, the client's own objects wherever nothing changed."""
    out: list[Any] = []
    run: list[Any] = []
    role = ""

    def flush() -> None:
        if not run:
            return
        if len(run) == 1 and not is_block(run[0]) and run[0].get("role") in ("user", "assistant"):
            out.append(run[0])
            return
        origin = origins.get(id(run[0]))
        if origin is not None and len(origin[1]) == len(run) and all(a is b for a, b in zip(origin[1], run)):
            out.append(origin[0])
            return
        out.append({"role": role, "content": [b for item in run for b in _blocks(item)]})

    for item in items:
        if _own_system(item, origins):  # a message of its own, between turns
            flush()
            run, role = [], ""
            out.append(item)
            continue
        r = turn_role(item)
        if r != role:
            flush()
            run, role = [], r
        run.append(item)
    flush()
    return out


def _own_system(item: Any, origins: Origins) -> bool:
    """A `system` message the client sent (not one a transform made): `split` recorded it as its own origin."""
    return not is_block(item) and item.get("role") == "system" and origins.get(id(item), (None,))[0] is item
