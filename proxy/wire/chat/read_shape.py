"""Chat Completions' shapes for the read-back loop (proxy/rewrite/context_read/loop.py).

A reply's calls are the one choice's `tool_calls`; the conversation goes on
with the assistant message and a `tool` message per call. Streamed, text
passes through as it arrives; the round's tool-call fragments, its finish,
usage and [DONE] chunks are held until it ends, since only then is it known
whether the proxy answers them (the client then never sees them) or the client
gets them, the proxy's calls removed and the client's renumbered from 0
(written by jsonio.dumps_any: a first round's chunk may nest past what orjson
writes safely).
A hidden round's chunks are rebuilt from their parsed data, never the
provider's bytes, and its repeated opening chunk is dropped.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.wire import jsonio
from proxy.wire.chat.reply import completion, delta
from proxy.wire.read_shape import BaseShape, Call, Reply
from proxy.wire.sse import DONE, is_usage_chunk


class ChatReadShape(BaseShape):
    """Chat chunks carry no numbering across rounds: the shape is its own stream state, each round afresh."""

    ends_with = "it finished"

    def is_ours(self, call: dict[str, Any]) -> bool:
        return (call.get("function") or {}).get("name") == self.tool

    def _reply(self, data: dict[str, Any], content: Any, calls: list[dict[str, Any]], usage: Any) -> Reply:
        ours = [c for c in calls if self.is_ours(c)]
        if not isinstance(content, (str, list)):
            content = None  # not the model's text
        return Reply(data, [Call(c.get("id"), (c.get("function") or {}).get("arguments") or "{}") for c in ours],
                     len(calls) - len(ours), [{"role": "assistant", "content": content, "tool_calls": calls}], usage)

    def reply(self, content: bytes) -> Reply:
        c = completion(content)
        reply = self._reply(c.data, c.message.get("content"), c.calls, c.data.get("usage"))
        reply.extra["completion"] = c
        return reply

    def without_ours(self, reply: Reply) -> dict[str, Any]:
        c = reply.extra["completion"]
        rest = [call for call in c.calls if not self.is_ours(call)]
        if rest:
            c.message["tool_calls"] = rest
        else:
            c.message.pop("tool_calls", None)
            if c.message.get("content") is None:
                c.message["content"] = ""
            if c.choice.get("finish_reason") == "tool_calls":
                c.choice["finish_reason"] = "stop"
        data: dict[str, Any] = c.data
        return data

    def stream_state(self) -> ChatReadShape:
        return self

    def round(self, hidden: bool) -> ChatRound:
        return ChatRound(self, hidden)


class ChatRound:
    def __init__(self, shape: ChatReadShape, hidden: bool) -> None:
        self.shape, self.hidden = shape, hidden
        self.finished = False
        self._held: list[tuple[bytes, Any]] = []  # tool-call, finish, usage and [DONE] chunks of this round
        self._calls: dict[int, dict[str, Any]] = {}
        self._text: list[str] = []

    def event(self, data: Any, raw: bytes) -> bytes:
        part = delta(data)
        ev = raw if not self.hidden else _rebuilt(data)
        if part is None:
            if data != DONE:
                return ev
            self.finished = True
            self._held.append((ev, data))
            return b""
        if part.calls or part.choice.get("finish_reason") or not part.choice:
            _gather(self._calls, part.calls)
            self.finished = self.finished or bool(part.choice.get("finish_reason"))
            self._held.append((ev, data))
            return b""
        if self.hidden and set(part.delta) <= {"role", "content"} and not part.delta.get("content"):
            return b""  # the repeated opening chunk of a follow-up round
        if isinstance(part.delta.get("content"), str):
            self._text.append(part.delta["content"])
        return ev

    @property
    def hid(self) -> bool:
        return False  # a first round hides nothing: its calls are held, relayed with the rest if it turns unreadable

    def held(self) -> list[bytes]:
        return [ev for ev, _ in self._held]

    def reply(self) -> Reply:
        usage = next((c["usage"] for _, c in self._held if is_usage_chunk(c)), None)
        calls = [self._calls[i] for i in sorted(self._calls)]
        return self.shape._reply({}, "".join(self._text) or None, calls, usage)

    def closing(self, reply: Reply, usage: Any) -> list[bytes]:
        ours = {i for i, c in self._calls.items() if self.shape.is_ours(c)}
        renumber = {i: n for n, i in enumerate(i for i in sorted(self._calls) if i not in ours)}
        out = []
        for ev, chunk in self._held:
            if is_usage_chunk(chunk) and usage is not None:
                ev = b"data: " + jsonio.dumps_any({**chunk, "usage": usage}) + b"\n\n"
            part = delta(chunk)  # held chunks were checked when they arrived
            if not ours or part is None or not part.choice:
                out.append(ev)
                continue
            if part.calls:
                kept = [{**tc, "index": renumber[tc.get("index") or 0]} for tc in part.calls
                        if (tc.get("index") or 0) not in ours]
                if not kept and not part.delta.get("content") and not part.choice.get("finish_reason"):
                    continue
                part.delta["tool_calls"] = kept
                if not kept:
                    part.delta.pop("tool_calls")
            if part.choice.get("finish_reason") == "tool_calls" and not renumber:
                part.choice["finish_reason"] = "stop"
            out.append(b"data: " + jsonio.dumps_any(chunk, len(ev)) + b"\n\n")
        return out


def _gather(calls: dict[int, dict[str, Any]], fragments: list[dict[str, Any]]) -> None:
    """Join streamed tool-call fragments (already checked: strings or null) into whole calls by index."""
    for tc in fragments:
        slot = calls.setdefault(tc.get("index") or 0, {"id": None, "type": "function",
                                                       "function": {"name": "", "arguments": ""}})
        slot["id"] = tc.get("id") or slot["id"]
        fn = tc.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""


def _rebuilt(data: Any) -> bytes:
    """A hidden round's chunk as the client gets it: one clean `data:` line from its parsed data."""
    return b"data: [DONE]\n\n" if data == DONE else b"data: " + orjson.dumps(data) + b"\n\n"
