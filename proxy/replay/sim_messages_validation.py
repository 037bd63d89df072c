"""What the simulator's Messages API refuses, and how: Anthropic's validation, error shape and window wording.

The rules by which the Messages API (proxy/replay/sim_messages.py, served by
proxy/replay/simulator.py) answers HTTP 400, exact so that anyone can recompute
the figures:

* **Validation**, in Anthropic's shape and wording (``{"type": "error",
  "error": {"type": "invalid_request_error", "message": ...}}``): ``model``,
  ``messages`` (not empty) and ``max_tokens`` (an integer >= 0; 0 only warms
  the cache) required (``max_tokens: Field required``), roles ``user`` /
  ``assistant``, blocks with a ``type``; non-empty content except in a final
  assistant message, no empty text block, no trailing whitespace ending a
  final assistant message; at most 4 ``cache_control`` markers; and tool
  pairing, over turns (consecutive messages of one role are combined into one
  turn, as the API combines them): every ``tool_use`` answered by the
  ``tool_result`` blocks that open the next turn, every ``tool_result``
  answering a ``tool_use`` of the turn before. The HTTP endpoint also requires
  the ``anthropic-version`` header.
* **The context window.** A prompt over the window: ``prompt is too long: N
  tokens > M maximum``; a prompt that fits but not with ``max_tokens`` on top:
  ``input length and `max_tokens` exceed context limit: N + B > M, decrease
  input length or `max_tokens` and try again`` (both HTTP 400
  ``invalid_request_error``, both logged as ``context_length_exceeded``). A
  rejected request is not billed and not cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.replay.sim_messages_prompt import content_blocks, system_blocks

MAX_BREAKPOINTS = 4  # Anthropic: cache_control on at most 4 blocks per request
VERSION_HEADER = "anthropic-version"
_ROLES = frozenset({"user", "assistant"})


# --------------------------------------------------------------------------- errors

def error_body(message: str, type_: str = "invalid_request_error") -> dict[str, Any]:
    """Anthropic's error shape."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def too_long(prompt: int, window: int) -> str:
    """Anthropic's wording of a prompt over the context window."""
    return f"prompt is too long: {prompt} tokens > {window} maximum"


def too_long_with_output(prompt: int, budget: int, window: int) -> str:
    """Anthropic's wording of a prompt that fits the window, but not with its `max_tokens` on top."""
    return (f"input length and `max_tokens` exceed context limit: {prompt} + {budget} > {window}, "
            "decrease input length or `max_tokens` and try again")


# --------------------------------------------------------------------------- validation

NON_EMPTY = "all messages must have non-empty content except for the optional final assistant message"


def _turns(messages: list[Any]) -> list[tuple[str, list[tuple[int, int, Any]]]]:
    """Consecutive messages of one role combined into one turn, as the API combines them: (role, [(message
    index, block index, block)])."""
    out: list[tuple[str, list[tuple[int, int, Any]]]] = []
    for i, m in enumerate(messages):
        if not out or out[-1][0] != m.get("role"):
            out.append((str(m.get("role")), []))
        out[-1][1].extend((i, k, b) for k, b in enumerate(content_blocks(m.get("content"))))
    return out


def _is(block: Any, kind: str) -> bool:
    return isinstance(block, dict) and block.get("type") == kind


