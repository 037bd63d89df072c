"""The simulator's Anthropic Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``).

This module: the answers (ctxproxy's own summarizer calls recognised and
answered) and the wire shapes (usage, the ``message`` object, the stream). The
prompt, its token counts and the breakpoint cache are in
proxy/replay/sim_messages_prompt.py; the validation, the window check's wording
and the error shape in proxy/replay/sim_messages_validation.py. The rules, exact so that
anyone can recompute the figures:

* **Answers.** ``"ok"``, or the extractive summary (proxy/replay/sim_answers.py)
  when the request is one of ctxproxy's summarizer calls: in the transcript
  shape (a top-level ``system`` beginning with the summarizer's prompt), or in
  the cached shape (the last text block of the last user message opens with the
  compaction instruction; it may share that message with tool results, which
  then belong to the span). ``stop_reason`` ``end_turn``, or ``max_tokens``
  when the answer was cut to ``max_tokens``.
* **Streams** (``stream: true``): Anthropic's SSE events, ``event: {type}`` and
  ``data: {json}``: ``message_start`` (the usage so far, ``output_tokens: 1``),
  ``content_block_start``, a ``ping``, ``content_block_delta`` (``text_delta``)
  per word, ``content_block_stop``, ``message_delta`` (``stop_reason`` and the
  final usage), ``message_stop``.
* ``count_tokens``: ``{"input_tokens": total}``, the same validation less
  ``max_tokens`` and the window; free, so it is not in the log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from proxy.replay.sim_answers import answer_from
from proxy.replay.sim_messages_prompt import content_blocks, nested_text, system_blocks
from proxy.replay.sim_prompt import ORDINARY_ANSWER
from proxy.rewrite.compress import summarizer
from proxy.wire.chat.codec import CHAT

# --------------------------------------------------------------------------- the proxy's own calls

def _system_text(body: Mapping[str, Any]) -> str:
    parts = [b.get("text") if isinstance(b, dict) else b for b in system_blocks(body.get("system"))]
    return "\n".join(p for p in parts if isinstance(p, str))


def _last_text_block(message: Any) -> tuple[int, str] | None:
    """(index, text) of the last text block of a message; a string content is one block."""
    blocks = content_blocks(message.get("content")) if isinstance(message, dict) else []
    for k in range(len(blocks) - 1, -1, -1):
        b = blocks[k]
        if isinstance(b, str):
            return k, b
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
            return k, b["text"]
    return None


def _instruction(body: Mapping[str, Any]) -> tuple[int, str] | None:
    """The compaction instruction closing a cached-shape call: the last user message's last text block."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else None
    if not (isinstance(last, dict) and last.get("role") == "user"):
        return None
    found = _last_text_block(last)
    return found if found is not None and found[1].startswith(summarizer.COMPACTION_OPEN) else None


def call_kind(body: Mapping[str, Any]) -> str:
    """"summary" / "facts" for ctxproxy's summarizer calls, else "turn"."""
    system = _system_text(body)
    if system.startswith(summarizer.SYSTEM_PROMPT):
        return "summary"
    if system.startswith(summarizer.FACT_PROMPT):
        return "facts"
    found = _instruction(body)
    if found is not None:
        return "facts" if "\nQuestion: " in found[1] else "summary"
    return "turn"


def chat_view(messages: list[Any]) -> list[dict[str, Any]]:
    """Messages as the chat messages they stand for, for the summarizer's transcript of a span: a user
    message's tool results are tool messages (then its other blocks a user message), an assistant's text
    and tool_use blocks one assistant message with tool calls; thinking is left out."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        blocks = content_blocks(m.get("content"))
        texts = [nested_text([b] if isinstance(b, dict) else b) for b in blocks
                 if not (isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result", "thinking",
                                                                   "redacted_thinking"))]
        if m.get("role") == "assistant":
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))}}
                     for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            out.append({"role": "assistant", "content": "\n".join(texts) or None, **({"tool_calls": calls}
                                                                                   if calls else {})})
            continue
        out += [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": nested_text(b.get("content"))}
                for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def answer(kind: str, body: Mapping[str, Any]) -> str:
    """"ok" to an ordinary request; the extractive summary or fact to ctxproxy's own calls."""
    if kind == "turn":
        return ORDINARY_ANSWER
    messages = list(body.get("messages") or [])
    head = [{"role": "system", "content": _system_text(body)}] if body.get("system") else []
    found = _instruction(body)
    if found is None:  # the transcript shape: the transcript (and question) is the last message's text
        last = chat_view(messages[-1:])
        user = str(last[-1].get("content") or "") if last else ""
        return answer_from(kind, CHAT, head + chat_view(messages), user)
    k, instruction = found
    blocks = content_blocks(messages[-1].get("content"))
    rest = [{**messages[-1], "content": blocks[:k] + blocks[k + 1:]}] if len(blocks) > 1 else []
    items = head + chat_view(messages[:-1] + rest) + [{"role": "user", "content": instruction}]
    return answer_from(kind, CHAT, items, instruction)


# --------------------------------------------------------------------------- the wire shapes

def usage(prompt: int, read: int, created: int, ttl: str, output: int) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` is what is neither read from nor written to the cache."""
    return {"input_tokens": prompt - read - created, "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": created if ttl == "5m" else 0,
                               "ephemeral_1h_input_tokens": created if ttl == "1h" else 0},
            "output_tokens": output, "service_tier": "standard"}


def message_object(n: int, model: str, text: str, usage_: dict[str, Any], stop_reason: str) -> dict[str, Any]:
    """A complete assistant `message` with one text block (none when `text` is empty: max_tokens 0)."""
    return {"id": f"msg_sim{n:020d}", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}] if text else [], "stop_reason": stop_reason,
            "stop_sequence": None, "usage": usage_}


def stream_events(message: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events Anthropic streams for a complete one-text-block `message`."""
    u = message["usage"]
    start_usage = {**u, "output_tokens": 1}
    yield {"type": "message_start", "message": {**message, "content": [], "stop_reason": None,
                                                "stop_sequence": None, "usage": start_usage}}
    for i, block in enumerate(message["content"]):
        yield {"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}
        if i == 0:
            yield {"type": "ping"}
        for piece in re.findall(r"\s*\S+|\s+$", block["text"]):
            yield {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": piece}}
        yield {"type": "content_block_stop", "index": i}
    final = {k: u[k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                               "output_tokens")}
    yield {"type": "message_delta", "delta": {"stop_reason": message["stop_reason"],
                                              "stop_sequence": message["stop_sequence"]}, "usage": final}
    yield {"type": "message_stop"}


def sse(event: dict[str, Any]) -> bytes:
    """Anthropic's SSE framing: a named event per message."""
    return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"


__all__ = ["ORDINARY_ANSWER", "answer", "call_kind", "chat_view", "message_object", "sse", "stream_events", "usage"]
