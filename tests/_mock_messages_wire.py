"""Wire shapes of Anthropic's Messages API for the mock upstream (tests/mock_upstream.py).

Field by field what ``POST /v1/messages`` answers: the ``message`` object and
its content blocks, its usage, the SSE event sequence of a stream, and the
error envelope. Checked against the anthropic SDK's types (anthropic/types/:
Message, Usage, RawMessageStreamEvent, shared.ErrorResponse): the tests
validate every object and event with them. What a prompt costs and caches is
in tests/_mock_messages_prompt.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

try:  # imported as tests._mock_messages_wire (benchmarks) or from the pytest rootdir
    from . import _mock_prompt as mp
    from . import _mock_stream as ms
except ImportError:
    import _mock_prompt as mp  # type: ignore[no-redef]
    import _mock_stream as ms  # type: ignore[no-redef]

# The HTTP status of each error type, as Anthropic's errors page lists them.
ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
                "api_error": 500, "overloaded_error": 529}
DEFAULT_THINKING = "Let me think about what is being asked."
PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # the API writes this one with a space after the colon


def error_body(type_: str, message: str, request_id: str = "req_mock0") -> dict[str, Any]:
    """Anthropic's error envelope: `{"type": "error", "error": {type, message}, "request_id"}`."""
    return {"type": "error", "error": {"type": type_, "message": message}, "request_id": request_id}


def fake_signature(label: str) -> str:
    """A deterministic opaque thinking signature (base64, shaped like the API's)."""
    digest = b"".join(hashlib.sha256(f"{label}:{i}".encode()).digest() for i in range(3))
    return "Eo" + base64.b64encode(digest).decode()


def content_blocks(tag: str, reply: ms.Reply, thinking: bool) -> list[dict[str, Any]]:
    """The content of `reply`: [thinking], a text block (unless only tool calls), a tool_use per call."""
    out: list[dict[str, Any]] = []
    if thinking:
        text = reply.thinking if reply.thinking is not None else DEFAULT_THINKING
        out.append({"type": "thinking", "thinking": text, "signature": fake_signature(f"{tag}:{text}")})
    if reply.text or not reply.tool_calls:
        out.append({"type": "text", "text": reply.text or ""})
    for call in reply.tool_calls:
        args = json.loads(call.arguments) if call.arguments.strip() else {}
        if not isinstance(args, dict):
            raise ValueError(f"a tool_use input must be a JSON object, the script gave {call.arguments!r}")
        out.append({"type": "tool_use", "id": call.id, "name": call.name, "input": args})
    return out


def stop_reason(content: list[dict[str, Any]]) -> str:
    return "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"


def output_tokens(content: list[dict[str, Any]]) -> int:
    """What the reply is billed as: its texts, thinking, and each call's name and input; never 0 (as the API)."""
    n = 0
    for b in content:
        if b["type"] == "text":
            n += len(mp.tokens(b["text"]))
        elif b["type"] == "thinking":
            n += len(mp.tokens(b["thinking"]))
        elif b["type"] == "tool_use":
            n += len(mp.tokens(b["name"] + json.dumps(b["input"])))
    return max(n, 1)


def usage(input_tokens: int, read: int, written_5m: int, written_1h: int, output: int) -> dict[str, Any]:
    """A Messages usage object; `input_tokens` excludes what was read from or written to the cache."""
    return {"input_tokens": input_tokens, "cache_creation_input_tokens": written_5m + written_1h,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": written_5m, "ephemeral_1h_input_tokens": written_1h},
            "output_tokens": output, "service_tier": "standard", "inference_geo": "not_available"}


def message_object(*, id_: str, model: str, content: list[dict[str, Any]], stop: str,
                   usage: dict[str, Any]) -> dict[str, Any]:
    """A complete `message`, keys in the order the API sends them."""
    return {"model": model, "id": id_, "type": "message", "role": "assistant", "content": content,
            "stop_reason": stop, "stop_sequence": None, "stop_details": None, "usage": usage}


def _started(block: dict[str, Any]) -> dict[str, Any]:
    """A block as content_block_start announces it: empty."""
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block["type"] == "tool_use":
        return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
    return block


def _deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block["type"] == "text":
        return [{"type": "text_delta", "text": w} for w in ms.split_words(block["text"])]
    if block["type"] == "thinking":
        return [{"type": "thinking_delta", "thinking": w} for w in ms.split_words(block["thinking"])] + \
            [{"type": "signature_delta", "signature": block["signature"]}]
    if block["type"] == "tool_use":  # the API's first piece is empty, the JSON follows in fragments
        return [{"type": "input_json_delta", "partial_json": frag}
                for frag in ["", *ms.split_fragments(json.dumps(block["input"]), 12)]]
    return []


def stream_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The events the API streams for the completed `message`.

    message_start (the message with no content, stop_reason null and the
    input and cache figures, output_tokens 1); a ping after the first
    content_block_start (where the API sends it; right after message_start
    when there is no content); per block content_block_start (the block
    empty), its deltas (text_delta per word; thinking_delta per word then one
    signature_delta; input_json_delta: an empty piece, then the input's JSON
    in fragments), content_block_stop; message_delta (stop_reason, and usage
    with the final output_tokens and, as the API now reports them, the
    cumulative input and cache figures); message_stop.
    """
    u = message["usage"]
    start = dict(message, content=[], stop_reason=None, stop_sequence=None, stop_details=None,
                 usage=dict(u, output_tokens=1))
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for i, block in enumerate(message["content"]):
        events.append({"type": "content_block_start", "index": i, "content_block": _started(block)})
        if i == 0:
            events.append({"type": "ping"})
        events += [{"type": "content_block_delta", "index": i, "delta": d} for d in _deltas(block)]
        events.append({"type": "content_block_stop", "index": i})
    if not message["content"]:
        events.append({"type": "ping"})
    events.append({"type": "message_delta",
                   "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None, "stop_details": None},
                   "usage": {k: u[k] for k in ("input_tokens", "cache_creation_input_tokens",
                                               "cache_read_input_tokens", "output_tokens")}})
    events.append({"type": "message_stop"})
    return events


def sse_events(events: list[dict[str, Any]]) -> list[bytes]:
    """Messages SSE framing: `event: <type>\\ndata: <json>\\n\\n` per event, no terminator."""
    return [PING if e["type"] == "ping" else f"event: {e['type']}\n".encode() + b"data: " + ms.dumps(e) + b"\n\n"
            for e in events]
