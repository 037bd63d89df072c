"""Answering the proxy-owned read tool inside a Responses API answer, without the client seeing it.

When the model's output calls `context_read` (a `function_call` item of that
name) and nothing else the client must run, the proxy answers it itself: the
round's output items and the proxy's `function_call_output`s are appended to the
input (or, where the provider holds the history, sent after the response's id)
and the model is asked again, up to `max_rounds`. The client gets one response:
non-streamed, the last round's with the proxy's calls removed and `usage`
covering every round; streamed, one valid event stream - one `response.created`,
the proxy's call items dropped, `output_index` and `sequence_number` renumbered
to stay consecutive, and one `response.completed` whose `output` lists what the
client was shown and whose `usage` covers every round.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson

from proxy.rewrite.context_read.tool import answer
from proxy.upstream.client import iter_raw, read_body
from proxy.wire.chat.reply import hidden_failure, provider_error
from proxy.wire.codec import Send
from proxy.wire.hidden_rounds import HiddenRounds, read_answer
from proxy.wire.sse import StreamCutShort, event_data, passed_events, split_events
from proxy.wire.usage import Usage, parse_usage, usage_of_body

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_CALL_TYPES = frozenset({"function_call", "custom_tool_call"})


class Rounds(HiddenRounds):
    """Builds the follow-up requests of one client request; counts what it did."""

    def is_ours(self, item: Any) -> bool:
        return isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") == self.tool.name

    async def next_body(self, response_id: Any, output: list[Any], ours: list[Any]) -> bytes:
        results = [{"type": "function_call_output", "call_id": c.get("call_id"),
                    "output": await answer(self.archive, c.get("arguments") or "{}", self.tool.max_chars)}
                   for c in ours]
        self.done += 1
        body = dict(self.conv.body)
        if body.get("previous_response_id") or body.get("conversation"):
            # the provider holds the history: continue from the response just made
            self.messages += [*output, *results]
            body["input"] = results
            if not body.get("conversation"):
                body["previous_response_id"] = response_id
        else:
            self.messages += [*output, *results]
            body["input"] = self.messages
        return self.conv.style.dumps(body)


async def complete(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> tuple[httpx.Response, bytes]:
    """Non-streaming: the final response and its body (a first reply the loop cannot read comes as it came)."""
    resp = first
    while True:
        hidden = rounds.done > 0
        content, data = await read_answer(resp, url, hidden, "output", "a response object")
        if data is None:
            return resp, content
        output = data["output"]
        ours = [it for it in output if rounds.is_ours(it)]
        if not ours:
            if not hidden:
                return resp, content
            break
        calls = [it for it in output if isinstance(it, dict) and it.get("type") in _CALL_TYPES]
        if len(ours) == len(calls) and not rounds.last:
            rounds.add_own(usage_of_body(data))
            resp = await send(await rounds.next_body(data.get("id"), output, ours))
            continue
        data["output"] = [it for it in output if not rounds.is_ours(it)]
        break
    if rounds.usages:
        data["usage"] = rounds.summed_usage(data.get("usage"))
    return resp, orjson.dumps(data)


class _Renumber:
    """Output indexes and sequence numbers as the client sees them across all rounds."""

    def __init__(self) -> None:
        self.seq = 0
        self.next_index = 0
        self.shown: list[Any] = []  # output items the client was shown, in its order
        self.index: dict[int, int] = {}  # this round's provider output_index -> the client's
        self.dropped: set[int] = set()  # this round's output indexes of the proxy's own calls

    def new_round(self) -> None:
        self.index, self.dropped = {}, set()


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def stream(send: Send, first: httpx.Response, url: str, rounds: Rounds) -> AsyncIterator[bytes]:
    """Streaming: events pass through as they arrive, renumbered; the proxy's call items never reach the client."""
    resp, r = first, _Renumber()
    while True:
        hidden = rounds.done > 0
        if hidden:
            ctype = resp.headers.get("content-type", "")
            if resp.status_code != 200 or not ctype.startswith("text/event-stream"):
                content = await read_body(resp, url)
                raise hidden_failure(resp.status_code, content, ctype, "not an event stream")
        r.new_round()
        buffer = bytearray()
        terminal: dict[str, Any] | None = None
        ours: list[Any] = []
        calls = 0
        async for raw in iter_raw(resp, url):
            buffer += raw.replace(b"\r\n", b"\n")
            out: list[bytes] = []
            for ev in split_events(buffer):
                data = event_data(ev)
                if not isinstance(data, dict) or not isinstance(data.get("type"), str):
                    if hidden and data is not None:
                        raise hidden_failure(200, b"", "text/event-stream", "an event that is not a JSON object")
                    if not hidden:
                        out.append(ev)
                    continue
                kind = data["type"]
                if kind == "error" or provider_error(data) is not None:
                    if hidden:
                        raise hidden_failure(200, orjson.dumps(data), "text/event-stream", "an error event")
                    out.append(ev)
                    continue
                if kind in _TERMINAL:
                    terminal = data
                    continue
                if hidden and kind in ("response.created", "response.in_progress", "response.queued"):
                    continue
                idx = data.get("output_index")
                if kind == "response.output_item.added" and isinstance(idx, int):
                    item = data.get("item")
                    if rounds.is_ours(item):
                        r.dropped.add(idx)
                    else:
                        r.index[idx] = r.next_index
                        r.next_index += 1
                    if isinstance(item, dict) and item.get("type") in _CALL_TYPES:
                        calls += 1
                if isinstance(idx, int) and idx in r.dropped:
                    if kind == "response.output_item.done":
                        ours.append(data.get("item"))
                    continue
                if kind == "response.output_item.done" and isinstance(idx, int):
                    r.shown.append(data.get("item"))
                out.append(_renumbered(ev, kind, data, r))
            if out:
                yield b"".join(out)
        if terminal is None:
            raise StreamCutShort("the provider closed the stream before response.completed")
        found = terminal.get("response")
        response: dict[str, Any] = found if isinstance(found, dict) else {}
        if ours and len(ours) == calls and not rounds.last and terminal["type"] == "response.completed":
            rounds.add_own(parse_usage(response.get("usage")))
            listed = response.get("output")
            output: list[Any] = listed if isinstance(listed, list) else ours
            resp = await send(await rounds.next_body(response.get("id"), output, ours))
            continue
        if rounds.done or ours:
            response = {**response, "output": r.shown}
            if rounds.usages:
                response["usage"] = rounds.summed_usage(response.get("usage"))
            terminal = {**terminal, "response": response}
        yield _renumbered_terminal(terminal, r)
        return


