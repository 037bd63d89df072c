"""The usage a client is shown for a turn with hidden read-back rounds: every round's, summed.

The provider bills the client's key for each call the proxy made for it,
the `context_read` rounds it never saw included; the usage in the final
answer (body or stream chunk) says so, every number added up in the
provider's own spelling (prompt, completion, total, cached, reasoning, ...),
so a client's own accounting matches its bill. Without hidden rounds the
provider's bytes pass untouched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import reduce
from typing import TYPE_CHECKING, Any

import orjson

from proxy.wire.sse import event_data, is_usage_chunk
from proxy.wire.usage import Usage, summed

if TYPE_CHECKING:
    from proxy.wire.codec import ReadRounds as Rounds


def _with_hidden(rounds: Rounds, final: dict[str, Any]) -> dict[str, Any]:
    return summed([u.raw for u in rounds.usages if u.raw is not None] + [final])


def hidden_usage(rounds: Rounds | None) -> Usage | None:
    """What the hidden rounds alone were billed (for a turn whose last call failed)."""
    return reduce(Usage.__add__, rounds.usages) if rounds is not None and rounds.usages else None


def summed_body(content: bytes, rounds: Rounds) -> bytes:
    """A non-streamed answer with the hidden rounds' usage added to its own."""
    if not rounds.usages:
        return content
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if not isinstance(data, dict) or not isinstance(data.get("usage"), dict):
        return content
    data["usage"] = _with_hidden(rounds, data["usage"])
    return orjson.dumps(data)


async def summed_stream(events: AsyncIterator[bytes], rounds: Rounds) -> AsyncIterator[bytes]:
    """A stream whose usage chunk (the last round's) carries the hidden rounds' usage too."""
    async for ev in events:
        if rounds.usages and b'"usage"' in ev:
            chunk = event_data(ev)
            if is_usage_chunk(chunk):
                chunk["usage"] = _with_hidden(rounds, chunk["usage"])
                ev = b"data: " + orjson.dumps(chunk) + b"\n\n"
        yield ev
