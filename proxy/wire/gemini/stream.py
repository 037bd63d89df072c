"""A Gemini event stream on its way to the client: its usage read as it passes, its end told apart from a cut.

Each event is a whole GenerateContentResponse chunk; every chunk carries the
usage so far (`usageMetadata`), the last one a candidate's `finishReason` (or,
for a refused prompt, `promptFeedback.blockReason`). There is no closing
event: a stream that stops before a finish was cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from proxy.wire.read_shape import provider_error
from proxy.wire.sse import event_data, passed_events
from proxy.wire.usage import Usage, parse_usage


def finishes(data: Any) -> bool:
    """Whether a chunk ends its stream: a finish reason, a blocked prompt, or the provider's error."""
    if not isinstance(data, dict):
        return False
    candidates = data.get("candidates")
    if isinstance(candidates, list) and any(isinstance(c, dict) and c.get("finishReason") for c in candidates):
        return True
    feedback = data.get("promptFeedback")
    return (isinstance(feedback, dict) and bool(feedback.get("blockReason"))) or provider_error(data) is not None


def watch(chunks: AsyncIterator[bytes], on_usage: Callable[[Usage], None]) -> AsyncIterator[bytes]:
    """Pass events through as they complete; report the usage of the latest chunk that says it."""
    finished = False

    def keep(ev: bytes) -> bool:
        nonlocal finished
        if b'"usageMetadata"' in ev or b'"finishReason"' in ev or b'"error"' in ev or b'"blockReason"' in ev:
            data = event_data(ev)
            if isinstance(data, dict) and (usage := parse_usage(data.get("usageMetadata"))) is not None:
                on_usage(usage)
            finished = finished or finishes(data)
        return True

    return passed_events(chunks, keep, lambda: finished, "a finishReason")
