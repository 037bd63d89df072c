"""The simulator's Anthropic Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``).

The rules, exact so that anyone can recompute the figures:

* **Prompt tokens.** A request is rendered, in Anthropic's prefix order
  (tools, system, messages), as token chunks, ONE PER BLOCK so that a cache
  breakpoint always falls on a chunk boundary; each chunk is tokenized on its
  own with o200k_base (``encode_ordinary``), like a chat message
  (proxy/replay/sim_prompt.py). A block's ``cache_control`` is a marker, not
  content: it is left out of every rendering.

  - each tool: ``"<|tool|>" + json.dumps(tool)``;
  - ``system``: a string is one chunk ``<|system|>\\n{text}<|end|>\\n``; a list
    of text blocks one such chunk per block;
  - each message: a string ``content`` is one text block; then per block, for
    the message's role R:

    - ``text``: ``<|R|>\\n{text}<|end|>\\n`` (chat's rendering of a message);
    - ``image``: ``<|R|>\\n[image]<|end|>\\n``;
    - ``tool_use``: ``<|assistant|>\\n\\n<tool_call id={id}>{name}({json.dumps(input)})<|end|>\\n``
      (chat's rendering of an assistant message holding that one call);
    - ``tool_result``: ``<|tool|>\\n{content}\\n<tool_call_id={tool_use_id}>[ is_error]<|end|>\\n``,
      its content a string as is, or its blocks joined by ``\\n`` (text as is,
      ``[image]``, others as sorted JSON);
    - ``thinking``: ``<|thinking|>\\n{thinking}<|end|>\\n`` (the signature is not billed);
    - ``redacted_thinking``: ``<|thinking|>\\n<redacted>`` + one `` thinking``
      per 16/3 characters of ``data``, ``<|end|>\\n`` (billed as the thinking
      it carries, like the Responses API's encrypted reasoning);
    - any other block: ``<|{type}|>\\n{JSON with sorted keys}<|end|>\\n``.

  The prompt's total is ``input_tokens + cache_read_input_tokens +
  cache_creation_input_tokens``, as Anthropic splits it.
* **Prompt caching, as Anthropic documents it.** A breakpoint is a tool, a
  system block or a message's content block with ``cache_control`` (a
  ``tool_result`` also when a block inside it has one; a top-level
  ``cache_control``, automatic caching, marks the last block; at most 4
  markers per request, else a 400). Per cache scope (the key: ``x-api-key``, else the
  ``Authorization`` header's bearer token; and the model), each accepted request WRITES the
  prefix ending at each of its breakpoints that is at least 1,024 tokens long,
  and READS the longest prefix written earlier that it repeats exactly and
  that ends at one of its breakpoints or at a block boundary up to 20 blocks
  before one (Anthropic's lookback). ``cache_read_input_tokens`` is that
  prefix; ``cache_creation_input_tokens`` the tokens from it to the last
  breakpoint, when that prefix is written; ``input_tokens`` the rest (after
  the last breakpoint, or everything with none read or written). A request
  with no breakpoint reads and writes nothing. Nothing expires (``ttl`` only
  labels the write as 5-minute or 1-hour).
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
from dataclasses import dataclass
from typing import Any

from proxy.replay.sim_answers import answer_from
from proxy.replay.sim_prompt import CACHE_MIN_TOKENS, ORDINARY_ANSWER, Chunk, tokens
from proxy.rewrite.compress import summarizer
from proxy.wire.chat.codec import CHAT

MAX_BREAKPOINTS = 4  # Anthropic: cache_control on at most 4 blocks per request
LOOKBACK_BLOCKS = 20  # a breakpoint also reads a prefix ending up to this many blocks before it
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


# --------------------------------------------------------------------------- the prompt

def _stripped(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _nested_text(content: Any) -> str:
    """A tool_result's content as text: a string as is, blocks joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for b in content:
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
                out.append(b["text"])
            elif isinstance(b, dict) and b.get("type") == "image":
                out.append("[image]")
            else:
                out.append(json.dumps(_stripped(b) if isinstance(b, dict) else b, sort_keys=True))
        return "\n".join(out)
    return json.dumps(content, sort_keys=True)


