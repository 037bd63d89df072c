"""The Responses API codec: `input` items, tools top-level or in an `additional_tools` item, input/output usage.

Items the transforms may look into: messages (roles system, developer, user,
assistant; text in `input_text` / `output_text` parts or a string),
`function_call` / `custom_tool_call` (an assistant's call, one per item), and
their `*_output` items (tool results). An `additional_tools` item (Codex's
Responses Lite) reads as a system item with no text: part of the pinned head,
holding the request's tools where there are no top-level ones
(proxy/wire/responses/tools.py). Everything else (`reasoning` with its
encrypted content, `compaction`, `compaction_trigger`, `item_reference`, shell,
MCP, images, types not invented yet) reads as role `other` with no text: never
rewritten, never moved, emitted as the very object the client sent.
`instructions` is never touched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

from proxy.errors import ProxyError
from proxy.wire.codec import Body, CodecBase, Item, Role, ToolCall, ToolSpec
from proxy.wire.parts import first, joined, texts, with_text_at
from proxy.wire.responses.read_shape import ResponsesReadShape
from proxy.wire.responses.stream import stream_error, watch
from proxy.wire.responses.tools import ADDITIONAL_TOOLS, names, place, tools_of
from proxy.wire.responses.validate import check_items, parse_body
from proxy.wire.usage import Usage

_MESSAGE_ROLES: dict[Any, Role] = {"system": "system", "developer": "system", "user": "user",
                                   "assistant": "assistant"}
_CALLS = {"function_call": "arguments", "custom_tool_call": "input"}  # call type -> its arguments field
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
COMPACTION_TRIGGER = "compaction_trigger"  # Codex's own compaction: the provider compacts; it must be the last item


def _kind(item: Item) -> str | None:
    """The item's type (a message may omit it); None for none, or one that is not a string (never looked up)."""
    kind = item.get("type")
    if kind is None:
        return "message" if "role" in item else None
    return kind if isinstance(kind, str) else None


def _texts(content: Any) -> list[str]:
    return texts(content, _TEXT_PARTS)


def _text_field(item: Item) -> str | None:
    kind = _kind(item)
    if kind == "message":
        return "content"
    if kind in _OUTPUTS:
        return "output"
    return None


