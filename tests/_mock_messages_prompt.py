"""The mock provider's prompt rules for an Anthropic Messages request (``POST /v1/messages``).

Like tests/_mock_prompt.py (whose o200k tokenizer this reuses) it imports
nothing from ``proxy``: it is a second implementation of the provider's rules,
written from Anthropic's documentation, so that the proxy's own code is tested
against it rather than against itself.

**Validation**, as the API refuses a request (400 ``invalid_request_error``,
messages worded as Anthropic words them, locations pydantic-style
``messages.1.content.0``): ``max_tokens`` (an integer >= 0; 0 only fills the
prompt cache, as the SDK documents), ``messages`` (a non-empty list) and
``model`` required; roles ``user`` or ``assistant`` (and, after the first,
``system`` right after a user turn: mid-conversation system messages); content a string or a
list of blocks, each an object with a ``type``; unknown block types accepted.
Every message but a final assistant one needs non-empty content, text blocks
must be non-empty, a final assistant message cannot end in whitespace.
Consecutive messages of one role are **accepted and combined into one turn**,
as the API reference says ("Consecutive user or assistant turns in your
request will be combined into a single turn"); the tool checks below work on
those turns: a ``tool_result`` must answer a ``tool_use`` of the turn just
before, and every ``tool_use`` of an assistant turn must be answered in the
next turn (a final assistant turn has no next turn, and passes). At most
``MAX_BREAKPOINTS`` ``cache_control`` markers in the whole request.

**Rendering**: a list of chunks, each tokenized on its own, so that prefixes
end on block boundaries as Anthropic's cache breakpoints do:

* each tool definition: ``<|tool|>{json.dumps(tool)}\\n``;
* the system prompt: a string is one block, a list one chunk per text block;
  the first is preceded by ``<|system|>\\n``;
* the messages, consecutive same-role ones combined into turns, one chunk per
  content block (a string content is one text block): ``<|{role}|>\\n`` before
  a turn's first block, then the block's text and ``\\n``. A block's text:
  ``text`` its text; ``image`` ``[image]``; ``tool_use``
  ``<tool_use id={id}>{name}({json.dumps(input)})``; ``tool_result``
  ``<tool_result id={tool_use_id}[ error]>`` then its content (a string, or
  its blocks' texts joined by ``\\n``); ``thinking`` ``<thinking>{thinking}``
  (the signature is not prompt text); any other type its JSON with sorted keys.

``cache_control`` is never prompt text (it is left out of every rendered
object), so moving a breakpoint does not change the prefix it moves over.

**Caching** (``BreakpointCache``), as Anthropic documents prompt caching:
prefixes are cached only at breakpoints, the blocks marked ``cache_control:
{"type": "ephemeral"[, "ttl": "5m"|"1h"]}`` (a tool, a system block, a message
content block, or a block inside a ``tool_result``, which marks that
tool_result), plus the last block when the request sets a top-level
``cache_control`` (automatic caching; it takes one of the 4 slots). A request
reads the longest prefix written earlier, still within its TTL, that ends at
one of its breakpoints or at one of the ``LOOKBACK`` block boundaries before
one; a read refreshes that entry's TTL. It then writes the prefix at each of
its breakpoints. A prefix shorter than the model's minimum
(``min_cacheable_tokens``) is neither read nor written. Scope: API key and
model. Billed: ``cache_read_input_tokens`` the prefix read;
``cache_creation_input_tokens`` the tokens from there to the last breakpoint
written, split into 5m and 1h by the TTL of the breakpoint each span ends at;
``input_tokens`` the rest (the tokens after the last cache read or write).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

try:  # imported as tests._mock_messages_prompt (benchmarks) or from the pytest rootdir
    from . import _mock_prompt as mp
except ImportError:
    import _mock_prompt as mp  # type: ignore[no-redef]

MAX_BREAKPOINTS = 4
LOOKBACK = 20  # block boundaries before a breakpoint where a cached prefix is still found
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}
MIN_CACHEABLE = 1024
MIN_CACHEABLE_HAIKU = 2048
ROLES = ("user", "assistant")
TRAILING_WHITESPACE = "final assistant content cannot end with trailing whitespace"
NON_EMPTY = "all messages must have non-empty content except for the optional final assistant message"

Scope = tuple[str, str]


class RequestError(Exception):
    """An error the API answers instead of running the model: its HTTP status, error type and message."""

    def __init__(self, message: str, *, status: int = 400, type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.status, self.type_ = message, status, type_


# --------------------------------------------------------------------------- validation

def _fail(loc: str, msg: str) -> RequestError:
    return RequestError(f"{loc}: {msg}")


def _blocks(content: Any) -> list[Any]:
    """A message's content as blocks: a string is one text block (the API's shorthand)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _check_cache_control(block: dict[str, Any], loc: str) -> None:
    """`loc` names the object carrying the marker ("" for the request's top-level cache_control)."""
    cc = block.get("cache_control")
    if cc is None:
        return
    where = f"{loc}.cache_control" if loc else "cache_control"
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise _fail(f"{where}.type", "Input should be 'ephemeral'")
    if "ttl" in cc and cc["ttl"] not in TTL_SECONDS:
        raise _fail(f"{where}.ephemeral.ttl", "Input should be '5m' or '1h'")


