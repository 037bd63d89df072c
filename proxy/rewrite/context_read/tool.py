"""The proxy-owned `context_read` tool: its definition and how a call to it is answered.

The model reads back what the proxy took out of its prompt by handle, paging
by lines (and by characters, so one enormous line cannot blow the window
again), or grepping with a pattern. Answers come only from the caller's own
tenant; an unknown handle or another tenant's gets the same "not found".

A pattern comes from a model, so it is hostile input: it runs on RE2, whose
matching time is linear in the text whatever the pattern (Python's backtracking
`re` takes seconds on `(a+)+$` over one short line). What RE2 cannot run
(backreferences, lookaround) is answered with an error the model can act on;
what no engine can parse is searched as a literal string. Reading a big stored
text (slicing its lines, searching it) runs off the event loop
(proxy/offloop.py), with C-speed scans that never split the whole text
(proxy/rewrite/lines.py), and a grep counts at most MAX_COUNTED_MATCHES matching lines.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import orjson
import re2

from proxy import offloop
from proxy.rewrite.lines import Lines
from proxy.store import StoreError
from proxy.store.archive import Archive
from proxy.wire.codec import Codec, ToolSpec

if TYPE_CHECKING:
    from proxy.request import Conversation

TOOL_NAME = "context_read"
_ALTERNATE_NAMES = ("ctxproxy_context_read", "ctxproxy_read_stored")
DEFAULT_LIMIT = 200  # lines per read
MAX_LIMIT = 2000
PATTERN_MAX_CHARS = 500
MAX_COUNTED_MATCHES = 100_000  # a grep stops counting matching lines here ("100000+ lines match")
UNSUPPORTED = "RE2 syntax: no backreferences or lookaround; \\z, not \\Z, for the end"

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is the model's, answered to it; not the proxy's log
_RE2_OPTIONS.never_nl = True  # a match never crosses a line break: searching the text is searching each line


def tool_name_for(wire: Codec, client_tools: list[Any] | None) -> str:
    """`context_read`, unless the client has a tool of that name: then a name it does not use."""
    taken = set(wire.tool_names(client_tools or []))
    for name in (TOOL_NAME, *_ALTERNATE_NAMES):
        if name not in taken:
            return name
    i = 2
    while f"{_ALTERNATE_NAMES[0]}_{i}" in taken:
        i += 1
    return f"{_ALTERNATE_NAMES[0]}_{i}"


def read_tool_name(conv: Conversation) -> str:
    """The read tool's name in this request: the one added, else the one it would get."""
    return conv.read_tool.name if conv.read_tool else tool_name_for(conv.wire, conv.tools)


def tool_spec(name: str) -> ToolSpec:
    """Fixed bytes for a fixed name (through the codec): it sits in the cached prefix of every request."""
    return ToolSpec(name, "Read text the proxy stored outside the conversation; the placeholder names its handle.",
                    {"type": "object", "properties": {
                        "handle": {"type": "string"},
                        "offset": {"type": "integer", "description": "first line, 0-based"},
                        "limit": {"type": "integer", "description": "lines to return"},
                        "pattern": {"type": "string", "description": "regex: return matching lines only"},
                    }, "required": ["handle"]})


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
        return (f"error: no stored content with handle {handle!r} "
                "(handles are only readable with the API key that stored them)")
    return await offloop.run_if(len(text), respond, text, args, max_chars, handle)


def respond(text: str, args: dict[str, Any], max_chars: int, handle: str) -> str:
    """The answer to a call on a stored text: CPU work only, safe to run on any thread."""
    pattern = args.get("pattern")
    grep = isinstance(pattern, str) and bool(pattern)
    lines: Lines[Any] = Lines(text.encode("utf-8", "surrogatepass") if grep else text)
    offset = _int(args.get("offset"), 0, 0, max(lines.count, 0))
    limit = _int(args.get("limit"), DEFAULT_LIMIT, 1, MAX_LIMIT)
    if grep:
        return _grep(lines, str(pattern)[:PATTERN_MAX_CHARS], offset, limit, max_chars, handle)
    return _page(lines, offset, limit, max_chars, handle)


def _page(lines: Lines[str], offset: int, limit: int, max_chars: int, handle: str) -> str:
    out: list[str] = []
    used, i = 0, offset
    end = min(lines.count, offset + limit)
    pos = lines.start_of(offset) if offset < end else 0
    while i < end:
        start, stop = lines.line(pos)
        room = max_chars - used
        if stop - start + 1 > room:
            if not out:  # one enormous line: give a character slice of it, and say so
                out.append(lines.text[start:start + room])
                return (f"[{handle}: line {i} of {lines.count}, characters 0-{room} of {stop - start:,}; "
                        f"the line continues]\n" + "\n".join(out))
            break
        out.append(lines.text[start:stop])
        used += stop - start + 1
        i += 1
        pos = stop + 1
    more = f"; continue with offset={i}" if i < lines.count else "; end of content"
    return f"[{handle}: lines {offset}-{i - 1} of {lines.count}{more}]\n" + "\n".join(out)


def compile_pattern(pattern: str) -> Any:
    """The RE2 program for a per-line search, or the error string answering a pattern RE2 cannot run."""
    source = pattern.encode("utf-8", "surrogatepass")
    try:
        return re2.compile(b"(?m)" + source, _RE2_OPTIONS)
    except re2.error as e:
        reason = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
    try:
        re.compile(pattern)  # compiling never backtracks; only matching does
    except (re.error, RecursionError, OverflowError, ValueError):
        try:  # not a regex at all: searched as a literal, as ever
            return re2.compile(b"(?m)" + re2.escape(source), _RE2_OPTIONS)
        except re2.error:
            pass
    return f"error: pattern not supported: {reason} ({UNSUPPORTED})"


def _grep(lines: Lines[bytes], pattern: str, offset: int, limit: int, max_chars: int, handle: str) -> str:
    rx = compile_pattern(pattern)
    if isinstance(rx, str):
        return rx
    out: list[str] = []
    used, found = 0, 0
    for n, start, stop in lines.matching(rx):
        if found >= MAX_COUNTED_MATCHES:
            found = -1
            break
        found += 1
        if found <= offset or len(out) >= limit:
            continue
        row = f"{n}: {lines.text[start:stop].decode('utf-8', 'surrogatepass')}"
        if used + len(row) + 1 > max_chars:
            row = row[:max(0, max_chars - used - 1)]
        if not row:
            break
        out.append(row)
        used += len(row) + 1
    count = f"{MAX_COUNTED_MATCHES}+" if found < 0 else str(found)
    head = f"[{handle}: {count} lines match {pattern!r}; showing {len(out)} from match {offset}]"
    return head + ("\n" + "\n".join(out) if out else "")
