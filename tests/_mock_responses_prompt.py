"""The mock provider's prompt rules for a Responses API request (``POST /v1/responses``).

Like tests/_mock_prompt.py (whose tokenizer, content rules and prefix cache
this reuses, so that chat and Responses bill the same way) it imports
nothing from ``proxy``.

What the model sees is the conversation: the stored history of the
``previous_response_id`` chain (its inputs and outputs, oldest first), then
this request's ``input`` (a string is one user message). Neither
``instructions`` nor ``tools`` are carried over from a previous response,
as OpenAI documents; each request sends its own.

The rendering is a list of chunks, each tokenized on its own so that the
prefix cache matches item by item as it matches chat messages:

* ``instructions``, if any: a system message;
* the tool list, if any: ``"<|tools|>" + json.dumps(tools)`` as in chat;
* one chunk per item:

  - a message (``type`` "message" or no type): ``render_message`` of its
    role and content, so ``input_text``/``output_text`` parts are their text
    and images are ``[image]``; ids and statuses are not prompt text, so an
    output item sent back as input renders as it did when stored;
  - ``function_call``: an assistant message holding that one tool call
    (``\\n<tool_call id={call_id}>{name}({arguments})``), as chat renders it;
  - ``function_call_output`` / ``custom_tool_call_output``: a tool message
    answering ``call_id``, its output a string or parts;
  - ``custom_tool_call``: ``<|assistant|>\\n\\n<custom_tool_call id={call_id}>{name}\\n{input}<|end|>\\n``;
  - ``reasoning``: ``<|reasoning|>\\n`` + summary texts (then reasoning
    texts) joined by ``\\n``, + the reasoning the provider decrypts from
    ``encrypted_content``: billed as what it was, not as the ciphertext's text;
    the mock stands in for it with one " reasoning" token per 16/3 characters
    of ciphertext (base64 of about as many bytes as the plaintext, ~4 bytes a token);
  - ``compaction``: ``<|compaction|>\\n{encrypted_content}<|end|>\\n``;
  - any other type: ``<|{type}|>\\n{JSON with sorted keys}<|end|>\\n``.

A request is refused, as OpenAI refuses it, when ``previous_response_id``
names no stored response of the same API key, when a tool output answers
a ``call_id`` that no function or custom tool call of the conversation has,
or when a ``compaction_trigger`` item is not the last input item (the SDK's
type: "Compacts the current context. Must be the final input item"). A
request ending in one is answered with one ``compaction`` item and nothing
else (what Codex's remote compaction v2 requires of the answer).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

try:  # imported as tests._mock_responses_prompt (benchmarks) or from the pytest rootdir
    from . import _mock_prompt as mp
except ImportError:
    import _mock_prompt as mp  # type: ignore[no-redef]

OUTPUT_TYPES = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
COMPACTION_TRIGGER = "compaction_trigger"


class RequestError(Exception):
    """A 400 (or 404) the provider answers instead of running the model; the fields of its error body."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status


# --------------------------------------------------------------------------- rendering

def input_items(inp: Any) -> list[Any]:
    """A request's `input` as a list of items: a string is one user message, absent is none."""
    if inp is None:
        return []
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if isinstance(inp, list):
        return list(inp)
    raise RequestError(f"Invalid type for 'input': expected one of a string or array of input items, "
                       f"but got {type(inp).__name__} instead.", param="input", code="invalid_type")


def _texts(parts: Any) -> list[str]:
    return [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)] \
        if isinstance(parts, list) else []