def _check_block(block: Any, loc: str) -> None:
    if not isinstance(block, dict):
        raise _fail(loc, "Input should be a valid dictionary")
    kind = block.get("type")
    if not isinstance(kind, str):
        raise _fail(f"{loc}.type", "Field required")
    required = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",),
                "thinking": ("thinking", "signature"), "image": ("source",)}.get(kind, ())
    for name in required:
        if name not in block:
            raise _fail(f"{loc}.{kind}.{name}", "Field required")
    if kind == "text" and not isinstance(block["text"], str):
        raise _fail(f"{loc}.text.text", "Input should be a valid string")
    if kind in ("thinking", "redacted_thinking") and block.get("cache_control") is not None:
        raise _fail(f"{loc}.{kind}.cache_control", "Extra inputs are not permitted")
    _check_cache_control(block, f"{loc}.{kind}")
    if kind == "tool_result" and isinstance(block.get("content"), list):
        for k, inner in enumerate(block["content"]):
            _check_block(inner, f"{loc}.tool_result.content.{k}")


def _empty_text(blocks: list[Any]) -> bool:
    return any(b.get("type") == "text" and b.get("text") == "" for b in blocks)


@dataclass
class Turn:
    """Consecutive messages of one role, combined as the API combines them."""

    role: str
    blocks: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # (message, block, block)


def turns(messages: list[Any]) -> list[Turn]:
    """The conversation as turns: consecutive same-role messages are one turn."""
    out: list[Turn] = []
    for i, msg in enumerate(messages):
        if not out or out[-1].role != msg["role"]:
            out.append(Turn(msg["role"]))
        out[-1].blocks += [(i, k, b) for k, b in enumerate(_blocks(msg["content"]))]
    return out


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise _fail("messages", "Input should be a valid list")
    if not messages:
        raise _fail("messages", "at least one message is required")
    for i, msg in enumerate(messages):
        loc = f"messages.{i}"
        if not isinstance(msg, dict):
            raise _fail(loc, "Input should be a valid dictionary")
        for name in ("content", "role"):
            if name not in msg:
                raise _fail(f"{loc}.{name}", "Field required")
        if msg["role"] == "system" and i:  # mid-conversation system messages: right after a user turn only
            if messages[i - 1].get("role") != "user":
                raise _fail(f"{loc}.role", "a system message must immediately follow a user turn")
        elif msg["role"] not in ROLES:
            raise _fail(f"{loc}.role", "Input should be 'user' or 'assistant'")
        content = msg["content"]
        if not isinstance(content, str | list):
            raise _fail(f"{loc}.content", "Input should be a valid list")
        for k, block in enumerate(content if isinstance(content, list) else []):
            _check_block(block, f"{loc}.content.{k}")
    for i, msg in enumerate(messages):
        final_assistant = i == len(messages) - 1 and msg["role"] == "assistant"
        blocks = _blocks(msg["content"])
        if (not blocks or msg["content"] == "") and not final_assistant:
            raise _fail(f"messages.{i}", NON_EMPTY)
        if _empty_text(blocks) and not (final_assistant and msg["content"] == ""):
            raise _fail("messages", "text content blocks must be non-empty")
        if final_assistant and blocks and blocks[-1].get("type") == "text" and blocks[-1]["text"] != "" \
                and blocks[-1]["text"] != blocks[-1]["text"].rstrip():
            raise _fail("messages", TRAILING_WHITESPACE)
    _check_tool_pairs(turns(messages))


