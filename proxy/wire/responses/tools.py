"""Where a Responses request's tools are: the top-level `tools`, else an `additional_tools` input item.

Codex's Responses Lite requests (2026) carry no top-level `tools` (none, or an
empty list): the tools come in a leading input item, `{"type": "additional_tools",
"role": "developer", "tools": [...]}`, where each MCP server's and Codex's own
functions are `namespace` tools holding their own `tools` list. Such a request's
tools are that item's, and the proxy's read tool is added inside it: a new
top-level `tools` list would be a second tool list the client never sent.

Which item, when there are several (the API lets a later item make more tools
available from that point on): the first. It is the earliest in the input and
Codex rebuilds it identically every turn (its id is a hash of its tools), so
changing it the same way every turn keeps the cached prefix stable; a later
item appended when the tools change would move the read tool out of the earlier
item and break the cache from there. Deterministic: the same raw request always
gives the same item, and the same bytes.
"""

from __future__ import annotations

from typing import Any

ADDITIONAL_TOOLS = "additional_tools"
NAMESPACE = "namespace"


def _top(body: dict[str, Any]) -> list[Any] | None:
    tools = body.get("tools")
    return tools if isinstance(tools, list) else None


def holder(items: list[Any]) -> int | None:
    """The index of the first `additional_tools` item whose `tools` is a list, if any."""
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == ADDITIONAL_TOOLS and isinstance(item.get("tools"), list):
            return i
    return None


def _held(body: dict[str, Any]) -> int | None:
    """The item holding the request's tools: only when there are no top-level tools."""
    items = body.get("input")
    return holder(items) if not _top(body) and isinstance(items, list) else None


def tools_of(body: dict[str, Any]) -> list[Any] | None:
    """The request's tools: the top-level list unless it is absent or empty and an item holds them."""
    i = _held(body)
    return body["input"][i]["tools"] if i is not None else _top(body)


def place(body: dict[str, Any], tools: list[Any]) -> None:
    """Make `tools` the request's tools where they are (a copy of the holding item, not the client's object)."""
    i = _held(body)
    if i is None:
        body["tools"] = tools
        return
    items = list(body["input"])
    items[i] = {**items[i], "tools": tools}
    body["input"] = items


def names(tools: list[Any]) -> list[str]:
    """Every tool's name, a namespace's own tools' names after it: a call names one of those."""
    out: list[str] = []
    for t in tools:
        if not isinstance(t, dict):
            continue
        out.append(str(t.get("name") or t.get("type")))
        inner = t.get("tools") if t.get("type") == NAMESPACE else None
        if isinstance(inner, list):
            out += [str(x.get("name") or x.get("type")) for x in inner if isinstance(x, dict)]
    return out
