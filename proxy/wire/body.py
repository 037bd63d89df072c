"""The two checks every API's request body gets first and last: a JSON object, and one orjson can write back.

Shared by the codecs' validators (chat, responses, messages), so a malformed
or too-deep body is refused with the same 400 whatever the API.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import BadRequest
from proxy.wire import jsonio

# bytes: a body this size or smaller has its brackets counted; a bigger one is walked (jsonio.loads_checked walks
# from this size on, where counting every byte costs more than the walk)
_COUNT_BELOW = jsonio._WALKED_FROM
MAX_DEPTH = jsonio.SAFE_DEPTH  # deeper bodies are refused: orjson cannot write them back safely (jsonio)


def load_object(raw: bytes) -> dict[str, Any]:
    """The body parsed (integers beyond 64 bits kept exact); a 400 if it is not JSON or not an object."""
    body, too_deep = loads_checked(raw)
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if too_deep:
        raise too_deep_error()
    return body


def loads_checked(raw: bytes) -> tuple[Any, bool]:
    """The body's value (integers beyond 64 bits kept exact; a 400 if it is not JSON) and whether it nests deeper
    than MAX_DEPTH: a body under _COUNT_BELOW bytes by its brackets or a walk, a bigger one by the one walk that
    also looks for big integers (jsonio.loads_checked)."""
    try:
        # a small document with no more `{` and `[` than MAX_DEPTH (counted in C, strings included) cannot nest
        # deeper (each level opens with one), so its value need not be walked
        if len(raw) <= _COUNT_BELOW and raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH:
            return jsonio.loads(raw), False
        return jsonio.loads_checked(raw, MAX_DEPTH)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None


def too_deep_error() -> BadRequest:
    return BadRequest(f"request body is nested deeper than {MAX_DEPTH} levels", code="invalid_json")


def _pieces(part: Any) -> list[Any]:
    """`part` as the values that are dumped to check it: itself, or for a body with a long list, each
    top-level value and that list's slices, each at the depth it has in `part` (as `{key: value}`)."""
    n = jsonio.PIECES_FROM
    if type(part) is not dict or not any(type(v) is list and len(v) >= n for v in part.values()):
        return [part]
    return [{k: v[i:i + n]} for k, v in part.items() if type(v) is list for i in range(0, len(v), n)] \
        + [{k: v} for k, v in part.items() if type(v) is not list]


def check_writable(part: Any) -> None:
    """`part` (the body, or what sits at its level) can be written back: orjson's depth limit applies to it.

    A body with a long list is checked in pieces (`_pieces`): the same verdict as one dump, without one
    long C call that holds the GIL (18 MB: tens of milliseconds)."""
    try:
        for piece in _pieces(part):
            jsonio.dumps(piece)
    except orjson.JSONEncodeError:
        raise too_deep_error() from None