def _check_tool_pairs(conversation: list[Turn]) -> None:
    """Each tool_result answers a tool_use of the turn before; each tool_use is answered in the next turn."""
    for turn in conversation:  # the ids are strings, as the API's schema says (else a 400, never a 500)
        for i, k, b in turn.blocks:
            key = {"tool_use": "id", "tool_result": "tool_use_id"}.get(b.get("type"))
            if key is not None and not isinstance(b.get(key), str):
                raise _fail(f"messages.{i}.content.{k}.{key}", "Input should be a valid string")
    for t, turn in enumerate(conversation):
        before = conversation[t - 1] if t else None
        asked = {b["id"] for _, _, b in before.blocks if b.get("type") == "tool_use"} if before else set()
        stray = [(i, k, b["tool_use_id"]) for i, k, b in turn.blocks
                 if b.get("type") == "tool_result" and b["tool_use_id"] not in asked]
        if stray:
            i, k, _ = stray[0]
            ids = ", ".join(str(s[2]) for s in stray if s[0] == i)
            raise RequestError(f"messages.{i}.content.{k}: unexpected `tool_use_id` found in `tool_result` "
                               f"blocks: {ids}. Each `tool_result` block must have a corresponding "
                               f"`tool_use` block in the previous message.")
        if t + 1 < len(conversation):
            answered = {b["tool_use_id"] for _, _, b in conversation[t + 1].blocks if b.get("type") == "tool_result"}
            missing = [(i, b["id"]) for i, _, b in turn.blocks
                       if b.get("type") == "tool_use" and b["id"] not in answered]
            if missing:
                ids = ", ".join(str(m[1]) for m in missing)
                raise RequestError(f"messages.{missing[0][0]}: `tool_use` ids were found without `tool_result` "
                                   f"blocks immediately after: {ids}. Each `tool_use` block must have a "
                                   f"corresponding `tool_result` block in the next message.")


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise _fail("system", "Input should be a valid list")
    for k, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _fail(f"system.{k}.type", "Input should be 'text'")
        if not isinstance(block.get("text"), str):
            raise _fail(f"system.{k}.text", "Field required")
        if block["text"] == "":
            raise _fail("system", "text content blocks must be non-empty")
        _check_cache_control(block, f"system.{k}")


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _fail("tools", "Input should be a valid list")
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _fail(f"tools.{k}", "Input should be a valid dictionary")
        if "name" not in tool:
            raise _fail(f"tools.{k}.name", "Field required")
        _check_cache_control(tool, f"tools.{k}")


def validate(body: Any, *, create: bool = True) -> None:
    """Raise the 400 the API answers for `body`, if any (`create`: a Messages call, which needs max_tokens)."""
    if not isinstance(body, dict):
        raise RequestError("There was an issue with the format of your request: the body is not a JSON object")
    for name in ("max_tokens", "messages", "model") if create else ("messages", "model"):
        if name not in body:
            raise _fail(name, "Field required")
    if create:
        budget = body["max_tokens"]
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise _fail("max_tokens", "Input should be a valid integer")
        if budget < 0:
            raise _fail("max_tokens", "Input should be greater than or equal to 0")
    if not isinstance(body["model"], str):
        raise _fail("model", "Input should be a valid string")
    _check_tools(body.get("tools"))
    _check_system(body.get("system"))
    _check_messages(body["messages"])
    _check_cache_control(body, "")
    found = count_cache_controls(body)
    if found > MAX_BREAKPOINTS:
        raise RequestError(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                           f"Found {found}.")


