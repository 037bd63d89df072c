"""Wire shapes of OpenAI's Responses API for the mock upstream (tests/mock_upstream.py).

Field by field what ``POST /v1/responses`` answers: output items, the
``response`` object with the request's settings echoed, its usage, the SSE
event sequence of a stream, and the answer of ``/v1/responses/compact``.
Checked against the openai SDK's types (openai/types/responses/): the tests
validate every object and event strictly with them, so a missing or
misnamed field fails there rather than in a proxy test.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from typing import Any

try:  # imported as tests._mock_responses_wire (benchmarks) or from the pytest rootdir
    from . import _mock_stream as ms
except ImportError:
    import _mock_stream as ms  # type: ignore[no-redef]

TEXT_CONFIG = {"format": {"type": "text"}, "verbosity": "medium"}


def fake_ciphertext(label: str, size: int = 48) -> str:
    """Deterministic opaque bytes shaped like OpenAI's encrypted_content (Fernet-like base64)."""
    digest = b"".join(hashlib.sha256(f"{label}:{i}".encode()).digest() for i in range(size // 32 + 1))
    return "gAAAAA" + base64.urlsafe_b64encode(digest[:size]).decode()


def wants_reasoning(body: dict[str, Any]) -> bool:
    """A reasoning item comes first when the request sets `reasoning` (and not effort "none")."""
    r = body.get("reasoning")
    return isinstance(r, dict) and bool(r) and r.get("effort") != "none"


def output_items(tag: str, reply: ms.Reply, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The completed output of `reply`: [reasoning], a message if it has text or no calls, a function_call each."""
    out: list[dict[str, Any]] = []
    if wants_reasoning(body):
        item: dict[str, Any] = {"id": f"rs_{tag}", "type": "reasoning", "summary": []}
        if "reasoning.encrypted_content" in (body.get("include") or []):
            item["encrypted_content"] = fake_ciphertext(f"rs_{tag}")
        out.append(item)
    if reply.text is not None or not reply.tool_calls:
        out.append({"id": f"msg_{tag}", "type": "message", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "annotations": [], "logprobs": [],
                                 "text": reply.text or ""}]})
    for i, call in enumerate(reply.tool_calls):
        out.append({"id": f"fc_{tag}_{i}", "type": "function_call", "status": "completed",
                    "arguments": call.arguments, "call_id": call.id, "name": call.name})
    return out


def usage(input_tokens: int, cached: int, cache_write: int, output_tokens: int) -> dict[str, Any]:
    """Responses usage; `cache_write_tokens` is in the SDK's InputTokensDetails as a required field."""
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": cache_write},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def response_object(*, id_: str, created: int, body: dict[str, Any], output: list[dict[str, Any]],
                    usage: dict[str, Any] | None) -> dict[str, Any]:
    """A completed `response`, echoing the request's settings with OpenAI's defaults."""
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    return {
        "id": id_, "object": "response", "created_at": created, "status": "completed",
        "background": False, "completed_at": created + 1, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "model": str(body.get("model")), "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"), "service_tier": "default",
        "store": body.get("store", True) is not False, "temperature": body.get("temperature", 1.0),
        "text": {**TEXT_CONFIG, **text}, "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation", "disabled"),
        "usage": usage, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def stream_events(resp: dict[str, Any]) -> list[dict[str, Any]]:
    """The events OpenAI streams for the completed `resp`, `sequence_number` counting from 0.

    response.created and response.in_progress (status in_progress, no output,
    no usage), then per output item: output_item.added (in progress, empty),
    for a message content_part.added, output_text.delta per word,
    output_text.done and content_part.done, for a function call
    function_call_arguments.delta per fragment and .done, for a compaction
    one response.compaction.compacting (its ciphertext empty until done); output_item.done
    (the finished item); and last response.completed with the whole response.
    """
    seq = itertools.count()

    def ev(type_: str, **fields: Any) -> dict[str, Any]:
        return {"type": type_, "sequence_number": next(seq), **fields}

    pending = dict(resp, status="in_progress", completed_at=None, output=[], usage=None)
    events = [ev("response.created", response=pending), ev("response.in_progress", response=pending)]
    for i, item in enumerate(resp["output"]):
        where = {"item_id": item["id"], "output_index": i}
        if item["type"] == "message":
            events.append(ev("response.output_item.added", output_index=i,
                             item=dict(item, status="in_progress", content=[])))
            for c, part in enumerate(item["content"]):
                events.append(ev("response.content_part.added", **where, content_index=c,
                                 part=dict(part, text="")))
                events += [ev("response.output_text.delta", **where, content_index=c, delta=w, logprobs=[])
                           for w in ms.split_words(part["text"])]
                events.append(ev("response.output_text.done", **where, content_index=c,
                                 text=part["text"], logprobs=[]))
                events.append(ev("response.content_part.done", **where, content_index=c, part=part))
        elif item["type"] == "function_call":
            events.append(ev("response.output_item.added", output_index=i,
                             item=dict(item, status="in_progress", arguments="")))
            events += [ev("response.function_call_arguments.delta", **where, delta=frag)
                       for frag in ms.split_fragments(item["arguments"]) if frag]
            events.append(ev("response.function_call_arguments.done", **where, arguments=item["arguments"]))
        elif item["type"] == "compaction":  # its ciphertext comes at the end; the SDK's type requires the field
            events.append(ev("response.output_item.added", output_index=i, item=dict(item, encrypted_content="")))
            events.append(ev("response.compaction.compacting", item_id=item["id"], output_index=i))
        else:
            added = {k: v for k, v in item.items() if k != "encrypted_content"}
            events.append(ev("response.output_item.added", output_index=i, item=added))
        events.append(ev("response.output_item.done", output_index=i, item=item))
    events.append(ev("response.completed", response=resp))
    return events


def sse_events(events: list[dict[str, Any]]) -> list[bytes]:
    """Responses SSE framing: a named event per message, no [DONE] terminator."""
    return [f"event: {e['type']}\n".encode() + b"data: " + ms.dumps(e) + b"\n\n" for e in events]


def compacted(*, tag: str, created: int, items: list[Any], usage: dict[str, Any]) -> dict[str, Any]:
    """What `/v1/responses/compact` answers: the user messages kept, then one opaque compaction item.

    Codex (codex-rs/codex-api/src/endpoint/compact.rs) reads only `output`,
    as a list of items, and replays it as the new history.
    """
    users = [_user_message(it) for it in items if isinstance(it, dict)
             and it.get("type") in (None, "message") and it.get("role") == "user"]
    return {"id": f"resp_{tag}", "object": "response.compaction", "created_at": created,
            "output": users + [{"id": f"cmp_{tag}", "type": "compaction",
                                "encrypted_content": compaction_ciphertext(tag)}],
            "usage": usage}


def compaction_item(tag: str) -> dict[str, Any]:
    """The one output item of a request ending in a compaction_trigger: the context, compacted and opaque."""
    return {"id": f"cmp_{tag}", "type": "compaction", "encrypted_content": compaction_ciphertext(tag)}


def compaction_ciphertext(tag: str) -> str:
    """The opaque summary a compaction carries (its size is what a later prompt pays for it)."""
    return fake_ciphertext(f"cmp_{tag}", 96)


def _user_message(item: dict[str, Any]) -> dict[str, Any]:
    """A kept user message in the item form OpenAI returns: typed, its text as input_text parts."""
    content = item.get("content")
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else content
    return {"type": "message", "role": "user", "content": parts}
