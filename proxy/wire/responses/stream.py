"""A Responses event stream on its way to the client: its usage read as it passes, its end told apart from a cut.

The stream ends with a terminal event (`response.completed`, `.incomplete`,
`.failed`) or the provider's `error` event, in whatever JSON spacing the
provider writes; one that stops before either was cut. When the proxy itself
must end a stream it writes the API's own `error` event (`type`, `code`,
`message`, `param`, `sequence_number` following the last one the client got),
which Responses clients such as Codex parse, rather than a chat-shaped error
they would skip.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

from proxy.errors import ProxyError
from proxy.wire import jsonio
from proxy.wire.sse import event_data, named_event, passed_events
from proxy.wire.usage import Usage, parse_usage

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_MAY_END = re.compile(rb'response\.(?:completed|incomplete|failed)|"error"')
_SEQUENCE = re.compile(rb'"sequence_number"\s*:\s*(\d{1,18})')


def watch(chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None]) -> AsyncIterator[bytes]:
    """Pass events through as they complete; report the terminal event's usage; StreamCutShort if it never ended."""
    finished = False

    def keep(ev: bytes) -> bool:
        nonlocal finished
        if not finished and _MAY_END.search(ev):
            data = event_data(ev)
            kind = data.get("type") if isinstance(data, dict) else None
            if kind in TERMINAL:
                finished = True
                response = data.get("response")
                usage = parse_usage(response.get("usage")) if isinstance(response, dict) else None
                if usage is not None:
                    on_usage(usage)
            elif kind == "error":
                finished = True
        return True

    return passed_events(chunks, keep, lambda: finished, "response.completed")


def stream_error(err: ProxyError, before: bytes) -> bytes:
    """The Responses `error` event for the proxy's own failure mid-stream."""
    numbers = _SEQUENCE.findall(before)
    data: dict[str, Any] = {"type": "error", "code": err.code, "message": err.message, "param": err.param,
                            "sequence_number": int(numbers[-1]) + 1 if numbers else 0}
    return named_event("error", jsonio.dumps(data))