def count_cache_controls(body: dict[str, Any]) -> int:
    """Every cache_control marker of the request: tools, system, message blocks (and inside tool results)."""
    def marked(block: Any) -> int:
        if not isinstance(block, dict):
            return 0
        inner = block.get("content") if block.get("type") == "tool_result" else None
        return ("cache_control" in block and block["cache_control"] is not None) + \
            (sum(map(marked, inner)) if isinstance(inner, list) else 0)

    system = body.get("system")
    n = sum(map(marked, body.get("tools") or [])) + (sum(map(marked, system)) if isinstance(system, list) else 0)
    for msg in body.get("messages") or []:
        if isinstance(msg.get("content"), list):
            n += sum(map(marked, msg["content"]))
    return n + (body.get("cache_control") is not None)


# --------------------------------------------------------------------------- rendering

def _bare(obj: dict[str, Any]) -> dict[str, Any]:
    """A tool or block without its cache_control: a marker is not prompt text."""
    return {k: v for k, v in obj.items() if k != "cache_control"}


def _inner_text(block: Any) -> str:
    if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
        return block["text"]
    if isinstance(block, dict) and block.get("type") == "image":
        return "[image]"
    return json.dumps(_bare(block) if isinstance(block, dict) else block, sort_keys=True)


def render_block(block: Any) -> str:
    """The text one content block is billed as (see the module docstring)."""
    if isinstance(block, str):
        return block
    kind = block.get("type")
    if kind in ("text", "image"):
        return _inner_text(block)
    if kind == "tool_use":
        return f"<tool_use id={block.get('id')}>{block.get('name')}({json.dumps(block.get('input'))})"
    if kind == "tool_result":
        content = block.get("content")
        text = content if isinstance(content, str) else "\n".join(map(_inner_text, content or []))
        flag = " error" if block.get("is_error") else ""
        return f"<tool_result id={block.get('tool_use_id')}{flag}>{text}"
    if kind == "thinking":
        return f"<thinking>{block.get('thinking')}"
    return json.dumps(_bare(block), sort_keys=True)


@dataclass(frozen=True)
class Breakpoint:
    chunk: int  # index into Prompt.chunks: the prefix ends after this chunk
    ttl: float  # seconds


@dataclass
class Prompt:
    """What one Messages request puts in front of the model, block by block."""

    chunks: list[mp.Chunk]
    breakpoints: list[Breakpoint] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(len(c) for c in self.chunks)

    def ends(self) -> list[int]:
        """Token position after each chunk."""
        out, pos = [], 0
        for c in self.chunks:
            pos += len(c)
            out.append(pos)
        return out


def _ttl(block: dict[str, Any]) -> float | None:
    cc = block.get("cache_control")
    return TTL_SECONDS[cc.get("ttl", "5m")] if isinstance(cc, dict) else None


def _block_ttl(block: Any) -> float | None:
    """A block's breakpoint TTL: its own marker, or the longest inside a tool_result's content."""
    if not isinstance(block, dict):
        return None
    ttls = [_ttl(block)]
    if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        ttls += [_ttl(b) for b in block["content"] if isinstance(b, dict)]
    return max((t for t in ttls if t is not None), default=None)