class Responses(CodecBase):
    api: ClassVar[str] = "responses"
    path: ClassVar[str] = "responses"
    calls_grouped: ClassVar[bool] = False

    def parse(self, raw: bytes) -> Body:
        body = parse_body(raw)
        if isinstance(body.get("input"), str):  # one user message; sent as the client wrote it unless changed
            body["input"] = [{"role": "user", "content": body["input"]}]
        return body

    def check_items(self, body: Body, start: int) -> None:
        check_items(body, self.items(body), start)

    def items(self, body: Body) -> list[Item]:
        items = body.get("input")
        if items is None:
            items = body["input"] = []
        assert isinstance(items, list)
        return items

    def set_items(self, body: Body, items: list[Item]) -> None:
        body["input"] = items

    def tools(self, body: Body) -> list[Any] | None:
        return tools_of(body)

    def set_tools(self, body: Body, tools: list[Any]) -> None:
        place(body, tools)

    def tool_names(self, tools: list[Any]) -> list[str]:
        return names(tools)

    def tool_definition(self, spec: ToolSpec) -> Any:
        return {"type": "function", "name": spec.name, "description": spec.description,
                "parameters": spec.parameters, "strict": False}

    def history_elsewhere(self, body: Body) -> bool:
        return bool(body.get("previous_response_id") or body.get("conversation"))

    def client_compacts(self, body: Body) -> bool:
        items = body.get("input")
        return isinstance(items, list) and bool(items) and isinstance(items[-1], dict) \
            and items[-1].get("type") == COMPACTION_TRIGGER

    def session_hint(self, body: Body) -> str | None:
        """Codex sends its conversation id as prompt_cache_key; a `conversation` names one too."""
        for value in (body.get("prompt_cache_key"), body.get("conversation")):
            if isinstance(value, dict):
                value = value.get("id")
            if isinstance(value, str) and value:
                return value
        return None

    def output_reserve(self, body: Body) -> int:
        v = body.get("max_output_tokens")
        return v if isinstance(v, int) and v > 0 else 0

    def label(self, item: Item) -> str:
        kind = _kind(item)
        if kind == "message":
            role = item.get("role")
            return role if isinstance(role, str) else "?"
        return kind if isinstance(kind, str) else "?"

    def role(self, item: Item) -> Role:
        kind = _kind(item)
        if kind == "message":
            try:
                return _MESSAGE_ROLES.get(item.get("role"), "other")
            except TypeError:
                return "other"
        if kind == ADDITIONAL_TOOLS:
            return "system"
        if kind in _CALLS:
            return "assistant"
        if kind in _OUTPUTS:
            return "tool"
        return "other"

    def text(self, item: Item) -> str | None:
        field = _text_field(item)
        return joined(item.get(field), _TEXT_PARTS) if field else None

    def first_text(self, item: Item) -> str:
        field = _text_field(item)
        return first(item.get(field), _TEXT_PARTS) if field else ""

    def with_text(self, item: Item, text: str) -> Item:
        field = _text_field(item)
        assert field is not None
        return with_text_at(item, field, text, _TEXT_PARTS)

    def replaced(self, item: Item, text: str) -> Item:
        field = _text_field(item)
        assert field is not None
        return {**item, field: text}

    def calls(self, item: Item) -> list[ToolCall]:
        kind = _kind(item)
        if kind not in _CALLS:
            return []
        args = item.get(_CALLS[kind])
        return [ToolCall(item.get("call_id"), str(item.get("name") or "?"), args if isinstance(args, str) else "")]

    def answers(self, item: Item) -> str | None:
        if _kind(item) not in _OUTPUTS:
            return None
        cid = item.get("call_id")
        return cid if isinstance(cid, str) else None

    def is_error(self, item: Item) -> bool:
        return False

    def message(self, role: Literal["system", "developer", "user"], text: str) -> Item:
        return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}

    def result(self, call_id: str | None, text: str, name: str | None = None) -> Item:
        return {"type": "function_call_output", "call_id": call_id, "output": text}

    def request(self, model: str, items: list[Item], *, tools: list[Any] | None, extra: dict[str, Any],
                max_output: int) -> Body:
        body: Body = {"model": model, "input": items, **extra}
        if tools:
            place(body, tools)  # where the agent's request has them: an additional_tools item, or top-level
        # No temperature: the reasoning models this API serves reject it; the output budget and nothing stored.
        body.update(max_output_tokens=max_output, store=False)
        return body

    def prefix_fields(self, body: Body) -> dict[str, Any]:
        return {k: body[k] for k in ("instructions",) if body.get(k) is not None}

    def summary_fields(self, body: Body) -> dict[str, Any]:
        """`instructions`, and the client's top-level tools if it has any: with them there, `request` puts the
        tools top-level as the agent's request has them, else in its additional_tools item (tools.py)."""
        out = self.prefix_fields(body)
        top = body.get("tools")
        if isinstance(top, list) and top:
            out["tools"] = top
        return out

    def reply_text(self, data: Any) -> str | None:
        output = data.get("output") if isinstance(data, dict) else None
        if not isinstance(output, list):
            return None
        texts = [t for item in output if isinstance(item, dict) and item.get("type") == "message"
                 for t in _texts(item.get("content"))]
        return "\n".join(texts)

    def read_shape(self, body: Body, tool: str) -> ResponsesReadShape:
        return ResponsesReadShape(self, tool)

    def watch_stream(self, chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None],
                     hide_usage: bool) -> AsyncIterator[bytes]:
        return watch(chunks, on_usage)

    def stream_error(self, err: ProxyError, before: bytes) -> bytes:
        return stream_error(err, before)


RESPONSES = Responses()
