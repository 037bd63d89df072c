"""The Chat Completions codec: `messages` items, `tools` of type function, usage in `usage`.

Every rule about how a Chat Completions message carries its text, its tool
calls and its results lives here, once (the transforms ask; see
proxy/wire/codec.py). Reading is tolerant: the body was checked at parse, and
an odd but valid item (a part without text, a call without a function) reads
as having none of that, never as an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

from proxy.wire.chat.read_shape import ChatReadShape
from proxy.wire.chat.validate import check_messages, parse_body
from proxy.wire.codec import Body, BreakpointStyle, CodecBase, Item, Role, ToolCall, ToolSpec, mark_ttl
from proxy.wire.parts import first, joined, with_text_at
from proxy.wire.sse import account_stream
from proxy.wire.usage import Usage

_ROLES: dict[Any, Role] = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
                           "tool": "tool", "function": "tool"}
ANTHROPIC_MARK = {"type": "ephemeral"}  # cache_control as Anthropic-compatible chat endpoints take it
OPENAI_BREAKPOINT = {"type": "prompt_cache_breakpoint"}
_OUTPUT_KEYS = ("max_completion_tokens", "max_tokens")


class ChatCompletions(CodecBase):
    api: ClassVar[str] = "chat.completions"
    path: ClassVar[str] = "chat/completions"
    calls_grouped: ClassVar[bool] = True

    def parse(self, raw: bytes) -> Body:
        return parse_body(raw)

    def check_items(self, body: Body, start: int) -> None:
        check_messages(body, start)

    def items(self, body: Body) -> list[Item]:
        messages: list[Item] = body["messages"]
        return messages

    def set_items(self, body: Body, items: list[Item]) -> None:
        body["messages"] = items

    def tool_names(self, tools: list[Any]) -> list[str]:
        """Each tool's name: the function's, or a top-level one (custom tools); "None" where it has none."""
        return [str((t.get("function") or {}).get("name") or t.get("name")) for t in tools if isinstance(t, dict)]

    def tool_definition(self, spec: ToolSpec) -> Any:
        return {"type": "function", "function": {"name": spec.name, "description": spec.description,
                                                 "parameters": spec.parameters}}

    def session_hint(self, body: Body) -> str | None:
        """opencode sends its session id as prompt_cache_key (OpenAI's cache routing key, one per conversation)."""
        value = body.get("prompt_cache_key")
        return value if isinstance(value, str) and value else None

    def output_reserve(self, body: Body) -> int:
        for key in _OUTPUT_KEYS:
            v = body.get(key)
            if isinstance(v, int) and v > 0:
                return v
        return 0

    def label(self, item: Item) -> str:
        role = item.get("role", "?")
        return role if isinstance(role, str) else "?"

    def role(self, item: Item) -> Role:
        try:
            return _ROLES.get(item.get("role"), "other")
        except TypeError:  # an unhashable role
            return "other"

    def text(self, item: Item) -> str | None:
        return joined(item.get("content"), None)

    def first_text(self, item: Item) -> str:
        return first(item.get("content"), None)

    def with_text(self, item: Item, text: str) -> Item:
        return with_text_at(item, "content", text, None)

    def replaced(self, item: Item, text: str) -> Item:
        return {**item, "content": text}

    def calls(self, item: Item) -> list[ToolCall]:
        out = []
        for call in item.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                out.append(ToolCall(call.get("id"), str(fn.get("name") or "?"), str(fn.get("arguments") or "")))
        return out

    def answers(self, item: Item) -> str | None:
        cid = item.get("tool_call_id")
        return cid if isinstance(cid, str) else None

    def result_name(self, item: Item) -> str | None:
        name = item.get("name")
        return name if isinstance(name, str) and name else None

    def is_error(self, item: Item) -> bool:
        return item.get("is_error") is True

    def message(self, role: Literal["system", "developer", "user"], text: str) -> Item:
        return {"role": role, "content": text}

    def result(self, call_id: str | None, text: str, name: str | None = None) -> Item:
        return {"role": "tool", "tool_call_id": call_id, "content": text}

    def request(self, model: str, items: list[Item], *, tools: list[Any] | None, extra: dict[str, Any],
                max_output: int) -> Body:
        body: Body = {"model": model, "messages": items, **extra}
        if tools:
            body["tools"] = tools
        body["temperature"] = 0
        body["max_tokens"] = max_output
        return body

    def reply_text(self, data: Any) -> str | None:
        try:
            text = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return None
        return text if isinstance(text, str) else ""

    def ask_for_usage(self, body: Body) -> bool:
        if body.get("stream") is not True:
            return False
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            return False
        body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        return True

    def read_shape(self, body: Body, tool: str) -> ChatReadShape | None:
        if body.get("n") not in (None, 1):  # several choices: no single answer to continue from
            return None
        return ChatReadShape(self, tool)

    def watch_stream(self, chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None],
                     hide_usage: bool) -> AsyncIterator[bytes]:
        return account_stream(chunks, on_usage, hide_usage)

    def marks(self, item: Item) -> list[int]:
        content = item.get("content")
        parts = [item, *content] if isinstance(content, list) else [item]
        return [mark_ttl(p) for p in parts if isinstance(p, dict) and isinstance(p.get("cache_control"), dict)]

    def has_breakpoint(self, item: Item) -> bool:
        content = item.get("content")
        return "cache_control" in item or (isinstance(content, list) and any(
            isinstance(p, dict) and ("cache_control" in p or p.get("type") == OPENAI_BREAKPOINT["type"])
            for p in content))

    def with_breakpoint(self, item: Item, style: BreakpointStyle, ttl: str | None = None) -> Item | None:
        content = item.get("content")
        if isinstance(content, str):
            parts: list[Any] = [{"type": "text", "text": content}]
        elif isinstance(content, list) and content:
            parts = list(content)
        else:
            return None  # nothing to hang a marker on (e.g. tool calls only)
        if style == "anthropic":
            if not isinstance(parts[-1], dict):
                return None
            parts[-1] = {**parts[-1], "cache_control": {**ANTHROPIC_MARK, "ttl": ttl} if ttl else ANTHROPIC_MARK}
        else:
            parts.append(dict(OPENAI_BREAKPOINT))
        return {**item, "content": parts}


CHAT = ChatCompletions()
