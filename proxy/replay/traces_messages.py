"""Trajectories as Anthropic Messages requests: chat trajectories converted, and native Messages traces.

Conversion of a chat trajectory (what an agent on the Messages API, Claude
Code say, would have sent for the same conversation):

* the leading system / developer messages become the top-level ``system``, one
  text block each; a later one becomes a user text block;
* user text -> ``text`` blocks (image parts -> ``image`` blocks); assistant
  text -> a ``text`` block (left out when empty), each of its tool calls a
  ``tool_use`` block after it (``input``: the parsed JSON arguments when they
  are an object, ``{}`` when empty, else ``{"raw": arguments}``); each tool
  message a ``tool_result`` block (legacy ``function_call`` / ``function``
  messages likewise, with made-up ids);
* consecutive messages of one role are merged into one message, so roles
  alternate, tool results first in a user message (Anthropic wants them at
  its start);
* chat tools ``{"type": "function", "function": {name, description,
  parameters}}`` -> ``{name, description, input_schema}``.

Each converted assistant message (after the first message) marks one turn:
the request holding the messages before it. (A run of assistant messages is
one answer, so it is one turn.)

A native trace (the shared ``traces-native`` format: ``api: "messages"``,
``items`` = Messages-shape messages, ``system``, ``tools``, ``model``,
``last_request_input_len``) is replayed as recorded: a turn per user message
that holds ``tool_result`` blocks (the agent sent the results back and the
model answered), and the last recorded request.

Every request carries ``max_tokens`` (:data:`MAX_TOKENS`; the API requires it;
the chat and Responses replays send no output budget) and the cache
breakpoints Claude Code places: ``cache_control`` on the last block of the
system prompt, if there is one, and on the last content block of the last
message. So the "no proxy" side is a client that caches as Claude Code does.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.replay.trace_text import NativeTraceError, content_text

MAX_TOKENS = 4096  # the output budget every replayed Messages request asks for
BREAKPOINT = {"type": "ephemeral"}
_LEADING = frozenset({"system", "developer"})

Block = dict[str, Any]
Message = dict[str, Any]


def _image(url: str) -> Block:
    if url.startswith("data:") and ";base64," in url:
        media, data = url[5:].split(";base64,", 1)
        return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _blocks(content: Any) -> list[Block]:
    """Chat content as Messages blocks: text as text blocks (empty ones left out), images as image blocks."""
    if not isinstance(content, list):
        text = content_text(content)
        return [{"type": "text", "text": text}] if text else []
    out: list[Block] = []
    for p in content:
        url = p.get("image_url") if isinstance(p, dict) and p.get("type") == "image_url" else None
        if isinstance(url, dict):
            url = url.get("url")
        if isinstance(url, str):
            out.append(_image(url))
        elif text := content_text([p]):
            out.append({"type": "text", "text": text})
    return out


def tool_input(arguments: Any) -> dict[str, Any]:
    """A chat call's arguments as a tool_use `input` (an object): parsed JSON, {} when empty, else {"raw": ...}."""
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"raw": arguments if isinstance(arguments, str)
                                                    else json.dumps(arguments)}


def _result(call_id: str, content: Any) -> Block:
    return {"type": "tool_result", "tool_use_id": call_id,
            "content": content if isinstance(content, str) else (_blocks(content) or content_text(content))}


