"""Anthropic Messages' shapes for the read-back loop (proxy/rewrite/context_read/loop.py).

A reply's calls are its `tool_use` blocks; the conversation goes on with the
answer's content as an assistant turn (thinking blocks and their signatures
included, as the API requires) and the proxy's `tool_result`s as the next
user turn. Streamed, the client gets one valid event stream: one
`message_start`, every block of every round with consecutive indexes, the
proxy's `tool_use` blocks never shown, one `message_delta` whose usage covers
every round (cumulative, as the API reports it), one `message_stop`.

A read call whose input cannot be written back (nested past jsonio.SAFE_DEPTH)
is answered as one whose streamed input is garbled: the model is told its
arguments were unusable, and the assistant turn sent back carries the call with
an empty input.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.wire import jsonio
from proxy.wire.read_shape import BaseShape, Call, IllFormed, Reply, call_arguments, int_or_none, loaded
from proxy.wire.sse import named_event, plain_name


class MessagesReadShape(BaseShape):
    ends_with = "message_stop"

    def is_ours(self, block: Any) -> bool:
        """A call of the read tool the proxy can answer: one without a string id could not be (its tool_result
        would be refused), so it is left to the client, as any reply the loop cannot read."""
        return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == self.tool \
            and isinstance(block.get("id"), str)

    def _reply(self, data: dict[str, Any], content: list[Any], usage: Any) -> Reply:
        ours, sent = [], []  # sent: the content as the next round carries it back
        for b in content:
            if self.is_ours(b):
                ours.append(Call(b["id"], call_arguments(b.get("input"))))
                if not ours[-1].arguments:  # unwritable input: answered as bad arguments, sent back empty
                    b = {**b, "input": {}}
            sent.append(b)
        calls = sum(1 for b in content if isinstance(b, dict) and b.get("type") == "tool_use")
        return Reply(data, ours, calls - len(ours), [{"role": "assistant", "content": sent}], usage)

    def reply(self, content: bytes) -> Reply:
        data = loaded(content)
        if not isinstance(data, dict) or data.get("type") != "message" or not isinstance(data.get("content"), list):
            raise IllFormed("not a message object")
        return self._reply(data, data["content"], data.get("usage"))

    def without_ours(self, reply: Reply) -> dict[str, Any]:
        data = reply.data
        data["content"] = [b for b in data["content"] if not self.is_ours(b)]
        if reply.others == 0 and data.get("stop_reason") == "tool_use":
            data["stop_reason"] = "end_turn"
        return data

    def is_error_event(self, data: dict[str, Any]) -> bool:
        return data.get("type") == "error"

    def stream_state(self) -> MessagesStream:
        return MessagesStream(self)


class MessagesStream:
    """Block indexes as the client sees them across all rounds."""

    def __init__(self, shape: MessagesReadShape) -> None:
        self.shape = shape
        self.shown = 0  # blocks the client has been given, over all rounds

    def round(self, hidden: bool) -> MessagesRound:
        return MessagesRound(self, hidden)


class _Block:
    """One content block rebuilt from its events: what the next round must send back as the assistant's."""

    def __init__(self, start: dict[str, Any]) -> None:
        self.block = dict(start)
        self.json = ""

    def add(self, delta: dict[str, Any]) -> None:
        kind, b = delta.get("type"), self.block
        if kind == "text_delta":
            b["text"] = str(b.get("text") or "") + str(delta.get("text") or "")
        elif kind == "input_json_delta":
            self.json += str(delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            b["thinking"] = str(b.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            b["signature"] = delta.get("signature")
        elif kind == "citations_delta":
            b["citations"] = [*(b.get("citations") or []), delta.get("citation")]

    def done(self) -> dict[str, Any]:
        if self.block.get("type") in ("tool_use", "server_tool_use") and self.json:
            try:
                self.block["input"] = orjson.loads(self.json)
            except orjson.JSONDecodeError:
                self.block["input"] = {}
        return self.block


class MessagesRound:
    def __init__(self, stream: MessagesStream, hidden: bool) -> None:
        self.stream, self.shape, self.hidden = stream, stream.shape, hidden
        self.finished = False
        self.blocks: dict[int, _Block] = {}
        self.ours: set[int] = set()
        self.index: dict[int, int] = {}  # the provider's block index -> the client's
        self.usage: dict[str, Any] = {}
        self.delta: dict[str, Any] | None = None  # the held message_delta
        self.delta_event = b""  # ... as the provider sent it
        self.stop = b""  # the held message_stop

    def event(self, data: Any, raw: bytes) -> bytes:
        kind = data.get("type") if isinstance(data, dict) else None
        if not isinstance(kind, str):
            if self.hidden:
                raise IllFormed("an event without a type")
            return raw
        if self.hidden and not plain_name(kind):
            raise IllFormed("an event type that is not a plain name")
        if self.hidden and kind.startswith("content_block_") and not self._well_formed(kind, data):
            raise IllFormed(f"an ill-formed {kind} event")
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict) and isinstance(message.get("usage"), dict):
                self.usage = dict(message["usage"])
            return b"" if self.hidden else raw
        if kind == "message_delta":
            self.delta, self.delta_event = data, raw
            if isinstance(data.get("usage"), dict):
                self.usage.update(data["usage"])
            return b""
        if kind == "message_stop":
            self.stop, self.finished = raw, True
            return b""
        idx = int_or_none(data.get("index"))
        if not kind.startswith("content_block_") or idx is None:
            return b"" if self.hidden and kind == "ping" else raw
        if kind == "content_block_start":
            block = data.get("content_block")
            self.blocks[idx] = _Block(block if isinstance(block, dict) else {})
            if self.shape.is_ours(block):
                self.ours.add(idx)
            else:
                self.index[idx] = self.stream.shown
                self.stream.shown += 1
        elif kind == "content_block_delta" and idx in self.blocks and isinstance(data.get("delta"), dict):
            self.blocks[idx].add(data["delta"])
        if idx in self.ours:
            return b""
        new = self.index.get(idx, idx)
        return raw if new == idx else named_event(kind, jsonio.dumps_any({**data, "index": new}, len(raw)))

    @property
    def hid(self) -> bool:
        return bool(self.ours)

    def _well_formed(self, kind: str, data: dict[str, Any]) -> bool:
        """A content block event whose parts have their documented types, of a block that was started (or starts
        one): in a hidden round nothing else is passed to the client."""
        idx = int_or_none(data.get("index"))
        if idx is None:
            return False
        if kind == "content_block_start":
            return isinstance(data.get("content_block"), dict)
        if idx not in self.blocks:
            return False
        return kind != "content_block_delta" or isinstance(data.get("delta"), dict)

    def held(self) -> list[bytes]:
        return [ev for ev in (self.delta_event, self.stop) if ev]

    def reply(self) -> Reply:
        return self.shape._reply({}, [self.blocks[i].done() for i in sorted(self.blocks)], self.usage)

    def closing(self, reply: Reply, usage: Any) -> list[bytes]:
        """The round's message_delta with the stop reason the client's blocks call for and every round's usage."""
        if not self.ours and usage is None and self.delta_event:
            return [self.delta_event, self.stop]  # nothing hidden: the provider's bytes
        data = dict(self.delta or {"type": "message_delta",
                                   "delta": {"stop_reason": "end_turn", "stop_sequence": None}})
        delta = data.get("delta")
        if self.ours and not reply.others and isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
            data["delta"] = {**delta, "stop_reason": "end_turn"}
        if usage is not None:
            data["usage"] = usage
        return [named_event("message_delta", jsonio.dumps_any(data)), self.stop]