def render_item(item: Any) -> str:
    """The text one input or output item is billed as (see the module docstring)."""
    if not isinstance(item, dict):
        return mp.render_message(item)
    kind = item.get("type")
    if kind in (None, "message"):
        return mp.render_message({"role": item.get("role", ""), "content": item.get("content")})
    if kind == "function_call":
        call = {"id": item.get("call_id"), "function": {"name": item.get("name"),
                                                         "arguments": item.get("arguments")}}
        return mp.render_message({"role": "assistant", "content": None, "tool_calls": [call]})
    if kind in OUTPUT_TYPES:
        return mp.render_message({"role": "tool", "content": item.get("output"),
                                  "tool_call_id": item.get("call_id")})
    if kind == "custom_tool_call":
        return (f"<|assistant|>\n\n<custom_tool_call id={item.get('call_id')}>{item.get('name')}\n"
                f"{item.get('input', '')}<|end|>\n")
    if kind == "reasoning":
        text = "\n".join(_texts(item.get("summary")) + _texts(item.get("content")))
        blob = item.get("encrypted_content")
        secret = "\n<encrypted>" + " reasoning" * (len(blob) * 3 // 16) if isinstance(blob, str) and blob else ""
        return f"<|reasoning|>\n{text}{secret}<|end|>\n"
    if kind == "compaction":
        return f"<|compaction|>\n{item.get('encrypted_content', '')}<|end|>\n"
    return f"<|{kind}|>\n{json.dumps(item, sort_keys=True)}<|end|>\n"


@dataclass
class Prompt:
    """What one Responses request puts in front of the model."""

    items: list[Any]  # the conversation: the stored chain's items, then this request's input
    chunks: list[mp.Chunk]
    marks: list[int] = field(default_factory=list)  # chunks carrying a cache marker

    @property
    def tokens(self) -> int:
        return sum(len(c) for c in self.chunks)


def render(body: dict[str, Any], history: list[Any] | None = None) -> Prompt:
    """Chunks of `body` after `history` (the previous response's conversation); checks tool outputs."""
    items = list(history or []) + input_items(body.get("input"))
    orphan_outputs(items)
    trigger_last(input_items(body.get("input")))
    chunks: list[mp.Chunk] = []
    marks: list[int] = []
    instructions = body.get("instructions")
    if instructions:
        chunks.append(mp.tokens(mp.render_message({"role": "system", "content": instructions})))
    if body.get("tools"):
        if any(mp.marked(t) for t in body["tools"]):
            marks.append(len(chunks))
        chunks.append(mp.tokens("<|tools|>" + json.dumps(body["tools"])))
    for item in items:
        if mp.marked(item):
            marks.append(len(chunks))
        chunks.append(mp.tokens(render_item(item)))
    return Prompt(items, chunks, marks)


def prompt_chunks(body: dict[str, Any], history: list[Any] | None = None) -> list[mp.Chunk]:
    """The token chunks of a Responses `body` after `history`, as the prefix cache sees them."""
    return render(body, history).chunks


def prompt_token_ids(body: dict[str, Any], history: list[Any] | None = None) -> list[int]:
    """The flat prompt the mock bills for a Responses `body` (tests recompute cache hits from it)."""
    return [t for chunk in prompt_chunks(body, history) for t in chunk]


def orphan_outputs(items: list[Any]) -> None:
    """Raise OpenAI's 400 for a tool output whose call_id no call in the conversation has."""
    calls = {(item.get("type"), item.get("call_id")) for item in items if isinstance(item, dict)}
    for item in items:
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in OUTPUT_TYPES and (OUTPUT_TYPES[kind], item.get("call_id")) not in calls:
            what = "function call" if kind == "function_call_output" else "custom tool call"
            raise RequestError(f"No tool call found for {what} output with call_id {item.get('call_id')}.",
                               param="input")


def trigger_last(inp: list[Any]) -> None:
    """Raise OpenAI's 400 for a compaction_trigger that is not the request's last input item."""
    for item in inp[:-1]:
        if isinstance(item, dict) and item.get("type") == COMPACTION_TRIGGER:
            raise RequestError("The 'compaction_trigger' item must be the final input item.", param="input")


def compacts(body: dict[str, Any]) -> bool:
    """The request ends with a compaction_trigger: the provider answers with a compaction of the context."""
    inp = input_items(body.get("input"))
    return bool(inp) and isinstance(inp[-1], dict) and inp[-1].get("type") == COMPACTION_TRIGGER


# --------------------------------------------------------------------------- stored responses

@dataclass
class Stored:
    """A response kept for `previous_response_id` and `GET /v1/responses/{id}`."""

    items: list[Any]  # its whole conversation: history, input, then output
    response: dict[str, Any]


class ResponseStore:
    """Responses kept in memory per API key, as OpenAI keeps them per organization (`store` defaults to true)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], Stored] = {}

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()

    def put(self, auth: str, items: list[Any], response: dict[str, Any]) -> None:
        with self._lock:
            self._kept[(auth, response["id"])] = Stored(items, response)

    def get(self, auth: str, response_id: str) -> Stored | None:
        with self._lock:
            return self._kept.get((auth, response_id))

    def history(self, auth: str, body: dict[str, Any]) -> list[Any]:
        """The conversation `previous_response_id` continues (none without one); 400 for an unknown id."""
        prev = body.get("previous_response_id")
        if prev is None:
            return []
        stored = self.get(auth, str(prev))
        if stored is None:
            raise RequestError(f"Previous response with id '{prev}' not found.",
                               param="previous_response_id", code="previous_response_not_found")
        return stored.items
