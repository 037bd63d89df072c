"""The simulator's provider side of a prompt: deterministic rendering, token counts, and prefix caching.

OpenAI's documented rule, as the simulator applies it: a request's cached tokens
are the longest prefix it shares with an earlier prompt, counted once at least
CACHE_MIN_TOKENS match and in CACHE_BLOCK steps.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.replay.trace_text import joined_text
from proxy.tokens.encodings import get_encoding
from proxy.tokens.prefix import common_prefix

DEFAULT_WINDOW = 32_000
ENCODING = "o200k_base"
CACHE_MIN_TOKENS = 1024  # OpenAI: no cache hit below this prefix length ...
CACHE_BLOCK = 128  # ... and hits grow in 128-token steps
SIMULATED_HEADER = "x-ctxproxy-simulated"
FINGERPRINT = "ctxproxy-simulator"
ORDINARY_ANSWER = "ok"
SUMMARY_NOTE = ("_(simulated summary: lines copied from the transcript by ctxproxy's provider simulator; "
                "no model was called)_")
_LINE_CHARS = 160  # an extracted line, at most this many characters
_SECTION_LINES = 4  # lines per summary section

Chunk = tuple[int, ...]


# --------------------------------------------------------------------------- rendering and tokens

def _part_text(part: Any) -> str | None:
    if isinstance(part, dict) and part.get("type") == "prompt_cache_breakpoint":
        return None  # a cache marker, not content
    if isinstance(part, dict) and isinstance(part.get("text"), str):
        return str(part["text"])
    if isinstance(part, dict) and part.get("type") in ("image_url", "input_image", "image"):
        return "[image]"
    return json.dumps(part, sort_keys=True)


def _content_text(content: Any) -> str:
    return joined_text(content, _part_text)


def render_message(msg: Any) -> str:
    """The text one message costs (see the module docstring)."""
    if not isinstance(msg, dict):
        return f"<|invalid|>{json.dumps(msg)}<|end|>\n"
    head = f"<|{msg.get('role', '')}|>"
    if msg.get("name"):
        head += f" name={msg['name']}"
    parts = [head, "\n", _content_text(msg.get("content"))]
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            parts.append(f"\n<tool_call id={call.get('id')}>{fn.get('name')}({fn.get('arguments')})")
        else:
            parts.append(f"\n<tool_call>{json.dumps(call, sort_keys=True)}")
    if msg.get("tool_call_id"):
        parts.append(f"\n<tool_call_id={msg['tool_call_id']}>")
    parts.append("<|end|>\n")
    return "".join(parts)


class _Tokens:
    """o200k_base token tuples memoized by text: a replay resends the same messages every turn."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._memo: dict[str, Chunk] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def __call__(self, text: str) -> Chunk:
        hit = self._memo.get(text)
        if hit is None:
            hit = tuple(get_encoding(ENCODING).encode_ordinary(text))
            with self._lock:
                if len(self._memo) >= self._capacity:
                    self._memo.clear()
                self._memo[text] = hit
        return hit


tokens = _Tokens()


def prompt_chunks(body: Mapping[str, Any]) -> list[Chunk]:
    """Token chunks of a chat request: one for `tools` if any, then one per message."""
    chunks = [tokens("<|tools|>" + json.dumps(body["tools"]))] if body.get("tools") else []
    chunks += [tokens(render_message(m)) for m in body.get("messages") or []]
    return chunks


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """What the simulator bills as `prompt_tokens` for a chat request."""
    return sum(len(c) for c in prompt_chunks(body))


def billable_cached(shared: int) -> int:
    """OpenAI's rule: 0 under 1,024 tokens, else rounded down to a multiple of 128."""
    return 0 if shared < CACHE_MIN_TOKENS else shared // CACHE_BLOCK * CACHE_BLOCK


def common_prefix_len(a: Chunk, b: Chunk) -> int:
    """Tokens two prompts share from the start."""
    return common_prefix(a, b)


class _Node:
    __slots__ = ("children", "last_used")

    def __init__(self, now: float) -> None:
        self.children: dict[Chunk, _Node] = {}
        self.last_used = now


class PrefixCache:
    """Earlier prompts per cache scope, as a trie of per-message token chunks.

    One dict lookup per message, so replaying long trajectories stays linear;
    only the first differing message is compared token by token. A node's
    `last_used` is refreshed by every prompt passing through it, so `ttl`
    expires prefixes after inactivity, like OpenAI's cache. (Caveat: when a
    message is a strict token prefix of the earlier one at that position,
    matching stops at the message boundary; with every message ending in
    ``<|end|>`` this does not arise in practice.) The test suite's mock
    provider has its own implementation of the same rule (tests/_mock_prompt.py).
    """

    def __init__(self) -> None:
        self._roots: dict[tuple[str, str], _Node] = {}

    def clear(self) -> None:
        self._roots.clear()

    def match_and_store(self, scope: tuple[str, str], chunks: Sequence[Chunk], now: float = 0.0,
                        ttl: float | None = None) -> int:
        """Longest common token prefix with any live earlier prompt of the scope; then remember this one."""
        node = self._roots.setdefault(scope, _Node(now))
        matched, matching = 0, True
        for chunk in chunks:
            child = None
            if matching:
                if ttl is not None:
                    for key in [k for k, c in node.children.items() if now - c.last_used > ttl]:
                        del node.children[key]
                child = node.children.get(chunk)
                if child is not None:
                    matched += len(chunk)
                else:
                    matched += max((common_prefix_len(chunk, k) for k in node.children), default=0)
                    matching = False
            if child is None:
                child = node.children[chunk] = _Node(now)
            child.last_used = now
            node = child
        return matched


