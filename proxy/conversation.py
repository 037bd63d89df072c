"""A chat request in transit: the client's raw bytes, the parsed body, and what was done to it.

Byte preservation is the default: until a transform marks the conversation
changed, `to_bytes()` returns exactly the bytes the client sent.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, repeat
from typing import TYPE_CHECKING, Any

import orjson

from proxy import offloop
from proxy.config import Route
from proxy.errors import BadRequest
from proxy import jsonio
from proxy.jsonio import JsonStyle
from proxy.store import Store
from proxy.encodings import encoding_for_model
from proxy.message_facts import MessageFacts, chars_of
from proxy.tokens import default_counter
from proxy.upstream import Upstream

if TYPE_CHECKING:
    from proxy.session_memo import RequestMemo

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
    archive_quota: int | None = None  # bytes of stored text the tenant may keep (settings.store_quota_bytes)


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
    memo: RequestMemo | None = None  # what the session's previous request left (proxy/session_memo.py)
    facts: MessageFacts = field(init=False, repr=False)
    _style: JsonStyle | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.facts = MessageFacts(self.client_messages, self._model)

    def _model(self) -> str | None:
        model = self.body.get("model")
        return model if isinstance(model, str) else None

    def digest(self, message: dict[str, Any]) -> bytes:
        """message_digest, once per message object per request (transforms and accounting share it)."""
        return self.facts.digest(message)

    def digests(self, messages: Sequence[dict[str, Any]]) -> list[bytes]:
        """The digest of each message; only messages not seen before are hashed (proxy/message_facts.py)."""
        return self.facts.digests(messages)

    def counts(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Tokens of each message for this request's model (as TokenCounter.message_counts), once per message."""
        return self.facts.counts(messages)

    async def prepare_digests(self) -> None:
        """The client's big new messages hashed off the event loop (every request needs all their digests)."""
        if len(self.raw) >= offloop.INLINE_CHARS:  # else no string in the body can be big
            await self.facts.prepare(self.client_messages[self.memo.known if self.memo else 0:], counts=False)

    async def prepare_counts(self) -> None:
        """Token counts of the big messages (and of a big tool list) not counted yet, off the event loop.

        Run before the transforms that read counts, once offload has taken out
        what it takes out: an offloaded original is never counted for nothing.
        """
        if len(self.raw) >= offloop.INLINE_CHARS:
            await self.facts.prepare(self.messages, counts=True)
            tools = self.body.get("tools")
            if tools:
                await offloop.run_if(chars_of(tools), default_counter.count_tools, tools, self._model())

    async def count_prepared(self, message: dict[str, Any]) -> int:
        """Tokens of one message (as `counts`), counted off the event loop if it is big."""
        await self.facts.prepare((message,), counts=True)
        return self.facts.count(message)

    def encoding_name(self) -> str:
        return encoding_for_model(self._model()).name

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.body["messages"]

    def set_messages(self, messages: list[dict[str, Any]]) -> None:
        self.body["messages"] = messages
        self.changed = True

    @property
    def style(self) -> JsonStyle:
        """The client's JSON style, sniffed once per request (a scan of the whole body: ~10 ms at 10 MB)."""
        if self._style is None:
            self._style = JsonStyle.sniff(self.raw)
        return self._style

    def to_bytes(self) -> bytes:
        if not self.changed:
            return self.raw
        return self.style.dumps(self.body)

    @classmethod
    def parse(cls, raw: bytes) -> Conversation:
        """Parse and check a chat-completions body; anything malformed is a 400, never a 500."""
        try:
            body = jsonio.loads(raw)  # orjson; integers beyond 64 bits kept exact
        except orjson.JSONDecodeError as e:
            raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
        try:
            check_chat_body(body, messages_too=False)
            _check_writable({k: v for k, v in body.items() if k != "messages"})
        except BadRequest:
            check_chat_body(body)  # a bad message comes first, as it always has
            raise
        return cls(raw=raw, body=body, client_messages=body["messages"])

    def check_messages(self, start: int = 0) -> None:
        """The rest of parsing: the messages from `start` on are well-formed and orjson can write them back.

        Run once the session is known: messages its memo knows were checked
        when they were new (both checks are about a message's value, and an
        equal message passes them equally), so only the new ones are looked at.
        """
        new = self.client_messages[start:]
        if not _messages_valid(new):
            check_chat_body(self.body)  # raises, naming the first bad message
        _check_writable({"messages": new})


def _check_writable(part: dict[str, Any]) -> None:
    """`part` sits at the body's own level, so orjson's depth limit applies to it as to the body."""
    try:
        jsonio.dumps(part)
    except orjson.JSONEncodeError:
        raise BadRequest(f"request body is nested deeper than {_MAX_DEPTH} levels", code="invalid_json") from None


_TYPES_CONTENT = frozenset({type(None), str, list})
_TYPES_PART = frozenset({dict, str})
_TYPES_OPTIONAL_STR = frozenset({type(None), str})
_TYPES_OPTIONAL_LIST = frozenset({type(None), list})
_TYPES_OPTIONAL_DICT = frozenset({type(None), dict})


def _types(values: Any) -> set[type]:
    return set(map(type, values))


def _of_type(values: list[Any], kind: type) -> list[Any]:
    return list(compress(values, map(operator.is_, map(type, values), repeat(kind))))


def _messages_valid(messages: list[Any]) -> bool:
    """True only if the per-message checks of check_chat_body all pass, decided with C-level maps.

    Validation is a pure function of each message, and walking 1,000 messages
    in Python costs more than the rest of a request; on False the ordinary
    loop runs and reports the first problem exactly as before.
    """
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
    if _types(chain.from_iterable(_of_type(contents, list))) - _TYPES_PART:
        return False
    if _types(map(get, messages, repeat("tool_call_id"))) - _TYPES_OPTIONAL_STR:
        return False
    calls = list(map(get, messages, repeat("tool_calls")))
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
