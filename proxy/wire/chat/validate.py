"""What a Chat Completions request body must be before the proxy touches it.

Anything malformed is a 400 naming the first fault, never a 500; and orjson must
be able to write back what it read (depth), or the body is refused up front.
Per-message checks run once a message is new to its session (see check_messages).
"""

from __future__ import annotations

import operator
from itertools import chain, compress, repeat
from typing import Any

from proxy.errors import BadRequest
from proxy.wire.body import check_writable, loads_checked, too_deep_error

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def parse_body(raw: bytes) -> dict[str, Any]:
    """Parse and check a chat-completions body, all but its messages' items."""
    value, too_deep = loads_checked(raw)  # orjson; integers beyond 64 bits kept exact
    if too_deep:
        raise too_deep_error()
    body: dict[str, Any] = value
    try:
        check_chat_body(body, messages_too=False)
        check_writable({k: v for k, v in body.items() if k != "messages"})
    except BadRequest:
        check_chat_body(body)  # a bad message comes first, as it always has
        raise
    return body


def check_messages(body: dict[str, Any], start: int = 0) -> None:
    """The messages from `start` on are well-formed and orjson can write them back.

    Run once the session is known: messages its memo knows were checked
    when they were new (both checks are about a message's value, and an
    equal message passes them equally), so only the new ones are looked at.
    """
    new = body["messages"][start:]
    if not new:  # the memo knows every message (a repeated turn): nothing to check, and the checks' fixed cost
        return  # (a dozen C-level passes, ~10 µs) is most of a small request's parsing
    if not _messages_valid(new):
        check_chat_body(body)  # raises, naming the first bad message
    check_writable({"messages": new})


_TYPES_CONTENT = frozenset({type(None), str, list})
_TYPES_PART = frozenset({dict, str})
_TYPES_OPTIONAL_STR = frozenset({type(None), str})
_TYPES_OPTIONAL_LIST = frozenset({type(None), list})
_TYPES_OPTIONAL_DICT = frozenset({type(None), dict})


def _types(values: Any) -> set[type]:
    return set(map(type, values))


def _of_type(values: list[Any], kind: type) -> list[Any]:
    return list(compress(values, map(operator.is_, map(type, values), repeat(kind))))


_PLAIN_KEYS = frozenset({"role", "content", "name"})  # a message with no other key has no calls, no parts
PLAIN_MAX = 16  # messages a short list is checked in one Python loop for (`_plain`); a longer one by C-level maps


def _plain(messages: list[Any]) -> bool:
    """True only if every message is `{role, content: str or null[, name]}` with a known role: then every check
    of `_messages_valid` passes. The common turn's new messages, decided in one short loop: the maps' fixed cost
    (a dozen passes, whatever the length) is several times that for a few messages."""
    for m in messages:
        if type(m) is not dict or not m.keys() <= _PLAIN_KEYS:
            return False
        role, content = m.get("role"), m.get("content")
        if type(role) is not str or role not in _ROLES or (content is not None and type(content) is not str):
            return False
    return True


def _messages_valid(messages: list[Any]) -> bool:
    """True only if the per-message checks of check_chat_body all pass, decided with C-level maps.

    Validation is a pure function of each message, and walking 1,000 messages
    in Python costs more than the rest of a request; on False the ordinary
    loop runs and reports the first problem exactly as before.
    """
    if len(messages) <= PLAIN_MAX and _plain(messages):
        return True
    if _types(messages) - {dict}:
        return False
    get = dict.get
    try:
        if not set(map(get, messages, repeat("role"))) <= _ROLES:
            return False
    except TypeError:  # an unhashable role
        return False
    contents = list(map(get, messages, repeat("content")))
    if _types(contents) - _TYPES_CONTENT:
        return False
    parts = list(chain.from_iterable(_of_type(contents, list)))
    if _types(parts) - _TYPES_PART:
        return False
    if _types(map(get, _of_type(parts, dict), repeat("type"))) - _TYPES_OPTIONAL_STR:
        return False
    if _types(map(get, messages, repeat("tool_call_id"))) - _TYPES_OPTIONAL_STR:
        return False
    calls: list[Any] = list(map(get, messages, repeat("tool_calls")))
    if _types(calls) - _TYPES_OPTIONAL_LIST:
        return False
    calls = list(chain.from_iterable(_of_type(calls, list)))
    if _types(calls) - {dict}:
        return False
    if _types(map(get, calls, repeat("id"))) - _TYPES_OPTIONAL_STR:
        return False
    fns = list(map(get, calls, repeat("function")))
    if _types(fns) - _TYPES_OPTIONAL_DICT:
        return False
    fns = _of_type(fns, dict)
    return not (_types(map(get, fns, repeat("name"), repeat(""))) - {str}
                or _types(map(get, fns, repeat("arguments"), repeat(""))) - {str})


def check_chat_body(body: Any, messages_too: bool = True) -> None:
    """A 400 naming the first thing wrong with a chat body (`messages_too=False`: all but the messages' items)."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be an array", param="tools")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest("'messages' is required and must be an array", param="messages")
    for i, m in enumerate(messages if messages_too and not _messages_valid(messages) else ()):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        role = m.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise BadRequest(f"{where}.role must be one of {', '.join(sorted(_ROLES))}", param=f"{where}.role")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"{where}.content must be a string, an array of parts or null",
                             param=f"{where}.content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, (dict, str)):
                    raise BadRequest(f"{where}.content[{j}] must be an object", param=f"{where}.content[{j}]")
                if isinstance(part, dict) and part.get("type") is not None and not isinstance(part["type"], str):
                    raise BadRequest(f"{where}.content[{j}].type must be a string", param=f"{where}.content[{j}].type")
        if m.get("tool_call_id") is not None and not isinstance(m["tool_call_id"], str):
            raise BadRequest(f"{where}.tool_call_id must be a string", param=f"{where}.tool_call_id")
        calls = m.get("tool_calls")
        if calls is not None and not isinstance(calls, list):
            raise BadRequest(f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
        for j, call in enumerate(calls or ()):
            _check_call(call, f"{where}.tool_calls[{j}]")
    for i, tool in enumerate(tools or ()):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise BadRequest(f"{where} must be an object", param=where)
        fn = tool.get("function")
        if "function" in tool and not (isinstance(fn, dict) and isinstance(fn.get("name", ""), str)):
            raise BadRequest(f"{where}.function must be an object with a string name", param=f"{where}.function")
        if not isinstance(tool.get("name", ""), str):
            raise BadRequest(f"{where}.name must be a string", param=f"{where}.name")


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise BadRequest(f"{where} must be an object", param=where)
    if call.get("id") is not None and not isinstance(call["id"], str):
        raise BadRequest(f"{where}.id must be a string", param=f"{where}.id")
    fn = call.get("function")
    if fn is None:
        return
    if not isinstance(fn, dict) or not isinstance(fn.get("name", ""), str) \
            or not isinstance(fn.get("arguments", ""), str):
        raise BadRequest(f"{where}.function must be an object with string name and arguments",
                         param=f"{where}.function")