def render(body: dict[str, Any]) -> Prompt:
    """Chunks and breakpoints of a (valid) Messages body."""
    texts: list[str] = []
    marks: dict[int, float] = {}

    def add(text: str, ttl: float | None) -> None:
        if ttl is not None:
            marks[len(texts)] = max(ttl, marks.get(len(texts), 0.0))
        texts.append(text)

    for tool in body.get("tools") or []:
        add(f"<|tool|>{json.dumps(_bare(tool))}\n", _ttl(tool))
    system = body.get("system")
    if isinstance(system, str) and system:
        add(f"<|system|>\n{system}\n", None)
    elif isinstance(system, list):
        for k, block in enumerate(system):
            add(("<|system|>\n" if k == 0 else "") + f"{block['text']}\n", _ttl(block))
    for turn in turns(body.get("messages") or []):
        header = f"<|{turn.role}|>\n"
        if not turn.blocks:  # an empty final assistant message: the turn is opened, nothing in it
            add(header, None)
        for n, (_, _, block) in enumerate(turn.blocks):
            add((header if n == 0 else "") + render_block(block) + "\n", _block_ttl(block))
    top = body.get("cache_control")
    if isinstance(top, dict) and texts:  # automatic caching: a breakpoint on the last block
        last = len(texts) - 1
        marks[last] = max(TTL_SECONDS[top.get("ttl", "5m")], marks.get(last, 0.0))
    return Prompt([mp.tokens(t) for t in texts], [Breakpoint(i, ttl) for i, ttl in sorted(marks.items())])


def prompt_chunks(body: dict[str, Any]) -> list[mp.Chunk]:
    """The token chunks of a Messages `body`, one per tool, system block and content block."""
    return render(body).chunks


def prompt_token_ids(body: dict[str, Any]) -> list[int]:
    """The flat prompt the mock bills for a Messages `body`."""
    return [t for chunk in prompt_chunks(body) for t in chunk]


def prompt_tokens(body: dict[str, Any]) -> int:
    """What the mock bills a Messages `body` as input in all (input + cache read + cache creation)."""
    return render(body).tokens


def wants_thinking(body: dict[str, Any]) -> bool:
    """A thinking block comes first when the request enables extended (or adaptive) thinking."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


# --------------------------------------------------------------------------- prompt caching

def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix a breakpoint caches: 1024 tokens, 2048 for Haiku models."""
    return MIN_CACHEABLE_HAIKU if "haiku" in model.lower() else MIN_CACHEABLE


@dataclass(frozen=True)
class CacheUse:
    """What one request read from and wrote to the cache, in tokens."""

    read: int = 0
    written_5m: int = 0
    written_1h: int = 0

    @property
    def written(self) -> int:
        return self.written_5m + self.written_1h


class BreakpointCache:
    """Anthropic's prompt cache: prefixes written at breakpoints, found at or up to LOOKBACK blocks before one.

    An entry is a (scope, prefix hash) with the time it expires and its TTL;
    the prefix hash is a running hash of the prefix's chunks.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[Scope, int], tuple[float, float]] = {}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def _warm(self, key: tuple[Scope, int], now: float) -> bool:
        entry = self._entries.get(key)
        return entry is not None and now <= entry[0]

    def use(self, scope: Scope, prompt: Prompt, now: float, min_tokens: int = MIN_CACHEABLE) -> CacheUse:
        """Read the longest warm prefix this prompt can find, then write its breakpoints; what it billed."""
        hashes, h = [], 0
        for chunk in prompt.chunks:
            h = hash((h, chunk))
            hashes.append(h)
        ends = prompt.ends()
        marks = [b for b in prompt.breakpoints if ends[b.chunk] >= min_tokens]
        with self._lock:
            hit = -1
            for b in marks:
                for j in range(b.chunk, max(-1, b.chunk - LOOKBACK - 1), -1):
                    if ends[j] < min_tokens:
                        break
                    if self._warm((scope, hashes[j]), now):
                        hit = max(hit, j)
                        break
            read = ends[hit] if hit >= 0 else 0
            if hit >= 0:  # a read refreshes the entry
                ttl = self._entries[(scope, hashes[hit])][1]
                self._entries[(scope, hashes[hit])] = (now + ttl, ttl)
            written = {300.0: 0, 3600.0: 0}
            done = read
            for b in marks:
                end = ends[b.chunk]
                if end > done:
                    written[b.ttl] += end - done
                    done = end
                old = self._entries.get((scope, hashes[b.chunk]), (0.0, 0.0))
                self._entries[(scope, hashes[b.chunk])] = (max(old[0], now + b.ttl), max(old[1], b.ttl))
        return CacheUse(read, written[300.0], written[3600.0])
