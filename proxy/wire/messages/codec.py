"""The Anthropic Messages codec: `messages` turns split into items, tools with `input_schema`, usage with cache reads.

Items (proxy/wire/turns.py): an assistant turn is one item carrying
its `tool_use` blocks as calls; a user turn is one item, or, when it holds
`tool_result` blocks, one item per result and one per run of its other blocks.
The transforms look into text blocks, `tool_use` and `tool_result` only.
`thinking` / `redacted_thinking` (with their signatures), images, documents,
`search_result`, server-tool blocks, `compaction` blocks and block types not
invented yet are never rewritten and never moved; `system`, `metadata`,
`context_management` and every other top-level field pass as they came.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, Literal

from proxy.errors import ProxyError
from proxy.wire import jsonio
from proxy.wire.codec import Body, BreakpointStyle, CodecBase, Item, Role, ToolCall, ToolSpec, mark_ttl
from proxy.wire.dialects import ANTHROPIC, Dialect
from proxy.wire.messages.read_shape import MessagesReadShape
from proxy.wire.messages.stream import watch
from proxy.wire.messages.validate import parse_body
from proxy.wire.parts import first, joined, texts, with_text_at
from proxy.wire.sse import named_event
from proxy.wire.turns import ORIGINS, Turns
from proxy.wire.usage import Usage

_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})  # the API refuses cache_control on these
_TEXT = frozenset({"text"})


def is_block(item: Any) -> bool:
    """A tool_result block lifted out of its user turn (messages have a role; blocks have none)."""
    return isinstance(item, dict) and "role" not in item


TURNS = Turns("content", "assistant", lambda b: isinstance(b, dict) and b.get("type") == "tool_result", is_block)


def mark(ttl: str | None) -> dict[str, Any]:
    return {"type": "ephemeral", "ttl": ttl} if ttl else {"type": "ephemeral"}


def _marked(value: Any) -> bool:
    return isinstance(value, dict) and "cache_control" in value


class Messages(CodecBase):
    api: ClassVar[str] = "messages"
    path: ClassVar[str] = "messages"
    calls_grouped: ClassVar[bool] = True
    dialect: ClassVar[Dialect] = ANTHROPIC
    reads_cache_at_breakpoints: ClassVar[bool] = True
    routing_fields: ClassVar[bool] = False  # no prompt_cache_key: the API refuses fields it does not know

    def parse(self, raw: bytes) -> Body:
        return self.parse_as(raw, need_max_tokens=True)

    def parse_as(self, raw: bytes, *, need_max_tokens: bool) -> Body:
        body = parse_body(raw, need_max_tokens=need_max_tokens)
        body["messages"], body[ORIGINS] = TURNS.split(body["messages"])
        return body

    def items(self, body: Body) -> list[Item]:
        items: list[Item] = body["messages"]
        return items

    def set_items(self, body: Body, items: list[Item]) -> None:
        body["messages"] = items

    def render(self, body: Body) -> Body:
        out = {k: v for k, v in body.items() if k != ORIGINS}
        out["messages"] = TURNS.join(body["messages"], body.get(ORIGINS) or {})
        return out

    def tool_names(self, tools: list[Any]) -> list[str]:
        return [str(t.get("name") or t.get("type")) for t in tools if isinstance(t, dict)]

    def tool_definition(self, spec: ToolSpec) -> Any:
        return {"name": spec.name, "description": spec.description, "input_schema": spec.parameters}

    def client_compacts(self, body: Body) -> bool:
        """Claude Code's own compaction: its history, then a user message asking for a summary that ends with its
        reminder not to call tools (its request class says `compaction` too, when it sends hint headers)."""
        items = body.get("messages")
        if not isinstance(items, list) or not items or self.role(items[-1]) != "user":
            return False
        return CLAUDE_CODE_SUMMARY_REQUEST in (self.text(items[-1]) or "")[-1000:]

    def session_hint(self, body: Body) -> str | None:
        """Claude Code's `metadata.user_id` ends in `_session_<uuid>`: that conversation, whatever else changes."""
        meta = body.get("metadata")
        uid = meta.get("user_id") if isinstance(meta, dict) else None
        if isinstance(uid, str) and "_session_" in uid:
            return uid.rsplit("_session_", 1)[1] or None
        return None

    def output_reserve(self, body: Body) -> int:
        v = body.get("max_tokens")
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

    # ---- one item
    def label(self, item: Item) -> str:
        if is_block(item):
            return "tool_result"
        role = item.get("role")
        return role if isinstance(role, str) else "?"

    def role(self, item: Item) -> Role:
        if is_block(item):
            return "tool"
        role = item.get("role")
        return "assistant" if role == "assistant" else "system" if role == "system" else "user"

    def text(self, item: Item) -> str | None:
        return joined(item.get("content"), _TEXT)

    def first_text(self, item: Item) -> str:
        return first(item.get("content"), _TEXT)

    def with_text(self, item: Item, text: str) -> Item:
        return with_text_at(item, "content", text, _TEXT)

    def replaced(self, item: Item, text: str) -> Item:
        return {**item, "content": text}

    def calls(self, item: Item) -> list[ToolCall]:
        if is_block(item) or item.get("role") != "assistant" or not isinstance(item.get("content"), list):
            return []
        return [ToolCall(b.get("id"), str(b.get("name") or "?"), jsonio.dumps(b.get("input")).decode())
                for b in item["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]

    def answers(self, item: Item) -> str | None:
        if not is_block(item):
            return None
        tid = item.get("tool_use_id")
        return tid if isinstance(tid, str) else None

    def is_error(self, item: Item) -> bool:
        return is_block(item) and item.get("is_error") is True

    def message(self, role: Literal["system", "developer", "user"], text: str) -> Item:
        """A user turn's text block; a system one joins the user turn it sits in (proxy/wire/turns.py)."""
        return {"role": "user" if role == "user" else "system", "content": [{"type": "text", "text": text}]}

    def result(self, call_id: str | None, text: str, name: str | None = None) -> Item:
        return {"type": "tool_result", "tool_use_id": call_id, "content": text}

    # ---- the proxy's own calls
    def request(self, model: str, items: list[Item], *, tools: list[Any] | None, extra: dict[str, Any],
                max_output: int) -> Body:
        """Leading system items become the top-level `system` (a summarizer's prompt), as the API wants it."""
        lead = TURNS.leading_system(items)
        body: Body = {"model": model, "max_tokens": max_output}
        if lead:
            body["system"] = "\n\n".join(self.text(i) or "" for i in items[:lead])
        body.update({k: v for k, v in extra.items() if k != "system" or not lead})
        body["messages"] = TURNS.join(items[lead:], {})
        if tools:
            body["tools"] = tools
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):  # enabled, adaptive
            # the agent's thinking settings (the cached shape): the API then wants no temperature and
            # room for the thinking budget on top of the summary's
            budget = thinking.get("budget_tokens")
            body["max_tokens"] = max_output + (budget if isinstance(budget, int) and budget > 0 else 0)
        else:
            body["temperature"] = 0
        return body

    def prefix_fields(self, body: Body) -> dict[str, Any]:
        return {"system": body["system"]} if body.get("system") is not None else {}

    def summary_fields(self, body: Body) -> dict[str, Any]:
        """The system prompt, the thinking settings and the context edits (Claude Code's `clear_thinking`, which
        keeps every earlier thinking block): without them the cached messages would be invalidated or rendered
        otherwise (earlier thinking cleared)."""
        out = self.prefix_fields(body)
        for key in ("thinking", "context_management"):
            if isinstance(body.get(key), dict):
                out[key] = body[key]
        return out

    def reply_text(self, data: Any) -> str | None:
        if not isinstance(data, dict) or data.get("type") != "message" or not isinstance(data.get("content"), list):
            return None
        return "\n".join(texts(data["content"], _TEXT))

    # ---- the provider's answer
    def read_shape(self, body: Body, tool: str) -> MessagesReadShape:
        return MessagesReadShape(self, tool)

    def watch_stream(self, chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None],
                     hide_usage: bool) -> AsyncIterator[bytes]:
        return watch(chunks, on_usage)

    def error_body(self, err: ProxyError) -> bytes:
        return err.anthropic_body()

    def stream_error(self, err: ProxyError, before: bytes) -> bytes:
        return named_event("error", err.anthropic_body())

    # ---- prompt-cache breakpoints
    def fixed_marks(self, body: Body) -> list[int]:
        """The client's own breakpoints outside the items: on tool definitions and system blocks."""
        system = body.get("system")
        return [mark_ttl(t) for t in body.get("tools") or () if _marked(t)] + (
            [mark_ttl(b) for b in system if _marked(b)] if isinstance(system, list) else [])

    def marks(self, item: Item) -> list[int]:
        if is_block(item):
            return [mark_ttl(item)] if _marked(item) else []
        content = item.get("content")
        return [mark_ttl(b) for b in content if _marked(b)] if isinstance(content, list) else []

    def has_breakpoint(self, item: Item) -> bool:
        if _marked(item):
            return True
        content = item.get("content")
        return isinstance(content, list) and any(_marked(b) for b in content)

    def with_breakpoint(self, item: Item, style: BreakpointStyle, ttl: str | None = None) -> Item | None:
        if is_block(item):
            return {**item, "cache_control": mark(ttl)}
        content = item.get("content")
        if isinstance(content, str):
            return {**item, "content": [{"type": "text", "text": content, "cache_control": mark(ttl)}]} \
                if content else None
        if not isinstance(content, list) or not content:
            return None
        last = content[-1]
        if not isinstance(last, dict) or not isinstance(last.get("type"), str) or last["type"] in _UNMARKABLE \
                or last.get("text") == "":
            return None
        return {**item, "content": [*content[:-1], {**last, "cache_control": mark(ttl)}]}


MESSAGES = Messages()


# The last sentence of the message with which Claude Code asks for a summary of its history (2.1.3xx).
CLAUDE_CODE_SUMMARY_REQUEST = "REMINDER: Do NOT call any tools. Respond with plain text only"


class _Counting(Messages):
    """count_tokens' codec: its body has no max_tokens, and every parse of it says so.

    Not only the first: a transform that fails, or a store that is down, has the
    pipeline parse the client's bytes again to forward them unmodified
    (proxy/rewrite/degrade.py), and that parse must not ask for max_tokens.
    """

    path: ClassVar[str] = "messages/count_tokens"

    def parse(self, raw: bytes) -> Body:
        return self.parse_as(raw, need_max_tokens=False)


COUNTING = _Counting()
