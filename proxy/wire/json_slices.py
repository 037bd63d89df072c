"""A huge body parsed a slice of its item list at a time: the same value as one orjson call, without one long C call.

orjson holds the GIL for the whole of a call: 18 MB (100,000 small messages)
is over 100 ms in which no other thread runs, the event loop's included, even
when the parse runs on the pool. A body at least SLICED_FROM long is read here
instead: its item list (the top-level `messages` or `input` array) in slices of
about SLICE_BYTES, each one orjson call (the GIL changes hands between two),
and the rest of the body with a sentinel in the list's place.

The value is exactly the one-call value, or there is none (None: the caller
parses whole, and gets orjson's own verdict and message):
- each slice is cut after a `}` followed by `,` or `]`, and is accepted only
  if orjson parses it as a complete list of values, at the depth its items have
  in the body (wrapped as `[[...]]`). Starting at an item boundary, a cut
  inside a string or inside an item leaves the slice incomplete and refused, as
  does a slice that closes the list itself and goes on (the wrapper would then
  hold more than one list), so an accepted cut is an item boundary, and the
  slices together cover every byte of the list;
- the body around the list must parse to an object whose key holds the
  sentinel (a fresh random string): a duplicate key, or a key found inside
  another value, is not it, and the whole body is parsed instead;
- bodies that may hold integers beyond 64 bits never come here (proxy/wire/jsonio.py).
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson

SLICED_FROM = 4 << 20  # bytes: a smaller body is one orjson call of at most ~25 ms
SLICE_BYTES = 1 << 20  # bytes per slice: a few milliseconds of orjson each
_MISSES = 8  # cuts refused (inside a string or an item) in a row before giving up (each costs a slice's parse)
_NEAR = 1 << 16  # bytes after a slice's end where a cut before an item's "role" is looked for first
_LIST = re.compile(rb'"(messages|input)"[ \t\r\n]*:[ \t\r\n]*\[')
_CUT = re.compile(rb"\}[ \t\r\n]*([,\]])")
# Most likely an item boundary (messages and most input items start with their role): tried first, for fewer misses.
_ROLE_CUT = re.compile(rb'\}[ \t\r\n]*(,)(?=[ \t\r\n]*\{[ \t\r\n]*"role"[ \t\r\n]*:)')
_WS = b" \t\r\n"


def loads_sliced(raw: bytes) -> dict[str, Any] | None:
    """`orjson.loads(raw)` when that is an object with a long item list, parsed slice by slice; None: parse whole."""
    found = _LIST.search(raw)
    if found is None:
        return None
    pos = found.end()
    while pos < len(raw) and raw[pos] in _WS:
        pos += 1
    if pos >= len(raw) or raw[pos] == 0x5D:  # "]": an empty list, nothing to slice
        return None
    items: list[Any] = []
    misses, search = 0, pos + SLICE_BYTES
    while True:
        at = min(search, len(raw))
        cut = (_ROLE_CUT.search(raw, at, search + _NEAR) if not misses else None) or _CUT.search(raw, at)
        if cut is None:  # the list ends within this slice: look for a cut nearer (the slices get shorter)
            if search <= pos + 1:
                return None
            search = pos + 1 + (search - pos - 1) // 2
            continue
        doc = b"[[" + raw[pos:cut.start() + 1] + b"]]"
        try:
            wrapped, inside = orjson.loads(doc), False
        except orjson.JSONDecodeError as e:  # refused at its very end: the cut is inside a string or an item
            wrapped, inside = (), e.pos >= len(doc) - 2
        if len(wrapped) != 1:  # refused, or the slice closed the list itself and went on past it
            misses += 1
            if misses > _MISSES:
                return None
            # the next cut after this one; or, past the list's end (or bad bytes), a cut nearer
            search = cut.end() if inside else pos + 1 + (cut.start() - pos) // 2
            continue
        items += wrapped[0]
        if cut.group(1) == b"]":
            end = cut.end()
            break
        pos, search, misses = cut.end(), cut.end() + SLICE_BYTES, 0
    sentinel = "ctxproxy-slice-" + os.urandom(12).hex()
    try:
        body = orjson.loads(raw[:found.end() - 1] + orjson.dumps(sentinel) + raw[end:])  # up to the "[", after "]"
    except orjson.JSONDecodeError:
        return None
    key = found.group(1).decode()
    if type(body) is not dict or body.get(key) != sentinel:
        return None
    body[key] = items
    return body
