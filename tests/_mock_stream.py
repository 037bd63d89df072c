"""Wire shapes for the mock OpenAI upstream (tests/mock_upstream.py), kept out of the server.

What OpenAI actually sends, field by field: completions, SSE chunks and
embeddings (the Responses API's shapes are in tests/_mock_responses_wire.py).
What a prompt costs and caches is in tests/_mock_prompt.py.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

SYSTEM_FINGERPRINT = "fp_mock0001"


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
    thinking: str | None = None  # the Messages API's thinking block, when the script gives one

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


async def sse_stream(events: list[bytes], *, first_delay: float, chunk_delay: float,
                     hold: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[bytes]:
    """Yield pre-rendered SSE events one by one so the client sees a real stream.

    `hold`, when given, is awaited before the last event: the stream stays open until it returns.
    """
    if first_delay:
        await asyncio.sleep(first_delay)
    for i, ev in enumerate(events):
        if i and chunk_delay:
            await asyncio.sleep(chunk_delay)
        if hold is not None and i == len(events) - 1:
            await hold()
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
