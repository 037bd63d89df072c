"""The one seam between a client API's wire format and the rest of the proxy.

The transforms and the accountant work on an API-neutral conversation: an
ordered list of items, each one a message, tool call or tool result exactly as
the client's API spells it (the client's own objects, untouched unless a
transform replaces them). They never look inside an item themselves: every
question about one (its role, its text, its tool calls, the call a result
answers) and every new or changed item goes through the request's `Codec`.
Adding a client API is adding a codec; no transform changes.

Why opaque items rather than converted ones: an item nobody changed is emitted
as the very object the client sent, so the rewritten body repeats the client's
bytes for it, and per-item facts (digests, token counts, the session memo) stay
keyed by the same objects across requests. Byte-stable by construction.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, Self

import orjson

from proxy.wire.dialects import OPENAI, Dialect
from proxy.wire.usage import Usage, parse_usage
from proxy.wire.values import Body as Body
from proxy.wire.values import Item as Item

if TYPE_CHECKING:
    from proxy.errors import ProxyError
    from proxy.wire.read_shape import ReadShape

Role = Literal["system", "user", "assistant", "tool", "other"]
BreakpointStyle = Literal["anthropic", "openai"]


MARK_TTL_SECONDS = {"5m": 300, "1h": 3600}  # Anthropic's breakpoint lifetimes; no `ttl` is 5 minutes


def mark_ttl(marked: Any) -> int:
    """The lifetime in seconds of the `cache_control` breakpoint on a block (or an item)."""
    cc = marked.get("cache_control") if isinstance(marked, dict) else None
    return MARK_TTL_SECONDS["1h"] if isinstance(cc, dict) and cc.get("ttl") == "1h" else MARK_TTL_SECONDS["5m"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call an assistant item makes: what the status bar, compaction and read-back need of it."""

    id: str | None
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function tool the proxy offers the model (its own `context_read`), in neutral terms."""

    name: str
    description: str
    parameters: dict[str, Any]


class Codec(Protocol):
    """Everything the proxy knows about one client API's request shape."""

    api: ClassVar[str]  # the API's name in logs and records, e.g. "chat.completions"
    # True: one assistant item carries all of a turn's calls, its results follow it (chat); False: each call
    # is an item of its own, and a turn's calls (with reasoning between) come before their results (Responses).
    calls_grouped: ClassVar[bool]
    dialect: ClassVar[Dialect]  # the provider side: which upstreams take it, how a key is sent (dialects.py)
    reads_cache_at_breakpoints: ClassVar[bool]  # the provider reads its cache only at cache_control marks
    routing_fields: ClassVar[bool]  # whether the API takes OpenAI's cache-routing fields (prompt_cache_key, ...)

    def at(self, params: Mapping[str, str]) -> Codec:
        """The codec of one request, given its path's parameters (Gemini's model is in its URL)."""
        ...

    def upstream_path(self, model: str | None, stream: bool) -> str:
        """Its endpoint below the upstream's base URL for a call of `model`, e.g. "chat/completions"."""
        ...

    # ---- the request body
    def parse(self, raw: bytes) -> Body:
        """The body, checked; anything malformed raises BadRequest (a 400), never a 500."""
        ...

    def check_items(self, body: Body, start: int) -> None:
        """The items from `start` on are well-formed (the rest of parsing, once the session is known)."""
        ...

    def items(self, body: Body) -> list[Item]: ...

    def set_items(self, body: Body, items: list[Item]) -> None: ...

    def render(self, body: Body) -> Body:
        """The body as it is sent: the items in the API's own structure (Messages joins them into turns)."""
        ...

    def model(self, body: Body) -> str | None: ...

    def is_stream(self, body: Body) -> bool: ...

    def tools(self, body: Body) -> list[Any] | None:
        """The tool definitions as the client sent them (opaque to the caller)."""
        ...

    def set_tools(self, body: Body, tools: list[Any]) -> None: ...

    def tool_names(self, tools: list[Any]) -> list[str]: ...

    def tool_definition(self, spec: ToolSpec) -> Any:
        """A function tool in this API's shape."""
        ...

    def history_elsewhere(self, body: Body) -> bool:
        """Whether the provider holds the earlier history (the request carries only the new items)."""
        ...

    def client_compacts(self, body: Body) -> bool:
        """Whether the request asks the provider to compact the history itself (a Responses request ending in
        a `compaction_trigger` item, which must stay last): the proxy compacts nothing and adds nothing after it."""
        ...

    def session_hint(self, body: Body) -> str | None:
        """A conversation id the client sends in the body (the session when no X-Session-Id is given)."""
        ...

    def output_reserve(self, body: Body) -> int:
        """The completion budget the request asks for, which must fit in the window too."""
        ...

    # ---- one item
    def label(self, item: Item) -> str:
        """The item's role as its API names it, for people (logs, transcripts, the inspector)."""
        ...

    def role(self, item: Item) -> Role:
        """system (system and developer), user, assistant, tool (a tool result), or other."""
        ...

    def text(self, item: Item) -> str | None:
        """The item's text (a string, or its text parts joined by newlines); None if it has none."""
        ...

    def first_text(self, item: Item) -> str:
        """The item's first text, where the proxy writes its own marks; "" if none."""
        ...

    def with_text(self, item: Item, text: str) -> Item:
        """A copy of the item whose text is `text` (its first text part, other text parts dropped)."""
        ...

    def replaced(self, item: Item, text: str) -> Item:
        """A copy of the item whose whole content is `text` (a cleared result: its images go too)."""
        ...

    def calls(self, item: Item) -> list[ToolCall]: ...

    def answers(self, item: Item) -> str | None:
        """The id of the tool call a tool result answers."""
        ...

    def result_name(self, item: Item) -> str | None:
        """The tool name a result names itself (legacy `name` fields); None if it does not."""
        ...

    def is_error(self, item: Item) -> bool:
        """Whether the result says itself that it is an error (a flag, not its text)."""
        ...

    def message(self, role: Literal["system", "developer", "user"], text: str) -> Item:
        """A new text message of that role (statuses, summaries, notes)."""
        ...

    def result(self, call_id: str | None, text: str, name: str | None = None) -> Item:
        """A new tool result answering `call_id` (a call of the tool `name`, where the API wants it said)."""
        ...

    # ---- the proxy's own calls (summaries), made in the agent's API
    def request(self, model: str, items: list[Item], *, tools: list[Any] | None, extra: dict[str, Any],
                max_output: int) -> Body:
        """A deterministic (temperature 0) request: `items`, then `extra` fields (cache routing), then tools."""
        ...

    def prefix_fields(self, body: Body) -> dict[str, Any]:
        """Top-level fields that are part of the cached prompt prefix (Responses' `instructions`)."""
        ...

    def summary_fields(self, body: Body) -> dict[str, Any]:
        """What a summary call in the cached shape repeats of the agent's request so its cached prefix is hit."""
        ...

    def reply_text(self, data: Any) -> str | None:
        """The text of a non-streamed reply: "" if it has none (a tool call), None if it is not a reply."""
        ...

    def raw_usage(self, data: Any) -> dict[str, Any]:
        """The reply's usage object as the provider wrote it ({} if none)."""
        ...

    # ---- the provider's answer
    def ask_for_usage(self, body: Body) -> bool:
        """Have a stream report its usage (the body changed); True if the client did not ask (so it is hidden)."""
        ...

    def read_shape(self, body: Body, tool: str) -> ReadShape | None:
        """The shapes the read-back loop needs for this request, or None where it cannot have hidden rounds."""
        ...

    def watch_stream(self, chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None],
                     hide_usage: bool) -> AsyncIterator[bytes]:
        """The stream passed through as it arrives; its usage reported; StreamCutShort if it ends unfinished."""
        ...

    def usage_of_reply(self, content: bytes) -> Usage | None: ...

    def error_body(self, err: ProxyError) -> bytes:
        """The proxy's own error in this API's error shape."""
        ...

    def stream_error(self, err: ProxyError, before: bytes) -> bytes:
        """The event that ends a stream the proxy cannot finish (its headers are already out); `before` is the
        last chunk the client got (where a numbered stream's next number is read)."""
        ...

    # ---- prompt-cache breakpoints
    def fixed_marks(self, body: Body) -> list[int]:
        """The lifetimes (seconds) of the client's own breakpoints outside the items (Messages: tools, system)."""
        ...

    def marks(self, item: Item) -> list[int]:
        """The lifetimes (seconds) of the client's Anthropic-style breakpoints in the item, in order."""
        ...

    def has_breakpoint(self, item: Item) -> bool: ...

    def with_breakpoint(self, item: Item, style: BreakpointStyle, ttl: str | None = None) -> Item | None:
        """The item with a cache breakpoint after it; None when it has nothing to hang one on."""
        ...