def _append(out: list[Message], role: str, blocks: list[Block]) -> None:
    """Add blocks as a message of `role`, merged into the last one when it has that role."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": list(blocks)})
    if role == "user":  # tool results first, in order; the rest after them
        content = out[-1]["content"]
        content.sort(key=lambda b: b.get("type") != "tool_result")


def convert_messages(messages: list[dict[str, Any]]) -> tuple[list[Block] | None, list[Message]]:
    """(system blocks, Messages messages) of a chat conversation."""
    lead = 0
    while lead < len(messages) and messages[lead].get("role") in _LEADING:
        lead += 1
    system = [b for m in messages[:lead] for b in _blocks(content_text(m.get("content")))] or None
    out: list[Message] = []
    legacy: list[str] = []  # ids given to legacy `function_call`s, answered by `function` messages
    for i, m in enumerate(messages[lead:], lead):
        role = m.get("role")
        if role == "assistant":
            blocks = _blocks(m.get("content"))
            for c in m.get("tool_calls") or []:
                fn = c.get("function") if isinstance(c, dict) else None
                fn = fn if isinstance(fn, dict) else {}
                blocks.append({"type": "tool_use", "id": str(c.get("id")), "name": str(fn.get("name")),
                               "input": tool_input(fn.get("arguments"))})
            fc = m.get("function_call")
            if isinstance(fc, dict):
                legacy.append(f"call_legacy_{i}")
                blocks.append({"type": "tool_use", "id": legacy[-1], "name": str(fc.get("name")),
                               "input": tool_input(fc.get("arguments"))})
            _append(out, "assistant", blocks)
        elif role == "tool":
            _append(out, "user", [_result(str(m.get("tool_call_id")), m.get("content"))])
        elif role == "function":
            _append(out, "user", [_result(legacy.pop(0) if legacy else f"call_{i}", m.get("content"))])
        else:  # user, and a system / developer message after the conversation began
            _append(out, "user", _blocks(m.get("content")))
    return system, out


def convert_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Chat tool definitions as Anthropic's {name, description, input_schema}; other tools as they are."""
    out = []
    for t in tools or []:
        fn = t.get("function")
        if t.get("type") == "function" and isinstance(fn, dict):
            out.append({"name": fn.get("name"), "description": fn.get("description") or "",
                        "input_schema": fn.get("parameters") or {"type": "object", "properties": {}}})
        else:
            out.append(t)
    return out or None


def assistant_ends(messages: list[Message]) -> list[int]:
    """Each turn's length in messages: the index of each assistant message after the first message."""
    return [k for k, m in enumerate(messages) if k > 0 and m.get("role") == "assistant"]


def native_ends(items: list[Any], last_request: int | None) -> list[int]:
    """Each turn's length: up to and including each user message with tool results, and the last request."""
    ends = {k + 1 for k, m in enumerate(items) if isinstance(m, dict) and m.get("role") == "user"
            and isinstance(m.get("content"), list)
            and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in m["content"])}
    if last_request:
        ends = {e for e in ends if e <= last_request} | {last_request}
    return sorted(ends)


def check_native(data: dict[str, Any]) -> tuple[list[Message], list[dict[str, Any]] | None, Any, list[int]]:
    """(messages, tools, system, turn ends) of a native Messages trace; NativeTraceError if it cannot be replayed."""
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise NativeTraceError("a Messages trace needs a non-empty 'items' list")
    for i, m in enumerate(items):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant") \
                or not isinstance(m.get("content"), (str, list)):
            raise NativeTraceError(f"items[{i}] is not a message (role user or assistant, content a string or "
                                   "a list of blocks)")
    tools = data.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise NativeTraceError("'tools' must be a list of objects")
    system = data.get("system")
    if system is not None and not isinstance(system, (str, list)):
        raise NativeTraceError("'system' must be a string, a list of text blocks, or null")
    last = data.get("last_request_input_len")
    if last is not None and not (isinstance(last, int) and not isinstance(last, bool) and 0 < last <= len(items)):
        raise NativeTraceError(f"'last_request_input_len' must be 1-{len(items)}, got {last!r}")
    ends = native_ends(items, last)
    if not ends:
        raise NativeTraceError("no user message with tool_result blocks, so no turn to replay")
    return items, tools or None, system, ends


def with_breakpoints(system: Any, messages: list[Message]) -> tuple[Any, list[Message]]:
    """Claude Code's cache breakpoints: on the system prompt's last block and the last message's last block.

    Copies what it marks (the trace's own objects stay unmarked, so every turn marks only its own last message).
    """
    if isinstance(system, str) and system:
        system = [{"type": "text", "text": system}]
    if isinstance(system, list) and system and isinstance(system[-1], dict):
        system = [*system[:-1], {**system[-1], "cache_control": BREAKPOINT}]
    if messages:
        last = messages[-1]
        content = last.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}] if content else []
        if isinstance(content, list) and content and isinstance(content[-1], dict):
            messages = [*messages[:-1], {**last, "content": [*content[:-1],
                                                              {**content[-1], "cache_control": BREAKPOINT}]}]
    return system, messages


def request(model: str, system: Any, messages: list[Any], tools: list[Any] | None) -> dict[str, Any]:
    """The Messages request of a turn whose input is `messages`, with Claude Code's breakpoints."""
    system, messages = with_breakpoints(system, messages)
    body: dict[str, Any] = {"model": model, "max_tokens": MAX_TOKENS}
    if system:
        body["system"] = system
    body["messages"] = messages
    if tools:
        body["tools"] = tools
    return body