def _renumbered(ev: bytes, kind: str, data: dict[str, Any], r: _Renumber) -> bytes:
    seq, idx = data.get("sequence_number"), data.get("output_index")
    new_idx = r.index.get(idx, idx) if isinstance(idx, int) else idx
    changed = (isinstance(seq, int) and seq != r.seq) or new_idx != idx
    if isinstance(seq, int):
        r.seq += 1
    if not changed:
        return ev
    data = dict(data)
    if isinstance(seq, int):
        data["sequence_number"] = r.seq - 1
    if isinstance(idx, int):
        data["output_index"] = new_idx
    return _event(kind, data)


def _renumbered_terminal(data: dict[str, Any], r: _Renumber) -> bytes:
    if isinstance(data.get("sequence_number"), int):
        data = {**data, "sequence_number": r.seq}
    r.seq += 1
    return _event(str(data["type"]), data)


async def watch(chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None]) -> AsyncIterator[bytes]:
    """Pass events through as they complete; report the terminal event's usage; StreamCutShort if none came."""
    finished = False

    def keep(ev: bytes) -> bool:
        nonlocal finished
        if not finished and (b"response.completed" in ev or b"response.incomplete" in ev
                             or b"response.failed" in ev or b'"type":"error"' in ev):
            data = event_data(ev)
            if isinstance(data, dict) and data.get("type") in _TERMINAL:
                finished = True
                response = data.get("response")
                usage = parse_usage(response.get("usage")) if isinstance(response, dict) else None
                if usage is not None:
                    on_usage(usage)
            elif isinstance(data, dict) and data.get("type") == "error":
                finished = True
        return True

    async for out in passed_events(chunks, keep):
        yield out
    if not finished:
        raise StreamCutShort("the provider closed the stream before response.completed")
