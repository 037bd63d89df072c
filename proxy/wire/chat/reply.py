"""Which Chat Completions replies the read-back loop may act on.

A provider, or a gateway in front of it, can answer anything: a `message` that
is a string, `tool_calls` an object, an `index` that is a list, an HTML error
page. The loop (proxy/rewrite/context_read/loop.py) looks into a reply only
when every part it touches has the documented type; anything else raises
`IllFormed` (proxy/wire/read_shape.py says what the loop then does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.wire.read_shape import IllFormed


def _text(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _index(v: Any) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _call(call: Any, where: str) -> None:
    """A tool call (whole, or one streamed fragment): the fields the loop reads have their types."""
    if not isinstance(call, dict):
        raise IllFormed(f"{where} is not an object")
    fn = call.get("function")
    if fn is not None and not isinstance(fn, dict):
        raise IllFormed(f"{where}.function is not an object")
    if not (_text(call.get("id")) and _text((fn or {}).get("name")) and _text((fn or {}).get("arguments"))):
        raise IllFormed(f"{where} has an id, name or arguments that is not a string")


def _calls(part: dict[str, Any], name: str, where: str) -> list[Any]:
    """`part["tool_calls"]` ([] when absent), each call checked; `where` names them in the error."""
    calls = part.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise IllFormed(f"{name}.tool_calls is not a list")
    for i, call in enumerate(calls):
        _call(call, f"{where}[{i}]")
    return calls


def _choice(choices: Any, field: str) -> dict[str, Any]:
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise IllFormed("choices is not a list of one object")
    part = choices[0].get(field)
    if part is None and field == "delta":
        return {}
    if not isinstance(part, dict):
        raise IllFormed(f"choices[0].{field} is not an object")
    return part


@dataclass
class Completion:
    """A non-streamed reply the loop may edit in place: `data` holds `choice`, which holds `message`."""

    data: dict[str, Any]
    choice: dict[str, Any]
    message: dict[str, Any]
    calls: list[dict[str, Any]]


def completion(content: bytes) -> Completion:
    """The parts of a non-streamed `chat.completion` body; IllFormed unless each has its documented type."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        raise IllFormed("the body is not JSON") from None
    if not isinstance(data, dict):
        raise IllFormed("the body is not a JSON object")
    message = _choice(data.get("choices"), "message")
    return Completion(data, data["choices"][0], message, _calls(message, "message", "tool_calls"))


@dataclass
class Delta:
    """One streamed `chat.completion.chunk` of a single choice (or the choiceless usage chunk)."""

    choice: dict[str, Any]  # {} for the usage chunk
    delta: dict[str, Any]
    calls: list[dict[str, Any]]


def delta(chunk: Any) -> Delta | None:
    """A chunk's choice, delta and tool-call fragments; None when it is not a chat chunk at all.

    Not a chat chunk: an event without JSON, [DONE], or JSON without `choices`.
    IllFormed: `choices` is there but any part the loop reads has the wrong type.
    """
    if not isinstance(chunk, dict) or "choices" not in chunk:
        return None
    if chunk["choices"] == []:
        return Delta({}, {}, [])
    part = _choice(chunk["choices"], "delta")
    calls = _calls(part, "delta", "delta.tool_calls")
    for i, call in enumerate(calls):
        if not _index(call.get("index")):
            raise IllFormed(f"delta.tool_calls[{i}].index is not an integer")
    return Delta(chunk["choices"][0], part, calls)
