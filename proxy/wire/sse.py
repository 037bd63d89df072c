"""Server-sent events from a provider: split into events, read the usage chunk, hide it when the client did not ask.

The proxy asks every stream for `stream_options.include_usage` so it can
account for it; a client that did not ask must not receive that extra chunk.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from proxy.wire.read_shape import IllFormed, provider_error
from proxy.wire.usage import Usage, parse_usage

DONE = b"[DONE]"
_FINISHED = re.compile(rb'"finish_reason":\s*"|"type":\s*"response\.completed"')


def split_events(buffer: bytearray) -> list[bytes]:
    """Whole events (each ending in a blank line) taken off the front of the buffer."""
    out: list[bytes] = []
    while True:
        i = buffer.find(b"\n\n")
        if i < 0:
            return out
        out.append(bytes(buffer[:i + 2]))
        del buffer[:i + 2]


def event_payload(event: bytes) -> bytes:
    """An event's data lines joined, without the field names; b"" for an event with no data (a comment)."""
    return b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))


def event_data(event: bytes) -> Any:
    """The JSON of an event's data lines; b"[DONE]"; or None (no data, or data that is not JSON)."""
    payload = event_payload(event)
    if not payload or payload == DONE:
        return payload or None
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


_EVENT_NAME = re.compile(rb"[A-Za-z0-9_.\-]{1,128}")


def named_event(kind: str, payload: bytes) -> bytes:
    """An `event:` + `data:` event the proxy writes itself (renumbered, rebuilt).

    The name comes from the provider's data (its `type`); one holding a line
    break would end the `event:` line and let the provider forge events of
    its own, so a name that is not a plain token is refused (IllFormed).
    """
    if not plain_name(kind):
        raise IllFormed("an event type that is not a plain name")
    return b"event: " + kind.encode() + b"\ndata: " + payload + b"\n\n"


def plain_name(kind: str) -> bool:
    """Letters, digits, `_`, `.` and `-` only: what every documented event type is made of."""
    return _EVENT_NAME.fullmatch(kind.encode("utf-8", "surrogatepass")) is not None


def is_usage_chunk(chunk: Any) -> bool:
    return isinstance(chunk, dict) and chunk.get("choices") == [] and isinstance(chunk.get("usage"), dict)


class StreamCutShort(Exception):
    """The provider closed a stream before it finished (no finish_reason, no [DONE])."""


def account_stream(chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None],
                   hide_usage: bool) -> AsyncIterator[bytes]:
    """Pass events through as they complete; report the usage chunk, and drop it if the client did not ask.

    A stream ends with a finish_reason, [DONE] or the provider's error chunk.
    """
    finished = False

    def keep(ev: bytes) -> bool:
        nonlocal finished
        if not finished and (b"[DONE]" in ev or _FINISHED.search(ev)
                             or (b'"error"' in ev and provider_error(event_data(ev)) is not None)):
            finished = True  # an error chunk is the provider's own end of the stream
        if b'"usage":{' in ev or b'"usage": {' in ev:
            chunk = event_data(ev)
            if is_usage_chunk(chunk):
                usage = parse_usage(chunk["usage"])
                if usage is not None:
                    on_usage(usage)
                return not hide_usage
        return True

    return passed_events(chunks, keep, lambda: finished, "it finished")


async def passed_events(chunks: AsyncIterator[bytes], keep: Callable[[bytes], bool], finished: Callable[[], bool],
                        ends_with: str) -> AsyncIterator[bytes]:
    """The stream's events as they complete, each looked at once (`keep` False drops one); then any partial rest.

    What every codec's stream watcher shares: it reads each whole event as it passes and forwards it. A stream
    not `finished` by then was cut: the caller gets StreamCutShort after the last event, so the client is told
    instead of mistaking a truncated answer for a whole one.
    """
    buffer = bytearray()
    async for raw in chunks:
        buffer += raw.replace(b"\r\n", b"\n") if b"\r" in raw else raw
        out = [ev for ev in split_events(buffer) if keep(ev)]
        if out:
            yield b"".join(out)
    if buffer:
        yield bytes(buffer)
    if not finished():
        raise StreamCutShort(f"the provider closed the stream before {ends_with}")
