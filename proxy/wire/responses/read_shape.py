"""The Responses API's shapes for the read-back loop (proxy/rewrite/context_read/loop.py).

A reply's calls are its `function_call` and `custom_tool_call` output items;
the conversation goes on with the round's output items and the proxy's
`function_call_output`s (appended to the input or, where the provider holds
the history, sent after the response's id). Streamed, the client gets one
valid event stream: one `response.created`, the proxy's call items dropped,
`output_index` and `sequence_number` renumbered to stay consecutive over the
rounds, and one terminal event whose `output` lists what the client was shown
(never the proxy's calls, whether or not their `output_item.done` came) and
whose `usage` covers every round.

No event whose item is the proxy's call is passed on. In a first round an
item that is not an object (null, a string) is the client's to judge, and the
`output_item.done` of the proxy's call may carry anything: its call is known
from its `output_item.added` (and the terminal event's `output`), so the round
goes on and the call is answered. In a hidden round either is refused.
"""

from __future__ import annotations

from typing import Any

from proxy.wire import jsonio
from proxy.wire.codec import Body, Item
from proxy.wire.read_shape import BaseShape, Call, IllFormed, Reply, int_or_none, loaded, provider_error
from proxy.wire.responses.stream import TERMINAL
from proxy.wire.sse import named_event, plain_name

_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})
_CALL_TYPES = frozenset({"function_call", "custom_tool_call"})


def _type(item: Any) -> str | None:
    kind = item.get("type") if isinstance(item, dict) else None
    return kind if isinstance(kind, str) else None


class ResponsesReadShape(BaseShape):
    ends_with = "response.completed"

    def is_ours(self, item: Any) -> bool:
        """A call of the read tool the proxy can answer (one without a string call_id could not be); a call in a
        `namespace` is of a client's tool of that namespace, whatever its name."""
        return _type(item) == "function_call" and item.get("name") == self.tool \
            and isinstance(item.get("call_id"), str) and not item.get("namespace")

    def calls(self, output: list[Any]) -> int:
        return sum(1 for it in output if _type(it) in _CALL_TYPES)

    def ours_of(self, items: list[Any]) -> list[Call]:
        return [Call(it["call_id"], it["arguments"] if isinstance(it.get("arguments"), str) else "{}")
                for it in items if self.is_ours(it)]

    def reply(self, content: bytes) -> Reply:
        data = loaded(content)
        if not isinstance(data, dict) or not isinstance(data.get("output"), list):
            raise IllFormed("not a response object")
        output = data["output"]
        ours = self.ours_of(output)
        return Reply(data, ours, self.calls(output) - len(ours), list(output), data.get("usage"), data.get("id"))

    def without_ours(self, reply: Reply) -> dict[str, Any]:
        reply.data["output"] = [it for it in reply.data["output"] if not self.is_ours(it)]
        return reply.data

    def continued(self, body: Body, items: list[Item], new: list[Item], reply: Reply) -> Body:
        if body.get("previous_response_id") or body.get("conversation"):
            body["input"] = new[len(reply.items):]  # the provider holds the history: the proxy's results only
            if not body.get("conversation"):
                body["previous_response_id"] = reply.id
        else:
            body["input"] = items
        return body

    def is_error_event(self, data: dict[str, Any]) -> bool:
        return data.get("type") == "error" or provider_error(data) is not None

    def stream_state(self) -> ResponsesStream:
        return ResponsesStream(self)


class ResponsesStream:
    """Output indexes and sequence numbers as the client sees them across all rounds."""

    def __init__(self, shape: ResponsesReadShape) -> None:
        self.shape = shape
        self.seq = 0
        self.next_index = 0
        self.shown: list[Any] = []  # output items the client was shown, in its order

    def round(self, hidden: bool) -> ResponsesRound:
        return ResponsesRound(self, hidden)

    def renumbered(self, ev: bytes, kind: str, data: dict[str, Any], index: int | None = None) -> bytes:
        """The event with the next sequence number (and the client's output index); its bytes if unchanged."""
        seq, idx = data.get("sequence_number"), int_or_none(data.get("output_index"))
        new_idx = index if index is not None else idx
        has_seq = isinstance(seq, int) and not isinstance(seq, bool)
        changed = (has_seq and seq != self.seq) or new_idx != idx
        if has_seq:
            self.seq += 1
        if not changed:
            return ev
        data = dict(data)
        if has_seq:
            data["sequence_number"] = self.seq - 1
        if idx is not None:
            data["output_index"] = new_idx
        return named_event(kind, jsonio.dumps_any(data, len(ev)))


