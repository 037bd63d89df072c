"""Answering the proxy-owned read-back tool without the client ever seeing it.

When the model calls `context_read`, the proxy reads the store, appends the
call and its result, and asks the provider again, up to `max_rounds`; the
client gets only the final answer, streamed or not. When the model calls
`context_read` together with client tools, the proxy's calls are removed from
the answer and the client receives its own tool calls only (renumbered): a
valid response, the client runs its tools, and the model may read again on
the next turn. After the last round the proxy's calls are removed the same way.

Whatever the provider answers, the loop acts only on replies of the documented
shape (proxy/wire/chat/reply.py). Any other first reply reaches the client exactly
as the provider sent it; an unusable answer to a hidden round (error status,
not JSON, ill-formed, transport failure) raises a ProxyError, which the client
gets as one OpenAI-shaped error - a JSON body, or one SSE error event that ends
the stream - never with the provider's bytes spliced in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson

from proxy.request import Conversation, ReadTool
from proxy.rewrite.context_read.tool import answer
from proxy.store.archive import Archive
from proxy.upstream.client import iter_raw, read_body
from proxy.wire.chat import reply as shape
from proxy.wire.chat.reply import IllFormed, hidden_failure
from proxy.wire.sse import DONE, event_data, event_payload, is_usage_chunk, split_events
from proxy.wire.usage import Usage, parse_usage, usage_of_body

Send = Callable[[bytes], Awaitable[httpx.Response]]


class Rounds:
    """Builds the follow-up requests of one client request; counts what it did."""

    def __init__(self, conv: Conversation, tool: ReadTool, archive: Archive) -> None:
        self.conv, self.tool, self.archive = conv, tool, archive
        self.style = conv.style
        self.messages = list(conv.messages)
        self.done = 0  # rounds answered by the proxy
        self.own: Usage | None = None  # usage of the provider calls the client never saw
        self.usages: list[Usage] = []  # each of those calls' usage, as reported (summed for the client)

    def add_own(self, usage: Usage | None) -> None:
        if usage is not None:
            self.own = usage if self.own is None else self.own + usage
            self.usages.append(usage)

    @property
    def last(self) -> bool:
        return self.done >= self.tool.max_rounds

    def is_ours(self, call: dict[str, Any]) -> bool:
        return (call.get("function") or {}).get("name") == self.tool.name

    async def next_body(self, content: Any, calls: list[dict[str, Any]]) -> bytes:
        """Append the model's read calls and the proxy's answers; the next request's bytes.

        `content` of any other type than a string or a list of parts is not the model's text: sent as null.
        """
        if not isinstance(content, (str, list)):
            content = None
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
    """Non-streaming: the final response and its body.

    A first reply the loop cannot read is returned as it came; an unusable answer to
    a hidden round raises HiddenRoundFailed (a provider's own JSON error is relayed).
    """
    resp = first
    while True:
        content = await read_body(resp, url)
        hidden = rounds.done > 0
        if resp.status_code != 200:
            if hidden and not _is_error_body(content):
                raise hidden_failure(resp.status_code, content, resp.headers.get("content-type", ""),
                                     "an error status without an OpenAI error body")
            return resp, content
        try:
            reply = shape.completion(content)
        except IllFormed as bad:
            if hidden:
                raise hidden_failure(resp.status_code, content, resp.headers.get("content-type", ""),
                                     str(bad)) from None
            return resp, content
        ours = [c for c in reply.calls if rounds.is_ours(c)]
        if not ours:
            return resp, content
        if len(ours) == len(reply.calls) and not rounds.last:
            rounds.add_own(usage_of_body(reply.data))
            resp = await send(await rounds.next_body(reply.message.get("content"), ours))
            continue
        if not _strip_ours(reply.message, rounds) and reply.choice.get("finish_reason") == "tool_calls":
            reply.choice["finish_reason"] = "stop"
        return resp, orjson.dumps(reply.data)


def _is_error_body(content: bytes) -> bool:
    try:
        return shape.provider_error(orjson.loads(content)) is not None
    except orjson.JSONDecodeError:
        return False


async def _check_hidden(resp: httpx.Response, url: str) -> None:
    """A hidden round's streamed answer must be a 200 event stream; anything else is read and refused."""
    ctype = resp.headers.get("content-type", "")
    if resp.status_code == 200 and ctype.startswith("text/event-stream"):
        return
    content = await read_body(resp, url)
    why = "not an event stream" if resp.status_code == 200 else "an error status"
    raise hidden_failure(resp.status_code, content, ctype, why)


def _hidden_event(ev: bytes, chunk: Any) -> bytes:
    """An event of a hidden round as the client gets it: rebuilt from its parsed data, or nothing.

    Rebuilt, never the provider's bytes: a well-formed chunk is one clean `data:` line.
    Events without data (comments, keep-alives) are dropped; anything else is refused.
    """
    if chunk == DONE:
        return b"data: [DONE]\n\n"
    if chunk is None:
        if event_payload(ev):
            raise hidden_failure(200, b"", "text/event-stream", "an event whose data is not JSON")
        return b""
    if shape.provider_error(chunk) is not None:
        raise hidden_failure(200, orjson.dumps(chunk), "text/event-stream", "an error event")
    if not isinstance(chunk, dict):
        raise hidden_failure(200, b"", "text/event-stream", "an event whose data is not a JSON object")
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def stream(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> AsyncIterator[bytes]:
    """Streaming: content passes through as it arrives; tool-call chunks are held until the end of a round.

    A first round with an ill-formed chat chunk is relayed from there on exactly as
    the provider sends it; a hidden round that fails raises (ProxyError), so the
    caller ends the stream with one error event and none of the provider's bytes.
    """
    resp = first
    while True:
        hidden = rounds.done > 0
        if hidden:
            await _check_hidden(resp, url)
        held: list[tuple[bytes, Any]] = []  # tool-call, finish, usage and [DONE] events of this round
        calls: dict[int, dict[str, Any]] = {}
        text: list[str] = []
        relay = False  # an ill-formed first round: passed on untouched, never looked into again
        buffer = bytearray()
        async for raw in iter_raw(resp, url):
            buffer += raw.replace(b"\r\n", b"\n")
            for ev in split_events(buffer):
                if relay:
                    yield ev
                    continue
                chunk = event_data(ev)
                try:
                    part = shape.delta(chunk)
                except IllFormed as bad:
                    if hidden:
                        raise hidden_failure(200, b"", "text/event-stream", str(bad)) from None
                    relay = True
                    for held_ev, _ in held:
                        yield held_ev
                    yield ev
                    continue
                if hidden:
                    ev = _hidden_event(ev, chunk)
                    if not ev:
                        continue
                if part is None:
                    if chunk == DONE:
                        held.append((ev, chunk))
                    else:
                        yield ev
                    continue
                if part.calls or part.choice.get("finish_reason") or not part.choice:
                    _gather(calls, part.calls)
                    held.append((ev, chunk))
                    continue
                if hidden and set(part.delta) <= {"role", "content"} and not part.delta.get("content"):
                    continue  # the repeated opening chunk of a follow-up round
                if isinstance(part.delta.get("content"), str):
                    text.append(part.delta["content"])
                yield ev
        if relay:
            if buffer:
                yield bytes(buffer)
            return
        if buffer and not hidden:  # an unterminated last event: dropped in a hidden round, as SSE says
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
            resp = await send(body)
            continue
        for ev in _without_ours(held, ours, calls):
            yield ev
        return


def _gather(calls: dict[int, dict[str, Any]], fragments: list[dict[str, Any]]) -> None:
    """Join streamed tool-call fragments (already checked: strings or null) into whole calls by index."""
    for tc in fragments:
        slot = calls.setdefault(tc.get("index") or 0, {"id": None, "type": "function",
                                                       "function": {"name": "", "arguments": ""}})
        slot["id"] = tc.get("id") or slot["id"]
        fn = tc.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""


def _without_ours(held: list[tuple[bytes, Any]], ours: set[int], calls: dict[int, Any]) -> list[bytes]:
    """Held events with the proxy's tool-call deltas removed and the client's renumbered from 0."""
    renumber = {i: n for n, i in enumerate(i for i in sorted(calls) if i not in ours)}
    out = []
    for ev, chunk in held:
        part = shape.delta(chunk)  # held chunks were checked when they arrived
        if part is None or not part.choice:
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
        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
    return out
