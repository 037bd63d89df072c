"""A Messages event stream on its way to the client: its usage read as it passes, its end told apart from a cut.

Usage comes in `message_start` and is updated by `message_delta` (cumulative);
the stream ends with `message_stop` or the provider's `error` event, in
whatever JSON spacing the provider writes.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from proxy.wire.sse import event_data, passed_events
from proxy.wire.usage import Usage, parse_usage

_LOOK = re.compile(rb'"usage"|message_stop|"error"')


def watch(chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None]) -> AsyncIterator[bytes]:
    """Pass events through as they complete; report the usage of message_start and message_delta combined."""
    finished = False
    usage: dict[str, Any] = {}

    def keep(ev: bytes) -> bool:
        nonlocal finished, usage
        if _LOOK.search(ev):
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

    return passed_events(chunks, keep, lambda: finished, "message_stop")
