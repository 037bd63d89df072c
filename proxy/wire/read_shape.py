"""What the one read-back loop needs to know of an API: the shapes of a reply, a continuation and a stream.

The hidden `context_read` rounds are run once, for every API, by
proxy/rewrite/context_read/loop.py (it counts rounds, applies the failure
policy, sums usage, handles cut streams and provider errors). A codec supplies
only this narrow, typed shape (no I/O, no store, no upstream client):

- `ReadShape.reply`: the calls in a non-streamed reply, which of them are the
  proxy's, and the items that continue the conversation after it;
- `ReadShape.without_ours`: the reply the client gets, the proxy's calls removed;
- `ReadShape.continued`: the next request's body;
- `ReadShape.stream_state`: a classifier for stream events with its
  renumbering rule, kept across rounds so the client sees one valid stream.

A reply or event the shape cannot read raises `IllFormed`; the loop then
relays a first answer as it came (unless the round already hid the proxy's
call: then it ends the stream with an error) and refuses a hidden one with
`HiddenRoundFailed`, which carries none of the provider's bytes. What a shape
rewrites of a provider's answer it writes with `jsonio.dumps_any`: the answer
may nest deeper than orjson writes safely.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from proxy.errors import UpstreamUnreachable, anthropic_error_body
from proxy.wire import jsonio
from proxy.wire.values import Body, Item

_MESSAGE_MAX_CHARS = 2000  # of a provider's error message repeated in ours


class IllFormed(ValueError):
    """A reply or event that claims the API's shape but breaks it; the message says where."""


class HiddenRoundFailed(UpstreamUnreachable):
    """The answer to a hidden read-back round was unusable: the client gets this instead of the provider's bytes.

    Status: the provider's own when it sent an error status, else 502 (it said
    200 but sent something the proxy cannot pass on).
    """

    code = "upstream_bad_response"

    def __init__(self, message: str, *, status: int = 502, type_: str | None = None, code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message, param=param, code=code)
        self.status = status if status >= 400 else 502
        if type_ is not None:
            self.type = type_

    def anthropic_body(self) -> bytes:
        """The provider's own error type when it is Anthropic's: an `overloaded_error` event in a hidden round
        reaches the client as `overloaded_error` (how a client tells a busy API from a failed one), not as
        the generic type of the status."""
        return anthropic_error_body(self.message, self.status, self.type)


def provider_error(data: Any) -> dict[str, Any] | None:
    """The provider's own `error` object (OpenAI's and Anthropic's bodies both nest it so), if `data` is one."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict) and isinstance(data["error"].get("message"), str):
        error: dict[str, Any] = data["error"]
        return error
    return None


def _error_of(content: bytes) -> dict[str, Any] | None:
    try:
        return provider_error(orjson.loads(content))
    except orjson.JSONDecodeError:
        return None


def is_error_body(content: bytes) -> bool:
    """Whether an error status came with the provider's error object (a hidden round's is then passed on)."""
    return _error_of(content) is not None


def hidden_failure(status: int, content: bytes, content_type: str, why: str) -> HiddenRoundFailed:
    """The error for an unusable answer to a hidden round: the provider's message if it sent one, else ours."""
    err = _error_of(content)
    if err is not None:
        def text(k: str) -> str | None:
            return err[k] if isinstance(err.get(k), str) else None
        return HiddenRoundFailed(err["message"][:_MESSAGE_MAX_CHARS], status=status, type_=text("type"),
                                 code=text("code"), param=text("param"))
    return HiddenRoundFailed(f"the provider's answer to the proxy's hidden context_read round was unusable "
                             f"(HTTP {status}, content-type {content_type[:100] or 'none'}: {why}); "
                             f"nothing of it was passed on", status=status)


def loaded(content: bytes) -> Any:
    """A non-streamed reply's JSON (integers of any size exact); IllFormed if it is not JSON."""
    try:
        return jsonio.loads(content)
    except ValueError:
        raise IllFormed("not JSON") from None