class CodecBase:
    """What the APIs spell alike, written once: each codec states only where its API differs.

    The defaults are OpenAI's, which Chat Completions and Responses share (so the two cannot drift apart): model,
    stream and tools top-level, usage in `usage`, a fixed path; and the answers of an API that has none of what
    is asked (no history held elsewhere, no breakpoints, ...).
    """

    dialect: ClassVar[Dialect] = OPENAI
    routing_fields: ClassVar[bool] = True
    reads_cache_at_breakpoints: ClassVar[bool] = False
    path: ClassVar[str]  # its endpoint below the upstream's base URL, e.g. "chat/completions"

    def at(self, params: Mapping[str, str]) -> Self:
        return self  # nothing of the request is in its path

    def upstream_path(self, model: str | None, stream: bool) -> str:
        return self.path

    def render(self, body: Body) -> Body:
        return body  # the items are the API's own list

    def model(self, body: Body) -> str | None:
        model = body.get("model")
        return model if isinstance(model, str) else None

    def is_stream(self, body: Body) -> bool:
        return body.get("stream") is True

    def tools(self, body: Body) -> list[Any] | None:
        tools = body.get("tools")
        return tools if isinstance(tools, list) else None

    def set_tools(self, body: Body, tools: list[Any]) -> None:
        body["tools"] = tools

    def raw_usage(self, data: Any) -> dict[str, Any]:
        usage = data.get("usage") if isinstance(data, dict) else None
        return usage if isinstance(usage, dict) else {}

    def usage_of_reply(self, content: bytes) -> Usage | None:
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError:
            return None
        return parse_usage(data.get("usage")) if isinstance(data, dict) else None

    def check_items(self, body: Body, start: int) -> None:
        return None  # parse checked every item (Messages' tool pairing spans turns: it is checked whole)

    def history_elsewhere(self, body: Body) -> bool:
        return False

    def client_compacts(self, body: Body) -> bool:
        return False

    def prefix_fields(self, body: Body) -> dict[str, Any]:
        return {}  # Chat: the system prompt is a message

    def summary_fields(self, body: Body) -> dict[str, Any]:
        return self.prefix_fields(body)

    def result_name(self, item: Item) -> str | None:
        return None

    def error_body(self, err: ProxyError) -> bytes:
        return err.body()  # OpenAI's error shape

    def stream_error(self, err: ProxyError, before: bytes) -> bytes:
        return b"data: " + self.error_body(err) + b"\n\n"  # one more data event (Chat, Gemini)

    def ask_for_usage(self, body: Body) -> bool:
        return False  # the stream reports it unasked (Responses' terminal event, Messages' message_start and
        # message_delta, every Gemini chunk); Chat's must be asked

    # ---- prompt-cache breakpoints: none (the Responses API caches by prefix and prompt_cache_key, Gemini's by
    # prefix: neither takes markers)
    def fixed_marks(self, body: Body) -> list[int]:
        return []

    def marks(self, item: Item) -> list[int]:
        return []

    def has_breakpoint(self, item: Item) -> bool:
        return False

    def with_breakpoint(self, item: Item, style: BreakpointStyle, ttl: str | None = None) -> Item | None:
        return None


def add_call_names(wire: Codec, names: dict[str | None, str], item: Item) -> None:
    """Fold one item's tool calls into an id → tool name map."""
    for call in wire.calls(item):
        names[call.id] = call.name


def call_names(wire: Codec, items: list[Item]) -> dict[str | None, str]:
    """Tool-call id → tool name over the items: how a result is told apart from the call it answers."""
    names: dict[str | None, str] = {}
    for item in items:
        add_call_names(wire, names, item)
    return names