def _pairing(messages: list[Any]) -> str | None:
    """Anthropic's tool pairing rules over the combined turns, worded as it words them; None when kept: every
    tool_result answers a tool_use of the turn before, every tool_use is answered by the tool_result blocks
    that open the next turn (a final assistant turn has no next turn)."""
    turns = _turns(messages)
    for t, (role, blocks) in enumerate(turns):
        asked = {b.get("id") for _, _, b in turns[t - 1][1] if _is(b, "tool_use")} if t else set()
        for i, k, b in blocks:
            if _is(b, "tool_result") and b.get("tool_use_id") not in asked:
                return (f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` blocks: "
                        f"{b.get('tool_use_id')}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message.")
        uses = [(i, b.get("id")) for i, _, b in blocks if _is(b, "tool_use")] if role == "assistant" else []
        if uses and t + 1 < len(turns):
            answered = set()
            for _, _, b in turns[t + 1][1]:
                if not _is(b, "tool_result"):
                    break
                answered.add(b.get("tool_use_id"))
            missing = [(i, u) for i, u in uses if u not in answered]
            if missing:
                return (f"messages.{missing[0][0]}: `tool_use` ids were found without `tool_result` blocks "
                        f"immediately after: {', '.join(str(u) for _, u in missing)}. Each `tool_use` block must "
                        "have a corresponding `tool_result` block in the next message.")
    return None


def _content(messages: list[Any]) -> str | None:
    """Anthropic's rules on empty content: every message but a final assistant one has some, no text block
    is empty, and a final assistant message (a prefill) does not end in whitespace."""
    for i, m in enumerate(messages):
        final_assistant = i == len(messages) - 1 and m.get("role") == "assistant"
        blocks = content_blocks(m.get("content"))
        if (not blocks or m.get("content") == "") and not final_assistant:
            return f"messages.{i}: {NON_EMPTY}"
        if any(_is(b, "text") and b.get("text") == "" for b in blocks):
            return "messages: text content blocks must be non-empty"
        last = blocks[-1] if blocks else None
        text = last if isinstance(last, str) else last.get("text") if isinstance(last, dict) and _is(last, "text") \
            else None
        if final_assistant and isinstance(text, str) and text != text.rstrip():
            return "messages: final assistant content cannot end with trailing whitespace"
    return None


def _markers(body: Mapping[str, Any]) -> int:
    """Every cache_control of the request (the top-level one, automatic caching, included)."""
    def count(block: Any) -> int:
        if not isinstance(block, dict):
            return 0
        inner = block.get("content") if block.get("type") == "tool_result" else None
        return (block.get("cache_control") is not None) + (sum(map(count, inner)) if isinstance(inner, list) else 0)

    n = sum(map(count, body.get("tools") or [])) + sum(map(count, system_blocks(body.get("system"))))
    for m in body.get("messages") or []:
        n += sum(map(count, content_blocks(m.get("content"))))
    return n + (body.get("cache_control") is not None)


def invalid(body: Any, *, count_only: bool = False) -> str | None:
    """Why Anthropic would refuse `body` (the message of a 400 invalid_request_error), or None."""
    if not isinstance(body, dict):
        return "There was an issue with the format of your request: the body is not a JSON object"
    for field in (() if count_only else ("max_tokens",)) + ("messages", "model"):
        if field not in body:
            return f"{field}: Field required"
    if not count_only:
        budget = body["max_tokens"]
        if not isinstance(budget, int) or isinstance(budget, bool):
            return "max_tokens: Input should be a valid integer"
        if budget < 0:
            return "max_tokens: Input should be greater than or equal to 0"
    if not isinstance(body["model"], str):
        return "model: Input should be a valid string"
    messages = body["messages"]
    if not isinstance(messages, list):
        return "messages: Input should be a valid list"
    if not messages:
        return "messages: at least one message is required"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"messages.{i}: Input should be a valid dictionary"
        if m.get("role") not in _ROLES:
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if not isinstance(m.get("content"), (str, list)):
            return f"messages.{i}.content: Input should be a valid list"
        for k, b in enumerate(m["content"] if isinstance(m["content"], list) else []):
            if not (isinstance(b, dict) and isinstance(b.get("type"), str)):
                return f"messages.{i}.content.{k}.type: Field required"
    system = body.get("system")
    if system is not None and not isinstance(system, (str, list)):
        return "system: Input should be a valid list"
    if body.get("tools") is not None and not isinstance(body["tools"], list):
        return "tools: Input should be a valid list"
    if (why := _content(messages)) is not None:
        return why
    if (why := _pairing(messages)) is not None:
        return why
    n = _markers(body)
    if n > MAX_BREAKPOINTS:
        return f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {n}."
    return None


__all__ = ["MAX_BREAKPOINTS", "NON_EMPTY", "VERSION_HEADER", "error_body", "invalid", "too_long",
           "too_long_with_output"]
