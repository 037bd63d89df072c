"""Chat trajectories as Anthropic Messages requests, and Messages requests read back as chat messages.

The corpus records chat completions; to replay it through ``POST /v1/messages``
each turn is converted the way Claude Code would have sent the same
conversation:

* the leading system message(s) -> the top-level ``system``, one text block
  each (a later system message -> user text);
* user text -> ``text`` blocks (image parts -> ``image`` blocks with a URL or
  base64 source); assistant text -> a ``text`` block (left out when empty),
  then one ``tool_use`` block per tool call (``input`` = the parsed JSON
  arguments when they are an object, ``{}`` when empty, else ``{"raw": ...}``);
* each tool message -> a ``tool_result`` block; consecutive messages of one
  role are merged, so roles alternate and every ``tool_use`` is answered at the
  start of the next message, as the API requires;
* tools -> ``{"name", "description", "input_schema"}``;
* ``max_tokens`` :data:`MAX_TOKENS` (the API requires one; the chat and
  Responses replays send no output budget), and Claude Code's cache
  breakpoints: ``cache_control`` on the system prompt's last block and on the
  last block of the last message. So "no-proxy" is a client that caches as
  Claude Code does, and its cache reads are a fair baseline.

``to_messages`` goes the other way, for the benchmark's checks: ``system`` as
a leading system message; a user message's ``tool_result`` blocks as tool
messages (in order), its other blocks as one user message after them; an
assistant message as one assistant message with its text and its
``tool_use`` blocks as tool calls (arguments: the input as compact JSON;
thinking left out). A text block opening
with ``<agent_status>`` (ctxproxy's status bar, which the Messages API's
alternating roles put inside the last user message) reads as a user message
of its own, after the rest, so the checks set it aside as in chat. A converted trajectory
reads back with its messages at the same positions, except that two chat user
messages in a row (merged into one) read back as one.
"""

from __future__ import annotations

import json
from typing import Any

Message = dict[str, Any]
Block = dict[str, Any]

MAX_TOKENS = 4096
STATUS_OPEN = "<agent_status>"  # ctxproxy's status bar: in Messages a text block of the last user message
BREAKPOINT = {"type": "ephemeral"}
ANTHROPIC_VERSION = "2023-06-01"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _blocks(content: Any) -> list[Block]:
    """Chat content as text and image blocks (empty text left out: the API refuses empty text blocks)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[Block] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        url = p.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if p.get("type") == "image_url" and isinstance(url, str):
            if url.startswith("data:") and ";base64," in url:
                media, data = url[5:].split(";base64,", 1)
                out.append({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}})
            else:
                out.append({"type": "image", "source": {"type": "url", "url": url}})
        elif text := (_text([p]) or (json.dumps(p, sort_keys=True) if p.get("type") != "text" else "")):
            out.append({"type": "text", "text": text})
    return out


def tool_input(arguments: Any) -> dict[str, Any]:
    """A chat call's arguments as a tool_use `input`: the parsed object, {} when empty, else {"raw": ...}."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {"raw": arguments}
    return parsed if isinstance(parsed, dict) else {"raw": arguments}


def _add(out: list[Message], role: str, blocks: list[Block]) -> None:
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"] += blocks
    else:
        out.append({"role": role, "content": list(blocks)})
    if role == "user":  # the API wants a message's tool results before anything else in it
        out[-1]["content"].sort(key=lambda b: b.get("type") != "tool_result")