def render_block(role: str, block: Any) -> str:
    """The text one content block of a `role` message is billed as (see the module docstring)."""
    if isinstance(block, str):
        return f"<|{role}|>\n{block}<|end|>\n"
    if not isinstance(block, dict):
        return f"<|invalid|>{json.dumps(block)}<|end|>\n"
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return f"<|{role}|>\n{block['text']}<|end|>\n"
    if kind == "image":
        return f"<|{role}|>\n[image]<|end|>\n"
    if kind == "tool_use":
        return (f"<|assistant|>\n\n<tool_call id={block.get('id')}>{block.get('name')}"
                f"({json.dumps(block.get('input'))})<|end|>\n")
    if kind == "tool_result":
        error = " is_error" if block.get("is_error") is True else ""
        return (f"<|tool|>\n{_nested_text(block.get('content'))}\n<tool_call_id={block.get('tool_use_id')}>"
                f"{error}<|end|>\n")
    if kind == "thinking":
        return f"<|thinking|>\n{block.get('thinking') or ''}<|end|>\n"
    if kind == "redacted_thinking":
        data = block.get("data")
        n = len(data) * 3 // 16 if isinstance(data, str) else 0
        return "<|thinking|>\n<redacted>" + " thinking" * n + "<|end|>\n"
    return f"<|{kind}|>\n{json.dumps(_stripped(block), sort_keys=True)}<|end|>\n"


def _content_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [content]
    return list(content) if isinstance(content, list) else []


@dataclass(frozen=True)
class Block:
    """One chunk of the prompt and the breakpoint it may carry."""

    chunk: Chunk
    breakpoint: bool
    ttl: str  # the breakpoint's cache_control ttl ("5m" or "1h")


def _cache_control(obj: Any) -> Any:
    """The cache_control a block carries (a tool_result: its own, else one on a block inside it), or None."""
    if not isinstance(obj, dict):
        return None
    if obj.get("cache_control") is not None:
        return obj["cache_control"]
    inner = obj.get("content") if obj.get("type") == "tool_result" else None
    return next((b["cache_control"] for b in inner if isinstance(b, dict) and b.get("cache_control") is not None),
                None) if isinstance(inner, list) else None


def _block(text: str, obj: Any) -> Block:
    cc = _cache_control(obj)
    ttl = "1h" if isinstance(cc, dict) and cc.get("ttl") == "1h" else "5m"
    return Block(tokens(text), cc is not None, ttl)


def system_blocks(system: Any) -> list[Any]:
    """The top-level `system` as blocks: a string is one text block."""
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return list(system) if isinstance(system, list) else []