class ResponsesRound:
    def __init__(self, stream: ResponsesStream, hidden: bool) -> None:
        self.stream, self.shape, self.hidden = stream, stream.shape, hidden
        self.finished = False
        self.terminal: dict[str, Any] = {}
        self.terminal_raw = b""
        self.index: dict[int, int] = {}  # this round's provider output_index -> the client's
        self.dropped: set[int] = set()  # this round's output indexes of the proxy's own calls
        self.ours: list[Any] = []  # the proxy's call items, as their output_item.done gave them
        self.added: dict[int, Any] = {}  # the proxy's call items, as their output_item.added gave them
        self.calling: set[int] = set()  # this round's output indexes of calls (the proxy's and the client's)
        self.shown_from = len(stream.shown)  # where this round's items start in what the client was shown

    def event(self, data: Any, raw: bytes) -> bytes:
        kind = _type(data)
        if kind is None:
            if self.hidden:
                raise IllFormed("an event without a type")
            return raw  # data the API does not define: the client's to judge
        if self.hidden and not plain_name(kind):
            raise IllFormed("an event type that is not a plain name")
        if kind in TERMINAL:
            self.terminal, self.terminal_raw, self.finished = data, raw, True
            return b""
        if self.hidden and kind in _OPENING:
            return b""
        idx = int_or_none(data.get("output_index"))
        if kind == "response.output_item.added" and idx is not None:
            item = self._item(data)
            if self.shape.is_ours(item):
                self.dropped.add(idx)
                self.added[idx] = item
            else:
                self.index[idx] = self.stream.next_index
                self.stream.next_index += 1
            if _type(item) in _CALL_TYPES:
                self.calling.add(idx)
        if idx is not None and idx in self.dropped:
            if kind == "response.output_item.done":
                item = data.get("item")
                if not self.shape.is_ours(item):
                    if self.hidden:
                        raise IllFormed("the proxy's call item changed at its end")
                    item = self.added[idx]  # the call as it was announced; the terminal's output has the last word
                self.ours.append(item)
            return b""
        if kind == "response.output_item.done" and idx is not None:
            item = self._item(data)
            if self.shape.is_ours(item):  # announced as something else (or nothing): never shown all the same
                if self.hidden:
                    raise IllFormed("an output item that became the proxy's call at its end")
                self.ours.append(item)
                self.calling.add(idx)
                return b""
            if item is not None:
                self.stream.shown.append(item)
        return self.stream.renumbered(raw, kind, data, self.index.get(idx) if idx is not None else None)

    @property
    def hid(self) -> bool:
        return bool(self.dropped or self.ours)

    def _item(self, data: dict[str, Any]) -> dict[str, Any] | None:
        """An event's output item: in a hidden round an object of a named type (else IllFormed); in a first one
        whatever came, None if it is not an object (the event is the client's to judge)."""
        item = data.get("item")
        if not isinstance(item, dict) or (self.hidden and _type(item) is None):
            if self.hidden:
                raise IllFormed("an output item that is not an object of a named type")
            return None
        return item

    def held(self) -> list[bytes]:
        return []  # nothing is held but the terminal event, which has not come when this is asked

    def _response(self) -> dict[str, Any]:
        found = self.terminal.get("response")
        return found if isinstance(found, dict) else {}

    def _listed(self) -> list[Any] | None:
        output = self._response().get("output")
        return output if isinstance(output, list) else None

    def reply(self) -> Reply:
        response, listed = self._response(), self._listed()
        output = listed if listed is not None else self.ours
        ours = self.shape.ours_of(output)
        calls = self.shape.calls(listed) if listed is not None else len(self.calling)
        return Reply(response, ours, calls - len(ours), list(output), response.get("usage"), response.get("id"),
                     done=self.terminal.get("type") == "response.completed")

    def closing(self, reply: Reply, usage: Any) -> list[bytes]:
        terminal, kind = self.terminal, str(self.terminal.get("type"))
        if self.hidden or self.dropped or reply.ours or usage is not None:
            listed = self._listed()
            mine = [it for it in listed if not self.shape.is_ours(it)] if listed is not None \
                else self.stream.shown[self.shown_from:]
            response = {**self._response(), "output": [*self.stream.shown[:self.shown_from], *mine]}
            if usage is not None:
                response["usage"] = usage
            terminal = {**terminal, "response": response}
            seq = terminal.get("sequence_number")
            if isinstance(seq, int) and not isinstance(seq, bool):
                terminal["sequence_number"] = self.stream.seq
            self.stream.seq += 1
            return [named_event(kind, jsonio.dumps_any(terminal))]
        return [self.stream.renumbered(self.terminal_raw, kind, terminal)]