def to_messages_body(messages: list[Message]) -> tuple[list[Block] | None, list[Message]]:
    """(system blocks, Messages messages) of a chat conversation."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in ("system", "developer"):
        lead += 1
    system = [b for m in messages[:lead] for b in _blocks(_text(m.get("content")))] or None
    out: list[Message] = []
    for m in messages[lead:]:
        role = m.get("role")
        if role == "assistant":
            blocks = _blocks(m.get("content"))
            for c in m.get("tool_calls") or []:
                fn = (c.get("function") or {}) if isinstance(c, dict) else {}
                blocks.append({"type": "tool_use", "id": str(c.get("id")), "name": str(fn.get("name")),
                               "input": tool_input(fn.get("arguments"))})
            _add(out, "assistant", blocks)
        elif role == "tool":
            content = m.get("content")
            result = content if isinstance(content, str) else (_blocks(content) or _text(content))
            _add(out, "user", [{"type": "tool_result", "tool_use_id": str(m.get("tool_call_id")),
                                "content": result}])
        else:
            _add(out, "user", _blocks(m.get("content")))
    return system, out


def to_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Chat tool definitions as Anthropic's (anything but a function tool as it is)."""
    out = []
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if t.get("type") != "function" or not isinstance(fn, dict):
            out.append(t)
            continue
        out.append({"name": fn.get("name"), "description": fn.get("description") or "",
                    "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
    return out


def with_breakpoints(system: Any, messages: list[Message]) -> tuple[Any, list[Message]]:
    """Claude Code's cache breakpoints on the system prompt's last block and the last message's last block
    (copies: the objects marked belong to the trajectory, which every turn shares)."""
    if isinstance(system, str) and system:
        system = [{"type": "text", "text": system}]
    if isinstance(system, list) and system and isinstance(system[-1], dict):
        system = [*system[:-1], {**system[-1], "cache_control": BREAKPOINT}]
    if messages:
        last = messages[-1]
        content = last.get("content")
        if isinstance(content, str) and content:
            content = [{"type": "text", "text": content}]
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            messages = [*messages[:-1], {**last, "content": [*content[:-1], {**content[-1],
                                                                              "cache_control": BREAKPOINT}]}]
    return system, messages


def request(model: str, system: Any, messages: list[Message], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The Messages request Claude Code sends with these messages: max_tokens, its breakpoints, the tools."""
    system, messages = with_breakpoints(system, messages)
    body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS}
    if system:
        body["system"] = system
    body["messages"] = messages
    if tools:
        body["tools"] = tools
    return body


def to_request(chat_body: dict[str, Any]) -> dict[str, Any]:
    """The Messages request for one chat completion body."""
    system, messages = to_messages_body(chat_body["messages"])
    return request(chat_body["model"], system, messages, to_tools(chat_body.get("tools")) or None)


def is_messages_body(body: Any) -> bool:
    """A Messages request (rather than a chat one): a top-level system, or a block only Messages has."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return False
    if "system" in body:
        return True
    return any(isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result", "thinking", "redacted_thinking")
               for m in body["messages"] if isinstance(m, dict) and isinstance(m.get("content"), list)
               for b in m["content"])


def _block_text(b: Any) -> str:
    if isinstance(b, str):
        return b
    if not isinstance(b, dict):
        return ""
    if b.get("type") == "text" and isinstance(b.get("text"), str):
        return b["text"]
    if b.get("type") == "tool_result":
        return _text(b.get("content"))
    return "[image]" if b.get("type") == "image" else ""


def to_messages(body: Any) -> list[Message]:
    """A Messages request's conversation as chat messages: the view the benchmark's checks read."""
    if not isinstance(body, dict):
        return []
    out: list[Message] = []
    system = body.get("system")
    text = system if isinstance(system, str) else _text(system)
    if text:
        out.append({"role": "system", "content": text})
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else []
        if m.get("role") == "assistant":
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"),
                                   "arguments": json.dumps(b.get("input"), separators=(",", ":"))}}
                     for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            words = [t for t in map(_block_text, blocks) if t]
            msg: Message = {"role": "assistant", "content": "\n".join(words) or None}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        rest, status = [], []
        for b in blocks:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                out.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _block_text(b)})
            elif (t := _block_text(b)).startswith(STATUS_OPEN):
                status.append(t)
            elif t:
                rest.append(t)
        if rest or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks) and not status:
            out.append({"role": "user", "content": "\n".join(rest)})
        out += [{"role": "user", "content": t} for t in status]
    return out
