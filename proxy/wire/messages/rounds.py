"""Answering the proxy-owned read tool inside a Messages answer, without the client seeing it.

When the model's answer calls `context_read` (a `tool_use` block of that name)
and no tool the client must run, the proxy answers it itself: the answer's
content goes in as an assistant turn (thinking blocks and their signatures
included, as the API requires), the proxy's `tool_result`s as the next user
turn, and the model is asked again, up to `max_rounds`. The client gets one
message. Non-streamed: the last round's, the proxy's `tool_use` blocks
removed, `usage` covering every round. Streamed: one valid event stream - one
`message_start`, every block of every round with consecutive indexes, the
proxy's `tool_use` blocks never shown, one `message_delta` whose usage covers
every round (cumulative, as the API reports it), one `message_stop`.

A first answer the loop cannot read reaches the client as it came; an
unusable answer to a hidden round raises a ProxyError, so the client gets one
Anthropic-shaped error, never the provider's bytes spliced in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson

from proxy.rewrite.context_read.tool import answer
from proxy.upstream.client import iter_raw, read_body
from proxy.wire import jsonio
from proxy.wire.chat.reply import hidden_failure
from proxy.wire.codec import Send
from proxy.wire.hidden_rounds import HiddenRounds, read_answer
from proxy.wire.sse import StreamCutShort, event_data, event_payload, passed_events, split_events
from proxy.wire.usage import Usage, parse_usage, usage_of_body


class Rounds(HiddenRounds):
    """Builds the follow-up requests of one client request; counts what it did."""

    def is_ours(self, block: Any) -> bool:
        """A call of the read tool the proxy can answer: one without a string id could not be (its tool_result
        would be refused), so it is left to the client, as any reply the loop cannot read."""
        return isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == self.tool.name \
            and isinstance(block.get("id"), str)

    async def next_body(self, content: list[Any]) -> bytes:
        """The model's turn, then the proxy's answers to its read calls: the next request's bytes."""
        self.messages.append({"role": "assistant", "content": content})
        for block in content:
            if self.is_ours(block):
                args = block.get("input")
                result = await answer(self.archive, jsonio.dumps(args if isinstance(args, dict) else {}).decode(),
                                      self.tool.max_chars)
                self.messages.append({"type": "tool_result", "tool_use_id": block.get("id"), "content": result})
        self.done += 1
        body = {**self.conv.body, "messages": self.messages}
        return self.conv.style.dumps(self.conv.wire.render(body))


def _tool_uses(content: list[Any]) -> list[Any]:
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


