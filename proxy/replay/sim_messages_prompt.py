"""The simulator's Messages prompt: Anthropic's block-by-block rendering, its token counts, and the breakpoint cache.

The Messages API (proxy/replay/sim_messages.py) bills and caches a request by
these rules; what it refuses is in proxy/replay/sim_messages_validation.py.

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
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.replay.sim_prompt import CACHE_MIN_TOKENS, Chunk, tokens
from proxy.replay.trace_text import joined_text

LOOKBACK_BLOCKS = 20  # a breakpoint also reads a prefix ending up to this many blocks before it


# --------------------------------------------------------------------------- the prompt

def _stripped(block: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _block_text(b: Any) -> str:
    if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
        return str(b["text"])
    if isinstance(b, dict) and b.get("type") == "image":
        return "[image]"
    return json.dumps(_stripped(b) if isinstance(b, dict) else b, sort_keys=True)


def nested_text(content: Any) -> str:
    """A tool_result's content as text: a string as is, blocks joined by newlines."""
    return joined_text(content, _block_text)


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
        return (f"<|tool|>\n{nested_text(block.get('content'))}\n<tool_call_id={block.get('tool_use_id')}>"
                f"{error}<|end|>\n")
    if kind == "thinking":
        return f"<|thinking|>\n{block.get('thinking') or ''}<|end|>\n"
    if kind == "redacted_thinking":
        data = block.get("data")
        n = len(data) * 3 // 16 if isinstance(data, str) else 0
        return "<|thinking|>\n<redacted>" + " thinking" * n + "<|end|>\n"
    return f"<|{kind}|>\n{json.dumps(_stripped(block), sort_keys=True)}<|end|>\n"


def content_blocks(content: Any) -> list[Any]:
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
        for b in content_blocks(m.get("content") if isinstance(m, dict) else None):
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



__all__ = ["LOOKBACK_BLOCKS", "Block", "BreakpointCache", "content_blocks", "nested_text", "prompt_blocks",
           "prompt_tokens", "render_block", "system_blocks"]
