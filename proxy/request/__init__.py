"""What one request carries through the stages: its context, and the conversation in transit.

The conversation is API-neutral: the client's raw bytes, the parsed body, its codec, what was done to it.

Byte preservation is the default: until a transform marks the conversation
changed, `to_bytes()` returns exactly the bytes the client sent. The items
(`messages`) are the client's own objects; only `wire`, the request's codec,
looks inside them (proxy/wire/codec.py).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, Protocol

from proxy import offloop
from proxy.config import Route
from proxy.request.events import Event
from proxy.store import Store
from proxy.telemetry.base import NO_TRACE, RequestTrace
from proxy.tokens.counter import REPLY_PRIMING_TOKENS, default_counter
from proxy.tokens.encodings import encoding_for_model
from proxy.tokens.message_facts import MessageFacts
from proxy.upstream.client import Upstream
from proxy.wire.codec import Codec, Item
from proxy.wire.jsonio import JsonStyle
from proxy.wire.usage import Usage

if TYPE_CHECKING:
    from proxy.tokens.session_memo import RequestMemo


class OwnCalls(Protocol):
    """Accounts one of the proxy's own provider calls (a summary) the moment its answer arrives, to the request
    that made it (proxy/accounting/own_calls.py): whether or not a request ever uses the result, and once."""

    made: list[tuple[str, Usage]]  # (kind, usage) of each so far, for the request's span; the figures count them apart

    def billed(self, ctx: RequestContext, kind: str, usage: Usage, status: int,
               prompt: list[dict[str, Any]] | None = None) -> None: ...


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
    own_calls: OwnCalls  # where each of the proxy's own calls for this request is accounted as it is answered
    archive_quota: int | None = None  # bytes of stored text the tenant may keep (settings.store_quota_bytes)
    # "count": a count_tokens request, rewritten as a turn would be but never a turn itself: what it stores
    # is marked unsent, for the first turn that sends it to count (proxy/rewrite/first_send.py)
    purpose: Literal["turn", "count", "engine"] = "turn"  # engine: a gateway's call (proxy/engine/gateway.py)
    trace: RequestTrace = NO_TRACE  # its spans (proxy/telemetry/); the no-op while tracing is off
    # other processes may serve this session (proxy/state.py shared_sessions): what it last did is read from the
    # store, not from this process's memory
    shared: bool = True
    # the client compacts its own history with this request (Codex's compaction_trigger, Claude Code's summary
    # request or request class): nothing new is compacted, nothing is added after its last message
    client_compacts: bool = False
    # the process's own store, for a request over its window while `store` is down (proxy/rewrite/degrade.py)
    fallback: Store | None = None
    upstream_query: str = ""  # the client's query string as forwarded (proxy/engine/routing.py forwarded_query)


class ReadRounds(Protocol):
    """The hidden read-back rounds of one request, as accounting sees them (proxy/rewrite/context_read/loop.py)."""

    done: int  # rounds the proxy answered
    messages: list[Item]  # the items as they grew: the client's, then each round's calls and answers
    usages: list[Usage]  # each hidden call's usage, as reported
    sent: list[int]  # how many of `messages` each hidden call sent (each call's items extend the one before)


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
    wire: Codec
    changed: bool = False
    events: list[Event] = field(default_factory=list)
    earlier_events: list[Event] = field(default_factory=list)  # of a run the request was retried after
    read_tool: ReadTool | None = None
    client_messages: list[Item] = field(default_factory=list)  # as the client sent them
    unmarked: dict[int, Item] = field(default_factory=dict)  # sent items before cache markers were added
    # id of each item a transform wrote -> (its kind, the handle it names): proxy/rewrite/marks.py
    written: dict[int, tuple[str, str | None]] = field(default_factory=dict)
    # what a transform keeps for this request between its restore and its apply, under its name (the status
    # bar's: where its earlier statuses stood); no other transform reads it
    owned: dict[str, object] = field(default_factory=dict)
    memo: RequestMemo | None = None  # what the session's previous request left (proxy/tokens/session_memo.py)
    usage_hidden: bool = False  # the proxy asked the stream for usage the client did not ask for
    # its whole-body steps (parse, the per-item checks, render and dump, the accounting measure) run on the pool:
    # decided once, when it is read (offloop.body_is_light: by its bytes and its items)
    heavy: bool = False
    facts: MessageFacts = field(init=False, repr=False)
    _style: JsonStyle | None = field(default=None, init=False, repr=False)
    _tools: tuple[list[Any] | None] | None = field(default=None, init=False, repr=False)  # (tools,) once read
    _prefix_tokens: int | None = field(default=None, init=False, repr=False)
    # (tools, model, their tokens): the tool list's count, while the same list goes to the same model
    _tool_tokens: tuple[list[Any] | None, str | None, int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.facts = MessageFacts(self.client_messages, self._model)

    def _model(self) -> str | None:
        return self.wire.model(self.body)

    @property
    def model(self) -> str | None:
        return self.wire.model(self.body)

    @property
    def tools(self) -> list[Any] | None:
        """The request's tools, read once until the tools or the items are set (where the tools may be one
        of the items - Responses' additional_tools - finding them is a walk over the items)."""
        if self._tools is None:
            self._tools = (self.wire.tools(self.body),)
        return self._tools[0]

    def wrote(self, item: Item, kind: str, handle: str | None = None) -> Item:
        """`item`, which a transform wrote: what it is (a placeholder, a summary, a status) and the handle it
        names are said here, never read back from its text."""
        self.written[id(item)] = (kind, handle)
        return item

    def written_at(self, pos: int) -> tuple[str, str | None] | None:
        """What the item sent at `pos` is, if a transform wrote it (before or after a cache marker was added)."""
        found = self.written.get(id(self.messages[pos]))
        if found is None and pos in self.unmarked:
            found = self.written.get(id(self.unmarked[pos]))
        return found

    def set_tools(self, tools: list[Any]) -> None:
        """The tools as sent from now on. Where they are the counted ones plus some (the read tool appended), their
        count is the known one plus the new tools' (a tool list's count is the sum of its tools')."""
        known, model = self._tool_tokens, self._model()
        old = known[0] if known is not None and known[1] == model else None
        self.wire.set_tools(self.body, tools)
        self.changed = True
        self._tools = self._tool_tokens = None
        if known is not None and old and len(tools) > len(old) and all(map(operator.is_, old, tools)):
            self._tool_tokens = (self.tools, model, known[2] + default_counter.count_tools(tools[len(old):], model))

    @cached_property
    def prefix(self) -> dict[str, Any] | None:
        """The top-level fields before the items in the provider's prompt (Messages' `system`, Responses'
        `instructions`) as one pseudo-item, for counting and hashing like one; None if there are none.
        No transform rewrites them, so it is read once."""
        fields = self.wire.prefix_fields(self.body)
        return {"role": "system", "content": fields} if fields else None

    def prefix_tokens(self) -> int:
        """Tokens of that top-level prompt (0 where the API has none); counted once per request, as the prefix
        is read once (every count of the prompt's head asks for it: several times per request)."""
        if self._prefix_tokens is None:
            prefix = self.prefix
            self._prefix_tokens = self.facts.count(prefix) if prefix is not None else 0
        return self._prefix_tokens

    def tool_tokens(self) -> int:
        """Tokens of the tool definitions as sent, counted once while the tool list stays (several counts of the
        prompt's head ask for it per request; counting again hashes the whole list to find its cached count)."""
        tools, model, known = self.tools, self._model(), self._tool_tokens
        if known is not None and known[0] is tools and known[1] == model:
            return known[2]
        n = default_counter.count_tools(tools, model)
        self._tool_tokens = (tools, model, n)
        return n

    def head_tokens(self) -> int:
        """Tokens of what comes before the items in the prompt: the tool definitions as sent, the system prompt."""
        return self.tool_tokens() + self.prefix_tokens()

    def prompt_tokens(self, messages: Sequence[dict[str, Any]]) -> int:
        """The prompt the provider gets with these items, by the proxy's count: the head and every item.

        The one definition of a prompt's size: the status bar's context line, the headers
        (`x-ctxproxy-prompt-tokens`, `-tokens-after`) and the inspector's "upstream got" all
        read it (README, "What the figures mean"); the answer's `max_tokens` reserve is not in it.
        """
        return self.head_tokens() + sum(self.counts(messages))

    def window_need(self) -> int:
        """Tokens the window must hold for this request as it stands: its items, what every request of the body
        carries besides them (fixed_tokens) and the answer's reserve. More than the window: rejected for length."""
        return sum(self.counts(self.messages)) + self.fixed_tokens() + self.wire.output_reserve(self.body)

    def fixed_tokens(self) -> int:
        """Tokens every request of this body carries besides its items: tools, system prompt, reply priming
        (what must fit in the window with the items; not the prompt's size, `prompt_tokens`)."""
        return REPLY_PRIMING_TOKENS + self.head_tokens()

    def kinds(self, kind: type[Event]) -> list[Any]:
        """This request's events of one kind, in order."""
        return [e for e in self.events if isinstance(e, kind)]

    def digest(self, message: dict[str, Any]) -> bytes:
        """message_digest, once per message object per request (transforms and accounting share it)."""
        return self.facts.digest(message)

    def digests(self, messages: Sequence[dict[str, Any]]) -> list[bytes]:
        """The digest of each message; only messages not seen before are hashed (proxy/tokens/message_facts.py)."""
        return self.facts.digests(messages)

    def counts(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Tokens of each message for this request's model (as TokenCounter.message_counts), once per message."""
        return self.facts.counts(messages)

    async def prepare_digests(self) -> None:
        """The client's new messages hashed off the event loop, unless they are light all together
        (every request needs all their digests; many small ones are as much work as one big one)."""
        if len(self.raw) >= offloop.INLINE_CHARS:  # else no string in the body can be big
            await self.facts.prepare(self.client_messages[self.memo.known if self.memo else 0:], counts=False)

    async def prepare_counts(self) -> None:
        """Token counts of the messages not counted yet (and of the tool list), off the event loop unless light.

        Run before the transforms that read counts, once offload has taken out
        what it takes out: an offloaded original is never counted for nothing.
        """
        if len(self.raw) >= offloop.INLINE_CHARS:
            await self.facts.prepare(self.messages, counts=True)
            tools, model = self.tools, self._model()
            if tools:
                n = await offloop.run_unless_light(tools, default_counter.count_tools, tools, model)
                self._tool_tokens = (tools, model, n)

    async def count_prepared(self, message: dict[str, Any]) -> int:
        """Tokens of one message (as `counts`), counted off the event loop if it is big."""
        await self.facts.prepare((message,), counts=True)
        return self.facts.count(message)

    def encoding_name(self) -> str:
        return encoding_for_model(self._model()).name

    @property
    def messages(self) -> list[Item]:
        return self.wire.items(self.body)

    def set_messages(self, messages: list[Item]) -> None:
        self.wire.set_items(self.body, messages)
        self.changed = True
        self._tools = None  # the tools may be among the items (Responses' additional_tools): read again

    @property
    def style(self) -> JsonStyle:
        """The client's JSON style, sniffed once per request (a scan of the whole body: ~10 ms at 10 MB)."""
        if self._style is None:
            self._style = JsonStyle.sniff(self.raw)
        return self._style

    def to_bytes(self) -> bytes:
        if not self.changed:
            return self.raw
        return self.style.dumps(self.wire.render(self.body))

    async def rendered(self) -> bytes:
        """What is sent upstream (`to_bytes`), rendered and dumped on the pool when the request is heavy."""
        if not self.changed:
            return self.raw
        return await offloop.run(self.to_bytes) if self.heavy else self.to_bytes()

    @classmethod
    def parse(cls, raw: bytes, wire: Codec) -> Conversation:
        """Parse and check a body in the codec's API; anything malformed is a 400, never a 500."""
        body = wire.parse(raw)
        items = wire.items(body)
        conv = cls(raw=raw, body=body, wire=wire, client_messages=items,
                   heavy=not offloop.body_is_light(len(raw), len(items)))
        if conv.heavy:
            _ = conv.style  # sniffed with the parse: a scan of the whole body
        return conv

    @classmethod
    async def read(cls, raw: bytes, wire: Codec) -> Conversation:
        """`parse`, on the pool when the body is big (a 400 for anything malformed either way)."""
        if offloop.body_is_light(len(raw)):
            return cls.parse(raw, wire)
        return await offloop.run(cls.parse, raw, wire)

    async def check(self, start: int = 0) -> None:
        """The rest of parsing: the items from `start` on (those the session's memo does not know), on the pool
        when the request is heavy."""
        if self.heavy:
            await offloop.run(self.wire.check_items, self.body, start)
        else:
            self.wire.check_items(self.body, start)
