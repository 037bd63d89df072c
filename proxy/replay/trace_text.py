"""What converting a chat trace into another API's items shares: a chat content as one text, and the error.

Both conversions (proxy/replay/traces_responses.py, proxy/replay/traces_messages.py)
read chat contents the same way, and a native trace either of them cannot replay
is the same kind of failure for the trace loader.
"""

from __future__ import annotations

import json
from typing import Any


class NativeTraceError(Exception):
    """A native trace that cannot be replayed; one line."""


def content_text(content: Any) -> str:
    """A chat content as text: a string as is; parts' texts (strings as they are, other parts as sorted JSON)
    joined by newlines; anything else as sorted JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                out.append(p["text"])
            elif isinstance(p, str):
                out.append(p)
            else:
                out.append(json.dumps(p, sort_keys=True))
        return "\n".join(out)
    return json.dumps(content, sort_keys=True)
