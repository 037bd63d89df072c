"""What converting a chat trace into another API's items shares: a chat content as one text, and the error.

Both conversions (proxy/replay/traces_responses.py, proxy/replay/traces_messages.py)
read chat contents the same way, and a native trace either of them cannot replay
is the same kind of failure for the trace loader.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class NativeTraceError(Exception):
    """A native trace that cannot be replayed; one line."""


def joined_text(content: Any, part_text: Callable[[Any], str | None]) -> str:
    """A content as text: a string as is; a list's parts through `part_text` (None: left out) joined by
    newlines; nothing as ""; anything else as sorted JSON. The one skeleton; each caller says what a part is."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for p in content if (t := part_text(p)) is not None)
    return json.dumps(content, sort_keys=True)


def _chat_part(p: Any) -> str:
    if isinstance(p, dict) and isinstance(p.get("text"), str):
        return str(p["text"])
    return p if isinstance(p, str) else json.dumps(p, sort_keys=True)


def content_text(content: Any) -> str:
    """A chat content as text: a string as is; parts' texts (strings as they are, other parts as sorted JSON)
    joined by newlines; anything else as sorted JSON."""
    return joined_text(content, _chat_part)
