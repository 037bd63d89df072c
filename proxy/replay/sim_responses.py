"""The simulator's Responses API (``POST /v1/responses``): prompt rendering, the proxy's own calls, and the wire shapes.

The rules, exact so that anyone can recompute the figures (and the same as the
test suite's mock provider, tests/_mock_responses_prompt.py):

* **Prompt tokens.** A request is rendered as token chunks, each tokenized on
  its own with o200k_base like a chat message (proxy/replay/sim_prompt.py):
  ``instructions``, if any, as a system message; the tool list, if any, as
  ``"<|tools|>" + json.dumps(tools)``; then one chunk per ``input`` item (a
  string ``input`` is one user message):

  - a message: ``render_message`` of its role and content (``input_text`` /
    ``output_text`` parts are their text, images ``[image]``);
  - ``function_call``: an assistant message holding that one tool call;
  - ``function_call_output`` / ``custom_tool_call_output``: a tool message
    answering ``call_id``;
  - ``custom_tool_call``: ``<|assistant|>\\n\\n<custom_tool_call id={call_id}>{name}\\n{input}<|end|>\\n``;
  - ``reasoning``: ``<|reasoning|>\\n`` + its summary (then content) texts,
    + the reasoning the provider decrypts from ``encrypted_content``, billed as
    what it was rather than as the ciphertext's text: one " reasoning" token per
    16/3 characters of ciphertext (base64 of about as many bytes as the
    plaintext, ~4 bytes a token);
  - any other item: ``<|{type}|>\\n{JSON with sorted keys}<|end|>\\n``.

  ``usage.input_tokens`` is their total; the prefix cache (``cached_tokens``),
  the window check (with ``max_output_tokens`` as the budget) and the log are
  the chat rules. ``cache_write_tokens``: the billable prefix the prompt adds to
  the cache beyond what it read.
* **Over the window**: HTTP 400 ``context_length_exceeded`` with OpenAI's
  Responses wording (no token counts in it) and ``param: "input"``.
* **Nothing is stored**: a ``previous_response_id`` or ``conversation`` is
  refused as OpenAI refuses an unknown one; the replay sends whole inputs.
* **Answers**: ``"ok"``, or the extractive summary (proxy/replay/sim_answers.py)
  when the request is one of ctxproxy's summarizer calls: in the transcript
  shape (a first system message with the summarizer's prompt), or in the cached
  shape (a last user message opening with the compaction instruction, whose span
  is the input above it after the head).
* **Streams** (``stream: true``): the SSE events OpenAI sends, each ``event:
  {type}`` and ``data: {json}`` with a ``sequence_number``, from
  ``response.created`` to ``response.completed`` (no ``[DONE]``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from proxy.replay.sim_answers import answer_from
from proxy.replay.sim_prompt import ORDINARY_ANSWER, Chunk, billable_cached, render_message, tokens
from proxy.rewrite.compress import summarizer
from proxy.wire.responses.codec import RESPONSES

WINDOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_TEXT_CONFIG = {"format": {"type": "text"}, "verbosity": "medium"}


# --------------------------------------------------------------------------- the prompt

def input_items(body: Mapping[str, Any]) -> list[Any]:
    """A request's `input` as a list of items: a string is one user message, absent is none."""
    inp = body.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    return list(inp) if isinstance(inp, list) else []


def _texts(parts: Any) -> list[str]:
    if not isinstance(parts, list):
        return []
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]


