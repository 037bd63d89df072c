"""Answering the proxy-owned read-back tool without the client ever seeing it.

When the model calls `context_read`, the proxy reads the store, appends the
call and its result, and asks the provider again, up to `max_rounds`; the
client gets only the final answer, streamed or not. When the model calls
`context_read` together with client tools, the proxy's calls are removed from
the answer and the client receives its own tool calls only (renumbered): a
valid response, the client runs its tools, and the model may read again on
the next turn. After the last round the proxy's calls are removed the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson

from proxy.archive import Archive
from proxy.conversation import Conversation, ReadTool
from proxy.errors import ProxyError
from proxy.readback import answer
from proxy.sse import event_data, is_usage_chunk, split_events
from proxy.usage import Usage, parse_usage, usage_of_body
from proxy.upstream import iter_raw, read_body

Send = Callable[[bytes], Awaitable[httpx.Response]]


class Rounds:
    """Builds the follow-up requests of one client request; counts what it did."""

    def __init__(self, conv: Conversation, tool: ReadTool, archive: Archive) -> None:
        self.conv, self.tool, self.archive = conv, tool, archive
        self.style = conv.style
        self.messages = list(conv.messages)
        self.done = 0  # rounds answered by the proxy
        self.own: Usage | None = None  # usage of the provider calls the client never saw

    def add_own(self, usage: Usage | None) -> None:
        if usage is not None:
            self.own = usage if self.own is None else self.own + usage

    @property
    def last(self) -> bool:
        return self.done >= self.tool.max_rounds

    def is_ours(self, call: dict[str, Any]) -> bool:
        return (call.get("function") or {}).get("name") == self.tool.name

    async def next_body(self, content: str | None, calls: list[dict[str, Any]]) -> bytes:
        """Append the model's read calls and the proxy's answers; the next request's bytes."""
        self.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        for call in calls:
            result = await answer(self.archive, (call.get("function") or {}).get("arguments") or "{}",
                                  self.tool.max_chars)
            self.messages.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
        self.done += 1
        body = {**self.conv.body, "messages": self.messages}
        return self.style.dumps(body)


def _strip_ours(message: dict[str, Any], rounds: Rounds) -> bool:
    """Remove the proxy's calls from a final message; True if client calls remain."""
    rest = [c for c in message.get("tool_calls") or [] if not rounds.is_ours(c)]
    if rest:
        message["tool_calls"] = rest
    else:
        message.pop("tool_calls", None)
        if message.get("content") is None:
            message["content"] = ""
    return bool(rest)


async def complete(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> tuple[httpx.Response, bytes]:
    """Non-streaming: the final response and its body."""
    resp = first
    while True:
        content = await read_body(resp, url)
        if resp.status_code != 200:
            return resp, content
        try:
            data = orjson.loads(content)
            choice = data["choices"][0] if len(data["choices"]) == 1 else None
            message = choice["message"] if choice else None
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
            return resp, content
        calls = (message or {}).get("tool_calls") or []
        ours = [c for c in calls if rounds.is_ours(c)]
        if not ours:
            return resp, content
        if len(ours) == len(calls) and not rounds.last:
            rounds.add_own(usage_of_body(data))
            resp = await send(await rounds.next_body(message.get("content"), ours))
            continue
        if not _strip_ours(message, rounds) and choice.get("finish_reason") == "tool_calls":
            choice["finish_reason"] = "stop"
        return resp, orjson.dumps(data)


def _delta(chunk: Any) -> dict[str, Any] | None:
    if isinstance(chunk, dict) and isinstance(chunk.get("choices"), list) and len(chunk["choices"]) == 1:
        return chunk["choices"][0]
    return None


async def stream(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> AsyncIterator[bytes]:
    """Streaming: content passes through as it arrives; tool-call chunks are held until the end of a round."""
    resp = first
    while True:
        held: list[tuple[bytes, Any]] = []  # tool-call, finish, usage and [DONE] events of this round
        calls: dict[int, dict[str, Any]] = {}
        text: list[str] = []
        buffer = bytearray()
        async for raw in iter_raw(resp, url):
            buffer += raw.replace(b"\r\n", b"\n")
            for ev in split_events(buffer):
                chunk = event_data(ev)
                choice = _delta(chunk)
                delta = (choice or {}).get("delta") or {}
                if delta.get("tool_calls") or (choice and choice.get("finish_reason")) or chunk == b"[DONE]" \
                        or (isinstance(chunk, dict) and chunk.get("choices") == []):
                    for tc in delta.get("tool_calls") or ():
                        slot = calls.setdefault(tc.get("index", 0), {"id": None, "type": "function",
                                                                     "function": {"name": "", "arguments": ""}})
                        slot["id"] = tc.get("id") or slot["id"]
                        fn = tc.get("function") or {}
                        slot["function"]["name"] += fn.get("name") or ""
                        slot["function"]["arguments"] += fn.get("arguments") or ""
                    held.append((ev, chunk))
                    continue
                if rounds.done and set(delta) <= {"role", "content"} and not delta.get("content"):
                    continue  # the repeated opening chunk of a follow-up round
                if isinstance(delta.get("content"), str):
                    text.append(delta["content"])
                yield ev
        if buffer:
            held.append((bytes(buffer), None))
        ours = {i for i, c in calls.items() if rounds.is_ours(c)}
        if not ours:
            for ev, _ in held:
                yield ev
            return
        if len(ours) == len(calls) and not rounds.last:
            for _, chunk in held:
                if is_usage_chunk(chunk):
                    rounds.add_own(parse_usage(chunk["usage"]))
            body = await rounds.next_body("".join(text) or None, [calls[i] for i in sorted(calls)])
            try:
                resp = await send(body)
            except ProxyError as err:
                yield b"data: " + err.body() + b"\n\n"
                return
            if resp.status_code != 200:
                content = await read_body(resp, url)
                yield b"data: " + content + b"\n\n"
                return
            continue
        for ev in _without_ours(held, ours, calls):
            yield ev
        return


def _without_ours(held: list[tuple[bytes, Any]], ours: set[int], calls: dict[int, Any]) -> list[bytes]:
    """Held events with the proxy's tool-call deltas removed and the client's renumbered from 0."""
    renumber = {i: n for n, i in enumerate(i for i in sorted(calls) if i not in ours)}
    out = []
    for ev, chunk in held:
        choice = _delta(chunk)
        if choice is None:
            out.append(ev)
            continue
        delta = choice.get("delta") or {}
        if delta.get("tool_calls"):
            kept = [{**tc, "index": renumber[tc.get("index", 0)]} for tc in delta["tool_calls"]
                    if tc.get("index", 0) not in ours]
            if not kept and not delta.get("content") and not choice.get("finish_reason"):
                continue
            delta["tool_calls"] = kept
            if not kept:
                delta.pop("tool_calls")
        if choice.get("finish_reason") == "tool_calls" and not renumber:
            choice["finish_reason"] = "stop"
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return out