def int_or_none(v: Any) -> int | None:
    """An index the provider sent, if it is an integer (a bool is not)."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def call_arguments(args: Any) -> str:
    """A call's arguments (an object) as JSON text; "" (answered as bad arguments) if no JSON writer takes them
    (nested too deep)."""
    if jsonio.deeper_than(args):
        return ""
    try:
        return jsonio.dumps(args if isinstance(args, dict) else {}).decode()
    except (TypeError, ValueError, RecursionError):
        return ""


@dataclass(frozen=True, slots=True)
class Call:
    """One call of the proxy's read tool in a reply: the id its result must name and its JSON arguments."""

    id: str | None
    arguments: str


@dataclass
class Reply:
    """One round's answer as the loop sees it."""

    data: dict[str, Any]  # the reply object (non-streamed: the body; streamed: what the events said)
    ours: list[Call]  # the proxy's read calls
    others: int  # calls the client must run
    items: list[Item]  # the round's output as items that continue the conversation
    usage: Any = None  # this call's usage object as the provider spelled it
    id: Any = None  # the provider's id of the answer (where it can be continued from)
    done: bool = True  # the answer finished normally (a round may follow it)
    extra: dict[str, Any] = field(default_factory=dict)  # what the shape keeps for itself


class StreamRound(Protocol):
    """One round's events: what the client gets of each, and what the round said once it ended."""

    finished: bool  # the round's terminal event came

    @property
    def hid(self) -> bool:
        """Whether the client was kept from some of the round's events already (the proxy's call's): the round
        can no longer be relayed as it came, since what followed would show the call."""
        ...

    def event(self, data: Any, raw: bytes) -> bytes:
        """The client's bytes for one event now (b"": held or dropped); `data` is its parsed JSON (a dict,
        or b"[DONE]"). IllFormed if the event cannot be read: a first round is then relayed untouched."""
        ...

    def held(self) -> list[bytes]:
        """The provider's bytes of the events held so far (relayed as they came if the round turns unreadable)."""
        ...

    def reply(self) -> Reply:
        """The ended round as a reply: its calls, its continuation, its usage."""
        ...

    def closing(self, reply: Reply, usage: Any) -> list[bytes]:
        """The events that end the client's stream: the held ones, the proxy's calls removed, `usage` (every
        round's, summed; None: nothing was hidden) in the final usage."""
        ...


class StreamState(Protocol):
    """A stream's numbering across rounds (indexes, sequence numbers, what the client was shown)."""

    def round(self, hidden: bool) -> StreamRound: ...


class ReadShape(Protocol):
    """An API's shapes for the read-back loop, for one request (the read tool's name known)."""

    ends_with: str  # what ends a whole stream, for the error when a stream stops before it
    usage_field: str  # where a reply carries its usage ("usage"; Gemini's "usageMetadata")

    def reply(self, content: bytes) -> Reply:
        """A non-streamed 200 answer; IllFormed unless every part the loop reads has its documented type."""
        ...

    def without_ours(self, reply: Reply) -> dict[str, Any]:
        """The reply the client gets: the proxy's calls removed, the stop reason they call for."""
        ...

    def continued(self, body: Body, items: list[Item], new: list[Item], reply: Reply) -> Body:
        """The next request: `items` (every item so far, `new` the last round's output and results)."""
        ...

    def is_error_event(self, data: dict[str, Any]) -> bool:
        """Whether a stream event is the provider's error (the end of its stream)."""
        ...

    def stream_state(self) -> StreamState: ...


class BaseShape:
    """What the four APIs' shapes share: the read tool's name, the next request written by the codec as any
    request is, the provider's error object as the error event; an API whose own differ overrides them."""

    usage_field = "usage"

    def __init__(self, codec: Any, tool: str) -> None:  # the request's Codec (wire/codec.py imports this module)
        self.codec, self.tool = codec, tool

    def continued(self, body: Body, items: list[Item], new: list[Item], reply: Reply) -> Body:
        self.codec.set_items(body, items)
        rendered: Body = self.codec.render(body)
        return rendered

    def is_error_event(self, data: dict[str, Any]) -> bool:
        return provider_error(data) is not None
