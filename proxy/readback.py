"""The proxy-owned `context_read` tool: its definition and how a call to it is answered.

The model reads back what the proxy took out of its prompt by handle, paging
by lines (and by characters, so one enormous line cannot blow the window
again), or grepping with a pattern. Answers come only from the caller's own
tenant; an unknown handle or another tenant's gets the same "not found".
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.archive import Archive
from proxy.store import StoreError

TOOL_NAME = "context_read"
_ALTERNATE_NAMES = ("ctxproxy_context_read", "ctxproxy_read_stored")
DEFAULT_LIMIT = 200  # lines per read
MAX_LIMIT = 2000
PATTERN_MAX_CHARS = 500


def tool_name_for(client_tools: list[Any]) -> str:
    """`context_read`, unless the client has a tool of that name: then a name it does not use."""
    taken = {t.get("function", {}).get("name") for t in client_tools if isinstance(t, dict)}
    taken |= {t.get("name") for t in client_tools if isinstance(t, dict)}
    for name in (TOOL_NAME, *_ALTERNATE_NAMES):
        if name not in taken:
            return name
    i = 2
    while f"{_ALTERNATE_NAMES[0]}_{i}" in taken:
        i += 1
    return f"{_ALTERNATE_NAMES[0]}_{i}"


def tool_definition(name: str) -> dict[str, Any]:
    """Fixed bytes for a fixed name: it sits in the cached prefix of every request of a session."""
    return {"type": "function", "function": {
        "name": name,
        "description": "Read text the proxy stored outside the conversation; the placeholder names its handle.",
        "parameters": {"type": "object", "properties": {
            "handle": {"type": "string"},
            "offset": {"type": "integer", "description": "first line, 0-based"},
            "limit": {"type": "integer", "description": "lines to return"},
            "pattern": {"type": "string", "description": "regex: return matching lines only"},
        }, "required": ["handle"]},
    }}


def _int(v: Any, default: int, lo: int, hi: int) -> int:
    try:
        return max(lo, min(hi, int(v)))
    except (TypeError, ValueError):
        return default


async def answer(archive: Archive, arguments: str, max_chars: int) -> str:
    """The tool result for one call, as the model will read it. Never raises for bad arguments."""
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return "error: arguments must be a JSON object with a handle"
    if not isinstance(args, dict) or not isinstance(args.get("handle"), str):
        return "error: arguments must be a JSON object with a string 'handle'"
    handle = args["handle"].strip()
    try:
        text = await archive.get_text(handle)
    except StoreError:
        return "error: the proxy's store is unavailable right now; try again later"
    if text is None:
        return f"error: no stored content with handle {handle!r} (handles are only readable with the API key that stored them)"
    lines = text.splitlines()
    offset = _int(args.get("offset"), 0, 0, max(len(lines), 0))
    limit = _int(args.get("limit"), DEFAULT_LIMIT, 1, MAX_LIMIT)
    pattern = args.get("pattern")
    if isinstance(pattern, str) and pattern:
        return _grep(lines, pattern[:PATTERN_MAX_CHARS], offset, limit, max_chars, handle)
    return _page(lines, offset, limit, max_chars, handle)


def _page(lines: list[str], offset: int, limit: int, max_chars: int, handle: str) -> str:
    out, used, i = [], 0, offset
    end = min(len(lines), offset + limit)
    while i < end:
        line = lines[i]
        room = max_chars - used
        if len(line) + 1 > room:
            if not out:  # one enormous line: give a character slice of it, and say so
                out.append(line[:room])
                return (f"[{handle}: line {i} of {len(lines)}, characters 0-{room} of {len(line):,}; "
                        f"the line continues]\n" + "\n".join(out))
            break
        out.append(line)
        used += len(line) + 1
        i += 1
    more = f"; continue with offset={i}" if i < len(lines) else "; end of content"
    return f"[{handle}: lines {offset}-{i - 1} of {len(lines)}{more}]\n" + "\n".join(out)


def _grep(lines: list[str], pattern: str, offset: int, limit: int, max_chars: int, handle: str) -> str:
    try:
        rx = re.compile(pattern)
    except re.error:
        rx = re.compile(re.escape(pattern))
    out, used, found = [], 0, 0
    for n, line in enumerate(lines):
        if not rx.search(line):
            continue
        found += 1
        if found <= offset or len(out) >= limit:
            continue
        row = f"{n}: {line}"
        if used + len(row) + 1 > max_chars:
            row = row[:max(0, max_chars - used - 1)]
        if not row:
            break
        out.append(row)
        used += len(row) + 1
    head = f"[{handle}: {found} lines match {pattern!r}; showing {len(out)} from match {offset}]"
    return head + ("\n" + "\n".join(out) if out else "")