def render_item(item: Any) -> str:
    """The text one input item is billed as (see the module docstring)."""
    if not isinstance(item, dict):
        return render_message(item)
    kind = item.get("type")
    if kind in (None, "message"):
        return render_message({"role": item.get("role", ""), "content": item.get("content")})
    if kind == "function_call":
        call = {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
        return render_message({"role": "assistant", "content": None, "tool_calls": [call]})
    if kind in _OUTPUTS:
        return render_message({"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")})
    if kind == "custom_tool_call":
        return (f"<|assistant|>\n\n<custom_tool_call id={item.get('call_id')}>{item.get('name')}\n"
                f"{item.get('input', '')}<|end|>\n")
    if kind == "reasoning":
        text = "\n".join(_texts(item.get("summary")) + _texts(item.get("content")))
        blob = item.get("encrypted_content")
        secret = "\n<encrypted>" + " reasoning" * (len(blob) * 3 // 16) if isinstance(blob, str) and blob else ""
        return f"<|reasoning|>\n{text}{secret}<|end|>\n"
    return f"<|{kind}|>\n{json.dumps(item, sort_keys=True)}<|end|>\n"


def prompt_chunks(body: Mapping[str, Any]) -> list[Chunk]:
    """Token chunks of a Responses request: instructions, tools, then one per input item."""
    chunks = []
    if body.get("instructions"):
        chunks.append(tokens(render_message({"role": "system", "content": body["instructions"]})))
    if body.get("tools"):
        chunks.append(tokens("<|tools|>" + json.dumps(body["tools"])))
    return chunks + [tokens(render_item(item)) for item in input_items(body)]


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """What the simulator bills as `input_tokens` for a Responses request."""
    return sum(len(c) for c in prompt_chunks(body))


def invalid(body: Any) -> tuple[str, str | None, str] | None:
    """Why the simulator cannot answer `body` (message, param, code), or None."""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return "ctxproxy simulator: expected a JSON object with a string 'model'.", "model", "invalid_request"
    if body.get("input") is not None and not isinstance(body["input"], (str, list)):
        return ("Invalid type for 'input': expected one of a string or array of input items.", "input",
                "invalid_type")
    if body.get("previous_response_id"):
        return (f"Previous response with id '{body['previous_response_id']}' not found. (The ctxproxy simulator "
                "stores no responses.)", "previous_response_id", "previous_response_not_found")
    if body.get("conversation"):
        return "Conversation not found. (The ctxproxy simulator stores no conversations.)", "conversation", \
            "conversation_not_found"
    return None


# --------------------------------------------------------------------------- the proxy's own calls

def _text(item: Any) -> str:
    return (RESPONSES.text(item) or "") if isinstance(item, dict) else ""


def call_kind(body: Mapping[str, Any]) -> str:
    """"summary" / "facts" for ctxproxy's summarizer calls, else "turn"."""
    items = input_items(body)
    first = items[0] if items else None
    system = _text(first) if isinstance(first, dict) and RESPONSES.role(first) == "system" else None
    if system == summarizer.SYSTEM_PROMPT:
        return "summary"
    if system is not None and system.startswith(summarizer.FACT_PROMPT):
        return "facts"
    last = items[-1] if items else None
    text = _text(last) if isinstance(last, dict) and RESPONSES.role(last) == "user" else ""
    if text.startswith(summarizer.COMPACTION_OPEN):
        return "facts" if "\nQuestion: " in text else "summary"
    return "turn"


def answer(kind: str, body: Mapping[str, Any]) -> str:
    """"ok" to an ordinary request; the extractive summary or fact to ctxproxy's own calls."""
    if kind == "turn":
        return ORDINARY_ANSWER
    items = input_items(body)
    last = _text(items[-1]) if len(items) > 1 else ""
    return answer_from(kind, RESPONSES, items, last)


# --------------------------------------------------------------------------- the wire shapes

def usage(input_tokens: int, cached: int, output_tokens: int) -> dict[str, Any]:
    """Responses usage. `cache_write_tokens` (required by the openai SDK's types): the billable prefix this prompt
    adds to the cache beyond what it read from it, since every accepted prompt is remembered."""
    written = max(0, billable_cached(input_tokens) - cached)
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def response_object(n: int, created: int, body: Mapping[str, Any], text: str,
                    usage_: dict[str, Any]) -> dict[str, Any]:
    """A completed `response` with one assistant message, echoing the request's settings as OpenAI does."""
    reasoning = _object(body.get("reasoning"))
    text_cfg = _object(body.get("text"))
    message = {"id": f"msg_sim{n}", "type": "message", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
    return {
        "id": f"resp_sim{n}", "object": "response", "created_at": created, "status": "completed",
        "background": False, "completed_at": created, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions"), "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": body.get("max_tool_calls"), "model": str(body.get("model")), "output": [message],
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "safety_identifier": body.get("safety_identifier"), "service_tier": "default",
        "store": body.get("store", True) is not False, "temperature": body.get("temperature", 1.0),
        "text": {**_TEXT_CONFIG, **text_cfg}, "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [], "top_logprobs": body.get("top_logprobs", 0),
        "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation", "disabled"),
        "usage": usage_, "user": body.get("user"), "metadata": body.get("metadata") or {},
    }


def stream_events(resp: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The events OpenAI streams for a completed one-message `resp`, `sequence_number` counting from 0."""
    seq = 0

    def ev(type_: str, **fields: Any) -> dict[str, Any]:
        nonlocal seq
        seq += 1
        return {"type": type_, "sequence_number": seq - 1, **fields}

    pending = dict(resp, status="in_progress", completed_at=None, output=[], usage=None)
    yield ev("response.created", response=pending)
    yield ev("response.in_progress", response=pending)
    for i, item in enumerate(resp["output"]):
        where = {"item_id": item["id"], "output_index": i}
        yield ev("response.output_item.added", output_index=i, item=dict(item, status="in_progress", content=[]))
        for c, part in enumerate(item["content"]):
            yield ev("response.content_part.added", **where, content_index=c, part=dict(part, text=""))
            for piece in re.findall(r"\s*\S+|\s+$", part["text"]):
                yield ev("response.output_text.delta", **where, content_index=c, delta=piece, logprobs=[])
            yield ev("response.output_text.done", **where, content_index=c, text=part["text"], logprobs=[])
            yield ev("response.content_part.done", **where, content_index=c, part=part)
        yield ev("response.output_item.done", output_index=i, item=item)
    yield ev("response.completed", response=resp)


def sse(event: dict[str, Any]) -> bytes:
    """Responses SSE framing: a named event per message."""
    return f"event: {event['type']}\ndata: ".encode() + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"
