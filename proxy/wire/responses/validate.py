"""What a Responses API request body must be before the proxy touches it.

Strict only where the proxy reads: the items a transform may look into (messages,
function and custom tool calls and their outputs) must have the fields it reads,
of the right types. Every other item type, known or from the future, is opaque and
passes as it came; an item must only be an object with a string `type` (or a
`role`: a message may omit its type). An `additional_tools` item's `tools` is
checked as the top-level `tools` is (the proxy may add its read tool there);
`compaction_trigger`, `client_metadata`, `reasoning` and every other field pass
as sent. A `function_call_output` must answer a call
of the same input, unless the provider holds the earlier history
(`previous_response_id`, `conversation`) or the input references earlier items.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.wire.body import check_writable, load_object
from proxy.wire.responses.tools import ADDITIONAL_TOOLS

_MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant"})
_CALLS = frozenset({"function_call", "custom_tool_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_CALL_FIELDS = {"function_call": ("call_id", "name", "arguments"), "custom_tool_call": ("call_id", "name", "input")}


def parse_body(raw: bytes) -> dict[str, Any]:
    """Parse and check a Responses body, all but its input items."""
    body = load_object(raw)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    if "input" in body and not isinstance(body["input"], (str, list)):
        raise BadRequest("'input' must be a string or an array of items", param="input")
    if body.get("tools") is not None:
        _check_tools(body["tools"], "tools")
    check_writable(body)
    return body


def _check_tools(tools: Any, where: str) -> None:
    if not isinstance(tools, list):
        raise BadRequest(f"'{where}' must be an array", param=where)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("type", ""), str):
            raise BadRequest(f"{where}[{i}] must be an object with a string type", param=f"{where}[{i}]")
        if not isinstance(tool.get("name", ""), str):
            raise BadRequest(f"{where}[{i}].name must be a string", param=f"{where}[{i}].name")


def check_items(body: dict[str, Any], items: list[Any], start: int) -> None:
    """Items from `start` on are well-formed; outputs answer calls (looked up over all items)."""
    calls: set[str] | None = None
    for i in range(start, len(items)):
        item, where = items[i], f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        kind = item.get("type")
        if kind is None:
            if "role" not in item:
                raise BadRequest(f"{where} has no 'type'", param=f"{where}.type")
            kind = "message"
        if not isinstance(kind, str):
            raise BadRequest(f"{where}.type must be a string", param=f"{where}.type")
        if kind == "message":
            _check_message(item, where)
        elif kind == ADDITIONAL_TOOLS:
            _check_tools(item.get("tools"), f"{where}.tools")
        elif kind in _CALLS:
            for key in _CALL_FIELDS[kind]:
                if not isinstance(item.get(key), str):
                    raise BadRequest(f"{where}.{key} must be a string", param=f"{where}.{key}")
        elif kind in _OUTPUTS:
            cid = item.get("call_id")
            if not isinstance(cid, str):
                raise BadRequest(f"{where}.call_id must be a string", param=f"{where}.call_id")
            if not isinstance(item.get("output"), (str, list)):
                raise BadRequest(f"{where}.output must be a string or an array", param=f"{where}.output")
            if calls is None:
                calls = _known_calls(body, items)
            if calls is not _ANY and cid not in calls:
                raise BadRequest(f"{where}.call_id {cid!r} answers no tool call of this input",
                                 param=f"{where}.call_id")


_ANY: set[str] = set()  # the provider holds earlier items: any call id may be answered


def _known_calls(body: dict[str, Any], items: list[Any]) -> set[str]:
    if body.get("previous_response_id") or body.get("conversation"):
        return _ANY
    if any(isinstance(it, dict) and it.get("type") == "item_reference" for it in items):  # == needs no hash
        return _ANY
    return {it["call_id"] for it in items if isinstance(it, dict) and isinstance(it.get("type"), str)
            and it["type"] in _CALLS and isinstance(it.get("call_id"), str)}


def _check_message(item: dict[str, Any], where: str) -> None:
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:  # a list or an object cannot be looked up
        raise BadRequest(f"{where}.role must be one of {', '.join(sorted(_MESSAGE_ROLES))}", param=f"{where}.role")
    content = item.get("content")
    if not isinstance(content, (str, list)):
        raise BadRequest(f"{where}.content must be a string or an array of parts", param=f"{where}.content")
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, dict):
            raise BadRequest(f"{where}.content[{j}] must be an object", param=f"{where}.content[{j}]")
        if not isinstance(part.get("type", ""), str):  # the codec looks its type up among the text parts
            raise BadRequest(f"{where}.content[{j}].type must be a string", param=f"{where}.content[{j}].type")