async def complete(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> tuple[httpx.Response, bytes]:
    """Non-streaming: the final message and its body."""
    resp = first
    while True:
        hidden = rounds.done > 0
        content, data = await read_answer(resp, url, hidden, "content", "a message object", "message")
        if data is None:
            return resp, content
        blocks = data["content"]
        ours = [b for b in blocks if rounds.is_ours(b)]
        if not ours:
            if not hidden:
                return resp, content
            break
        if len(ours) == len(_tool_uses(blocks)) and not rounds.last:
            rounds.add_own(usage_of_body(data))
            resp = await send(await rounds.next_body(blocks))
            continue
        data["content"] = [b for b in blocks if not rounds.is_ours(b)]
        if not _tool_uses(data["content"]) and data.get("stop_reason") == "tool_use":
            data["stop_reason"] = "end_turn"
        break
    if rounds.usages:
        data["usage"] = rounds.summed_usage(data.get("usage"))
    return resp, jsonio.dumps(data)  # usage summed over rounds may pass 64 bits, which orjson refuses


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + jsonio.dumps(data) + b"\n\n"


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


class _Round:
    """What one round's events said: its blocks, which of them are the proxy's, its usage and its end."""

    def __init__(self) -> None:
        self.blocks: dict[int, _Block] = {}
        self.ours: set[int] = set()
        self.index: dict[int, int] = {}  # the provider's block index -> the client's
        self.usage: dict[str, Any] = {}
        self.delta: dict[str, Any] | None = None  # the held message_delta
        self.delta_event = b""  # ... as the provider sent it
        self.stop: bytes | None = None  # the held message_stop
        self.failed = False  # the provider ended the stream with an error event

    def content(self) -> list[Any]:
        return [self.blocks[i].done() for i in sorted(self.blocks)]

    def calls(self) -> int:
        return sum(1 for b in self.blocks.values() if b.block.get("type") == "tool_use")


async def stream(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> AsyncIterator[bytes]:
    """Streaming: blocks pass through as they arrive, renumbered; the proxy's tool_use blocks never reach the client."""
    resp, shown = first, 0  # shown: blocks the client has been given, over all rounds
    while True:
        hidden = rounds.done > 0
        if hidden:
            ctype = resp.headers.get("content-type", "")
            if resp.status_code != 200 or not ctype.startswith("text/event-stream"):
                content = await read_body(resp, url)
                raise hidden_failure(resp.status_code, content, ctype, "not an event stream")
        r = _Round()
        buffer = bytearray()
        async for raw in iter_raw(resp, url):
            buffer += raw.replace(b"\r\n", b"\n")
            out: list[bytes] = []
            for ev in split_events(buffer):
                data = event_data(ev)
                if not isinstance(data, dict) or not isinstance(data.get("type"), str):
                    if hidden and (data is not None or event_payload(ev)):  # JSON of another shape, or not JSON
                        raise hidden_failure(200, b"", "text/event-stream", "an event that is not a JSON object")
                    if not hidden:
                        out.append(ev)
                    continue
                kind = data["type"]
                if kind == "error":
                    if hidden:
                        raise hidden_failure(200, orjson.dumps(data), "text/event-stream", "an error event")
                    out.append(ev)  # the provider's own end of the stream (overloaded mid-way): the client's
                    r.failed = True
                    continue
                if hidden and kind.startswith("content_block_") and not _well_formed(kind, data, r.blocks):
                    raise hidden_failure(200, b"", "text/event-stream", f"an ill-formed {kind} event")
                if kind == "message_start":
                    message = data.get("message")
                    if isinstance(message, dict) and isinstance(message.get("usage"), dict):
                        r.usage = dict(message["usage"])
                    if not hidden:
                        out.append(ev)
                    continue
                if kind == "message_delta":
                    r.delta, r.delta_event = data, ev
                    if isinstance(data.get("usage"), dict):
                        r.usage.update(data["usage"])
                    continue
                if kind == "message_stop":
                    r.stop = ev
                    continue
                idx = data.get("index")
                if not kind.startswith("content_block_") or not isinstance(idx, int):
                    if not hidden or kind != "ping":
                        out.append(ev)
                    continue
                if kind == "content_block_start":
                    block = data.get("content_block")
                    r.blocks[idx] = _Block(block if isinstance(block, dict) else {})
                    if rounds.is_ours(block):
                        r.ours.add(idx)
                    else:
                        r.index[idx] = shown
                        shown += 1
                elif kind == "content_block_delta" and idx in r.blocks and isinstance(data.get("delta"), dict):
                    r.blocks[idx].add(data["delta"])
                if idx in r.ours:
                    continue
                new = r.index.get(idx, idx)
                out.append(ev if new == idx else _event(kind, {**data, "index": new}))
            if out:
                yield b"".join(out)
        if r.stop is None:
            if r.failed:
                return
            raise StreamCutShort("the provider closed the stream before message_stop")
        if r.ours and len(r.ours) == r.calls() and not rounds.last:
            rounds.add_own(parse_usage(r.usage))
            resp = await send(await rounds.next_body(r.content()))
            continue
        yield _final_delta(r, rounds)
        yield r.stop
        return


def _well_formed(kind: str, data: dict[str, Any], started: dict[int, _Block]) -> bool:
    """A content block event whose parts have their documented types, of a block that was started (or starts
    one): in a hidden round nothing else is passed to the client."""
    idx = data.get("index")
    if not isinstance(idx, int) or isinstance(idx, bool):
        return False
    if kind == "content_block_start":
        return isinstance(data.get("content_block"), dict)
    if idx not in started:
        return False
    return kind != "content_block_delta" or isinstance(data.get("delta"), dict)


def _final_delta(r: _Round, rounds: Rounds) -> bytes:
    """The round's message_delta with the stop reason the client's blocks call for and every round's usage."""
    if not r.ours and not rounds.usages and r.delta_event:
        return r.delta_event  # nothing hidden: the provider's bytes
    data = dict(r.delta or {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}})
    delta = data.get("delta")
    client_calls = r.calls() - len(r.ours)
    if r.ours and not client_calls and isinstance(delta, dict) and delta.get("stop_reason") == "tool_use":
        data["delta"] = {**delta, "stop_reason": "end_turn"}
    if rounds.usages:
        data["usage"] = rounds.summed_usage(r.usage)
    return _event("message_delta", data)


async def watch(chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None]) -> AsyncIterator[bytes]:
    """Pass events through as they complete; report the usage of message_start and message_delta combined."""
    finished = False
    usage: dict[str, Any] = {}

    def keep(ev: bytes) -> bool:
        nonlocal finished, usage
        if b'"usage"' in ev or b"message_stop" in ev or b'"error"' in ev:
            data = event_data(ev)
            kind = data.get("type") if isinstance(data, dict) else None
            message = data.get("message") if isinstance(data, dict) else None
            if kind == "message_start" and isinstance(message, dict) and isinstance(message.get("usage"), dict):
                usage = dict(message["usage"])
            elif kind == "message_delta" and isinstance(data.get("usage"), dict):
                usage.update(data["usage"])
            elif kind in ("message_stop", "error"):
                finished = True
            if kind in ("message_start", "message_delta") and (parsed := parse_usage(usage)) is not None:
                on_usage(parsed)
        return True

    async for out in passed_events(chunks, keep):
        yield out
    if not finished:
        raise StreamCutShort("the provider closed the stream before message_stop")
