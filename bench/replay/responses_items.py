"""Chat trajectories as Responses API requests, and Responses input read back as chat messages.

The corpus records chat completions; to replay it through ``POST /v1/responses``
each turn is converted the way a client of that API would have sent the same
conversation (the OpenAI Agents SDK, Codex):

* the leading system message -> ``instructions`` (later system messages, and any
  that is not text, -> ``developer`` message items);
* user text -> a ``message`` item with ``input_text`` parts (image parts ->
  ``input_image``); assistant text -> a ``message`` item with ``output_text``
  parts, left out when empty and the message has tool calls;
* each assistant tool call -> one ``function_call`` item (``call_id``,
  ``name``, ``arguments``), after the assistant's text;
* a tool message -> a ``function_call_output`` item answering its call;
* tools -> flat ``{"type": "function", "name", "description", "parameters"}``.

``to_messages`` goes the other way, for what the benchmark reads out of a
Responses request (which request is the proxy's own call, identifiers,
tool-call pairing, previews): ``instructions`` as a leading system message,
messages with their text joined, consecutive calls gathered into one
assistant message, outputs as tool messages; reasoning, compaction and other
items that carry no text are left out. The two round-trip: ``to_messages``
of a converted trajectory has the trajectory's messages at the same positions,
so the chat replay's position-based checks apply unchanged.
"""

from __future__ import annotations

import json
from typing import Any

Message = dict[str, Any]
Item = dict[str, Any]

_CALLS = {"function_call": "arguments", "custom_tool_call": "input"}  # call item type -> its arguments field
_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _parts(content: Any, text_type: str) -> list[dict[str, Any]]:
    """Chat content as Responses content parts: text as `text_type`, images as input_image."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": text_type, "text": content}]
    out: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") == "text" or (p.get("type") is None and isinstance(p.get("text"), str)):
            out.append({"type": text_type, "text": p.get("text", "")})
        elif p.get("type") == "image_url" and text_type == "input_text":
            url = p.get("image_url")
            image = {"type": "input_image", "image_url": url.get("url") if isinstance(url, dict) else url}
            if isinstance(url, dict) and url.get("detail"):
                image["detail"] = url["detail"]
            out.append(image)
        else:  # a part this converter has no rule for: its text, if any, so nothing the model read is lost
            out.append({"type": text_type, "text": _text([p]) or json.dumps(p, sort_keys=True)})
    return out


def _message(role: str, content: Any, text_type: str) -> Item:
    return {"type": "message", "role": role, "content": _parts(content, text_type)}


def to_items(messages: list[Message]) -> tuple[str | None, list[Item]]:
    """(instructions, input items) of a chat conversation; ValueError for a role with no Responses form."""
    instructions = None
    items: list[Item] = []
    for j, m in enumerate(messages):
        role = m.get("role")
        if role in ("system", "developer"):
            if j == 0 and role == "system" and isinstance(m.get("content"), str):
                instructions = m["content"]
            else:
                items.append(_message("developer", m.get("content"), "input_text"))
        elif role == "user":
            items.append(_message("user", m.get("content"), "input_text"))
        elif role == "assistant":
            calls = [c for c in m.get("tool_calls") or [] if isinstance(c, dict)]
            if _text(m.get("content")) or not calls:
                items.append(_message("assistant", m.get("content") or "", "output_text"))
            for c in calls:
                fn = c.get("function") or {}
                args = fn.get("arguments", "")
                items.append({"type": "function_call", "call_id": c.get("id"), "name": fn.get("name"),
                              "arguments": args if isinstance(args, str) else json.dumps(args)})
        elif role == "tool":
            content = m.get("content")
            output = content if isinstance(content, str) else _parts(content, "input_text")
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": output})
        else:
            raise ValueError(f"messages[{j}]: role {role!r} has no Responses API form")
    return instructions, items


def to_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat tool definitions in the Responses API's flat form (anything but a function tool as it is)."""
    out = []
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type") != "function" or not isinstance(fn, dict):
            out.append(t)
            continue
        flat = {"type": "function", "name": fn.get("name"), "description": fn.get("description", ""),
                "parameters": fn.get("parameters") or {"type": "object", "properties": {}}}
        if "strict" in fn:
            flat["strict"] = fn["strict"]
        out.append(flat)
    return out


def to_request(chat_body: dict[str, Any]) -> dict[str, Any]:
    """The Responses request a stateless client sends for one chat completion body (`store: false`)."""
    instructions, items = to_items(chat_body["messages"])
    body: dict[str, Any] = {"model": chat_body["model"]}
    if instructions is not None:
        body["instructions"] = instructions
    body["input"] = items
    if chat_body.get("tools"):
        body["tools"] = to_tools(chat_body["tools"])
    body["store"] = False
    return body


def to_messages(items: Any, instructions: Any = None) -> list[Message]:
    """Responses input (a string or items) as chat messages: the view the benchmark's checks read."""
    out: list[Message] = []
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return out + [{"role": "user", "content": items}]
    gathering = False  # the last message is an assistant message further calls belong to
    for it in items if isinstance(items, list) else []:
        if not isinstance(it, dict):
            continue
        kind = it.get("type") or ("message" if "role" in it else None)
        if kind == "message":
            out.append({"role": it.get("role"), "content": _text(it.get("content"))})
            gathering = it.get("role") == "assistant"
        elif kind in _CALLS:
            args = it.get(_CALLS[kind])
            call = {"id": it.get("call_id"), "type": "function",
                    "function": {"name": it.get("name"), "arguments": args if isinstance(args, str) else ""}}
            if not gathering:
                out.append({"role": "assistant", "content": None})
                gathering = True
            out[-1].setdefault("tool_calls", []).append(call)
        elif kind in _OUTPUTS:
            out.append({"role": "tool", "tool_call_id": it.get("call_id"), "content": _text(it.get("output"))})
            gathering = False
    return out
