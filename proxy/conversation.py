"""A chat request in transit: the client's raw bytes, the parsed body, and what was done to it.

Byte preservation is the default: until a transform marks the conversation
changed, `to_bytes()` returns exactly the bytes the client sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.config import Route
from proxy.errors import BadRequest
from proxy.jsonio import JsonStyle
from proxy.store import Store
from proxy.tokens import message_digest
from proxy.upstream import Upstream

_ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
# orjson re-serializes at most this deep; a body the proxy could not write back is refused up front.
_MAX_DEPTH = 254


@dataclass
class Event:
    """One thing the proxy did to a request (for headers, logs and stats)."""

    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestContext:
    request_id: str
    route: Route
    tenant: str
    session: str
    model: str | None
    stream: bool
    store: Store
    window: int  # the model's context window, in tokens
    upstream: Upstream  # for the proxy's own calls (summaries), on the route's upstream
    upstream_headers: list[tuple[str, str]]  # the client's headers as sent upstream (auth included)


@dataclass(frozen=True)
class ReadTool:
    """The proxy-owned read-back tool added to this request, and how its calls are answered."""

    name: str
    max_rounds: int
    max_chars: int


@dataclass
class Conversation:
    raw: bytes
    body: dict[str, Any]
    changed: bool = False
    events: list[Event] = field(default_factory=list)
    read_tool: ReadTool | None = None
    notes: dict[str, Any] = field(default_factory=dict)  # what one transform measured for a later one
    client_messages: list[dict[str, Any]] = field(default_factory=list)  # as the client sent them
    _digests: dict[int, tuple[dict[str, Any], bytes]] = field(default_factory=dict, repr=False)

    def digest(self, message: dict[str, Any]) -> bytes:
        """message_digest, once per message object per request (transforms and accounting share it)."""
        hit = self._digests.get(id(message))
        if hit is not None and hit[0] is message:
            return hit[1]
        d = message_digest(message)
        self._digests[id(message)] = (message, d)
        return d

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    def set_messages(self, messages: list[dict[str, Any]]) -> None:
        self.body["messages"] = messages
        self.changed = True

    def to_bytes(self) -> bytes:
        if not self.changed:
            return self.raw
        return JsonStyle.sniff(self.raw).dumps(self.body)

    @classmethod
    def parse(cls, raw: bytes) -> Conversation:
        """Parse and check a chat-completions body; anything malformed is a 400, never a 500."""
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
        check_chat_body(body)
        if raw.count(b"[") + raw.count(b"{") >= _MAX_DEPTH:  # only then can it be nested too deep
            try:
                orjson.dumps(body)
            except orjson.JSONEncodeError:
                raise BadRequest(f"request body is nested deeper than {_MAX_DEPTH} levels",
                                 code="invalid_json") from None
        return cls(raw=raw, body=body, client_messages=body["messages"])


def check_chat_body(body: Any) -> None:
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
    for i, m in enumerate(messages):
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
        if fn is not None and not (isinstance(fn, dict) and isinstance(fn.get("name", ""), str)):
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
