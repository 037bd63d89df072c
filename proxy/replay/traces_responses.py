"""Trajectories as Responses API requests: chat trajectories converted to items, and native Responses traces.

Conversion of a chat trajectory (what an agent on the Responses API would have
sent for the same conversation): the leading system / developer messages become
``instructions``; user, system and developer text a ``message`` item with
``input_text`` parts, assistant text one with ``output_text`` parts; each
assistant tool call a ``function_call`` item (after the assistant's text), each
tool message a ``function_call_output``; chat tools
``{"type": "function", "function": {...}}`` become flat
``{"type": "function", "name": ...}``. Each chat turn (an assistant message at
index i) is the request holding the items of ``messages[:i]``.

A native trace (the format of the shared ``traces-native`` corpus: ``api:
"responses"``, ``items``, ``tools``, ``instructions``, ``model``) is replayed
as recorded: each turn is the input up to and including one
``function_call_output`` / ``custom_tool_call_output``, the point where the
agent sent the tool's result back and the model answered.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.replay.trace_text import NativeTraceError, content_text

_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_LEADING = frozenset({"system", "developer"})


def _parts(content: Any, kind: str) -> list[dict[str, Any]]:
    """Chat content as Responses content parts: text as `kind` parts, images as input_image."""
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for p in content:
            url = p.get("image_url") if isinstance(p, dict) and p.get("type") == "image_url" else None
            if isinstance(url, dict):
                url = url.get("url")
            if isinstance(url, str) and kind == "input_text":
                parts.append({"type": "input_image", "image_url": url, "detail": "auto"})
            else:
                parts.append({"type": kind, "text": content_text([p])})
        return parts
    return [{"type": kind, "text": content_text(content)}]


def convert_messages(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]], list[int]]:
    """(instructions, items, starts): `starts[i]` is how many items come before message i."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in _LEADING:
        lead += 1
    instructions = "\n\n".join(content_text(m.get("content")) for m in messages[:lead]) or None
    items: list[dict[str, Any]] = []
    starts = [0] * lead
    legacy: list[str] = []  # call ids given to legacy `function_call`s, answered by `function` messages
    for i, m in enumerate(messages[lead:], lead):
        starts.append(len(items))
        role = m.get("role")
        if role == "assistant":
            calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            fc = m.get("function_call")
            if m.get("content") or not (calls or isinstance(fc, dict)):
                items.append({"type": "message", "role": "assistant",
                              "content": _parts(m.get("content"), "output_text")})
            for c in calls:
                fn = c.get("function")
                fn = fn if isinstance(fn, dict) else {}
                args = fn.get("arguments")
                items.append({"type": "function_call", "call_id": str(c.get("id")), "name": str(fn.get("name")),
                              "arguments": args if isinstance(args, str) else json.dumps(args)})
            if isinstance(fc, dict):
                legacy.append(f"call_legacy_{i}")
                items.append({"type": "function_call", "call_id": legacy[-1], "name": str(fc.get("name")),
                              "arguments": str(fc.get("arguments") or "")})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": str(m.get("tool_call_id")),
                          "output": content_text(m.get("content"))})
        elif role == "function":
            items.append({"type": "function_call_output", "call_id": legacy.pop(0) if legacy else f"call_{i}",
                          "output": content_text(m.get("content"))})
        else:
            items.append({"type": "message", "role": str(role), "content": _parts(m.get("content"), "input_text")})
    starts.append(len(items))
    return instructions, items, starts


def convert_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat tool definitions as the Responses API's flat ones; other tools as they are."""
    out = []
    for t in tools or []:
        fn = t.get("function")
        if t.get("type") == "function" and isinstance(fn, dict):
            out.append({"type": "function", **fn})
        else:
            out.append(t)
    return out or None


def native_ends(items: list[Any]) -> list[int]:
    """Each turn's input length: up to and including each tool output."""
    return [k + 1 for k, it in enumerate(items) if isinstance(it, dict) and it.get("type") in _OUTPUTS]


def check_native(data: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, str | None]:
    """(items, tools, instructions) of a native Responses trace; NativeTraceError if it cannot be replayed."""
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise NativeTraceError("a Responses trace needs a non-empty 'items' list")
    for i, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("type", "message" if "role" in it else None), str):
            raise NativeTraceError(f"items[{i}] is not an item (an object with a string 'type')")
    tools = data.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise NativeTraceError("'tools' must be a list of objects")
    instructions = data.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise NativeTraceError("'instructions' must be a string or null")
    if not native_ends(items):
        raise NativeTraceError("no function_call_output or custom_tool_call_output item, so no turn to replay")
    return items, tools or None, instructions


def request(model: str, instructions: str | None, items: list[Any], tools: list[Any] | None) -> dict[str, Any]:
    """The Responses request of a turn whose input is `items`."""
    body: dict[str, Any] = {"model": model, "input": items}
    if instructions:
        body["instructions"] = instructions
    if tools:
        body["tools"] = tools
    return body