def prompt_blocks(body: Mapping[str, Any]) -> list[Block]:
    """The prompt of a Messages request, block by block: tools, system, then each message's content blocks."""
    out = []
    for tool in body.get("tools") or []:
        out.append(_block("<|tool|>" + json.dumps(_stripped(tool) if isinstance(tool, dict) else tool), tool))
    for b in system_blocks(body.get("system")):
        text = b.get("text") if isinstance(b, dict) else b
        out.append(_block(f"<|system|>\n{text if isinstance(text, str) else json.dumps(b)}<|end|>\n", b))
    for m in body.get("messages") or []:
        role = str(m.get("role", "")) if isinstance(m, dict) else ""
        for b in _content_blocks(m.get("content") if isinstance(m, dict) else None):
            out.append(_block(render_block(role, b), b))
    auto = body.get("cache_control")
    if auto is not None and out and not out[-1].breakpoint:  # automatic caching: the last block is marked
        out[-1] = Block(out[-1].chunk, True, "1h" if isinstance(auto, dict) and auto.get("ttl") == "1h" else "5m")
    return out


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The total prompt of a Messages request (what count_tokens answers)."""
    return sum(len(b.chunk) for b in prompt_blocks(body))


# --------------------------------------------------------------------------- caching at breakpoints

class BreakpointCache:
    """Anthropic's prompt cache: prefixes written at breakpoints, per scope; read with the 20-block lookback.

    A prefix is known by a hash chained over its chunks, so "the request repeats
    it exactly" is one set lookup per block boundary.
    """

    def __init__(self) -> None:
        self._written: dict[tuple[str, str], set[int]] = {}

    def clear(self) -> None:
        self._written.clear()

    def read_and_write(self, scope: tuple[str, str], blocks: list[Block]) -> tuple[int, int, str]:
        """(cache_read, cache_creation, the ttl of the write) for this prompt; then remember its writes."""
        marks = [j for j, b in enumerate(blocks) if b.breakpoint]
        if not marks:
            return 0, 0, "5m"
        h, pos = 0, 0
        ends: list[tuple[int, int]] = []  # per block: (hash of the prefix ending there, its length)
        for b in blocks:
            h, pos = hash((h, b.chunk)), pos + len(b.chunk)
            ends.append((h, pos))
        written = self._written.setdefault(scope, set())
        looked = {j for m in marks for j in range(max(0, m - LOOKBACK_BLOCKS), m + 1)}
        read = max((ends[j][1] for j in looked if ends[j][0] in written), default=0)
        last = marks[-1]
        created = ends[last][1] - read if ends[last][1] >= CACHE_MIN_TOKENS else 0
        written.update(ends[j][0] for j in marks if ends[j][1] >= CACHE_MIN_TOKENS)
        return read, max(0, created), blocks[last].ttl


# --------------------------------------------------------------------------- validation

NON_EMPTY = "all messages must have non-empty content except for the optional final assistant message"


def _turns(messages: list[Any]) -> list[tuple[str, list[tuple[int, int, Any]]]]:
    """Consecutive messages of one role combined into one turn, as the API combines them: (role, [(message
    index, block index, block)])."""
    out: list[tuple[str, list[tuple[int, int, Any]]]] = []
    for i, m in enumerate(messages):
        if not out or out[-1][0] != m.get("role"):
            out.append((str(m.get("role")), []))
        out[-1][1].extend((i, k, b) for k, b in enumerate(_content_blocks(m.get("content"))))
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
        blocks = _content_blocks(m.get("content"))
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


def _marked(block: Any) -> bool:
    """A breakpoint: a block with cache_control, or a tool_result with one on a block inside it."""
    if not isinstance(block, dict):
        return False
    inner = block.get("content") if block.get("type") == "tool_result" else None
    return block.get("cache_control") is not None or (isinstance(inner, list) and any(
        isinstance(b, dict) and b.get("cache_control") is not None for b in inner))


def _markers(body: Mapping[str, Any]) -> int:
    """Every cache_control of the request (the top-level one, automatic caching, included)."""
    def count(block: Any) -> int:
        if not isinstance(block, dict):
            return 0
        inner = block.get("content") if block.get("type") == "tool_result" else None
        return (block.get("cache_control") is not None) + (sum(map(count, inner)) if isinstance(inner, list) else 0)

    n = sum(map(count, body.get("tools") or [])) + sum(map(count, system_blocks(body.get("system"))))
    for m in body.get("messages") or []:
        n += sum(map(count, _content_blocks(m.get("content"))))
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


# --------------------------------------------------------------------------- the proxy's own calls

def _system_text(body: Mapping[str, Any]) -> str:
    parts = [b.get("text") if isinstance(b, dict) else b for b in system_blocks(body.get("system"))]
    return "\n".join(p for p in parts if isinstance(p, str))


def _last_text_block(message: Any) -> tuple[int, str] | None:
    """(index, text) of the last text block of a message; a string content is one block."""
    blocks = _content_blocks(message.get("content")) if isinstance(message, dict) else []
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
        blocks = _content_blocks(m.get("content"))
        texts = [_nested_text([b] if isinstance(b, dict) else b) for b in blocks
                 if not (isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result", "thinking",
                                                                   "redacted_thinking"))]
        if m.get("role") == "assistant":
            calls = [{"id": b.get("id"), "type": "function",
                      "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))}}
                     for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"]
            out.append({"role": "assistant", "content": "\n".join(texts) or None, **({"tool_calls": calls}
                                                                                   if calls else {})})
            continue
        out += [{"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": _nested_text(b.get("content"))}
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
    blocks = _content_blocks(messages[-1].get("content"))
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


__all__ = ["ORDINARY_ANSWER", "BreakpointCache", "answer", "call_kind", "chat_view", "error_body", "invalid",
           "message_object", "prompt_blocks", "prompt_tokens", "render_block", "sse", "stream_events", "too_long",
           "too_long_with_output", "usage"]
