"""JSON in and out, fast, exact, and written back in the client's own style.

Parse once with orjson. When a transform changes a request it must be
re-serialized; doing so in the client's style (separators, ASCII escaping)
keeps the untouched parts of the body as close as possible to what the client
sent, and - what matters for provider caches - is deterministic: the same
object and style always give the same bytes, on any process.

Numbers are the one thing orjson does not keep: it reads an integer beyond 64
bits as a float (`123456789012345678901234567890` becomes `1.2345678901234568e+29`)
and refuses one beyond a double's range. A body that may hold such an integer
(a long run of digits, found by a byte scan costing a fraction of the parse) is
parsed by the standard library instead, which keeps it an exact `int`, and is
written back with exactly those digits. Other bodies never leave orjson.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass
from itertools import chain, compress, repeat
from typing import Any

import orjson

# Integers orjson parses exactly: signed 64-bit and unsigned 64-bit.
_INT_MIN, _UINT_MAX = -(2**63), 2**64 - 1
_MAX_INT_CHARS = 21  # longer text ("-" and 20 digits, or 21 digits) is beyond both, no need to convert
# Digits as "0", "-" kept, everything else a space: a run of 19 digits is the
# shortest text of an integer orjson turns into a float (-9223372036854775809).
_DIGIT_CLASS = bytes(0x30 if 0x30 <= b <= 0x39 else b if b == 0x2D else 0x20 for b in range(256))
_RUN = b"0" * 19
_RUN_END = re.compile(rb"[^0]")
_BEFORE_NUMBER = frozenset(b":,[")
_AFTER_NUMBER = frozenset(b",]}")
_WHITESPACE = frozenset(b" \t\r\n")
_TRANSLATE_BYTES = 1 << 20
_MAX_RUNS_LOOKED_AT = 256  # past that many long digit runs, the exact parser is cheaper than looking on
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_MAX_DEPTH = 254  # orjson writes at most this deep
# Values nested deeper than this are refused before orjson writes them: orjson 3.13 corrupts its heap
# (the process aborts: "realloc(): invalid next size") writing some values nested 250-254 levels deep,
# e.g. ten sibling lists of 250 levels in a 3 KB body. No agent's JSON comes near 200 levels.
SAFE_DEPTH = 200
_CONTAINERS = (dict, list)
_CONTAINER_SET = frozenset(_CONTAINERS)
_WIDE_LEVEL = 64  # containers in one level from which deeper_than walks it with C-level iterators
_WALKED_FROM = 1 << 16  # bytes: loads_checked walks the value of a body this size or bigger instead of scanning it
_BIG_FLOAT = float(2**63)  # orjson reads an integer beyond 64 bits as a float at least this big


def may_hold_big_ints(raw: bytes) -> bool:
    """True if `raw` may hold a number that is an integer beyond 64 bits.

    A byte scan for runs of 19+ digits (a fraction of orjson's parse time), then
    a look at each: digits inside strings (ids, timestamps, tool output) are
    passed over unless they sit where a JSON number would, after `:`, `,` or
    `[` and before `,`, `]` or `}` - there they may be one (a false alarm only
    costs the slower exact parse).
    """
    # a slice at a time: one translate of 18 MB holds the GIL for tens of milliseconds
    scan = raw.translate(_DIGIT_CLASS) if len(raw) <= _TRANSLATE_BYTES else b"".join(
        raw[i:i + _TRANSLATE_BYTES].translate(_DIGIT_CLASS) for i in range(0, len(raw), _TRANSLATE_BYTES))
    at = scan.find(_RUN)
    runs = 0
    while at >= 0:
        runs += 1
        if runs > _MAX_RUNS_LOOKED_AT:
            return True
        found = _RUN_END.search(scan, at + len(_RUN))
        end = found.start() if found else len(scan)
        start = at - 1 if at and scan[at - 1] == 0x2D else at
        if _is_number_position(raw, start, end) and (end - start > _MAX_INT_CHARS
                                                      or not _INT_MIN <= int(raw[start:end]) <= _UINT_MAX):
            return True
        at = scan.find(_RUN, end)
    return False


def _is_number_position(raw: bytes, start: int, end: int) -> bool:
    i = start - 1
    while i >= 0 and raw[i] in _WHITESPACE:
        i -= 1
    if i >= 0 and raw[i] not in _BEFORE_NUMBER:
        return False
    j = end
    while j < len(raw) and raw[j] in _WHITESPACE:
        j += 1
    return j == len(raw) or raw[j] in _AFTER_NUMBER


def loads(raw: bytes) -> Any:
    """The value of a JSON document, integers of any size exact; otherwise exactly orjson's verdict.

    Raises orjson.JSONDecodeError for anything orjson refuses other than an
    integer too large for it (NaN, Infinity, a lone surrogate, a BOM, bad UTF-8
    stay refused, with orjson's message).
    """
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as refused:
        if not may_hold_big_ints(raw):
            raise
        try:
            return _exact_loads(raw)
        except (ValueError, RecursionError):
            raise refused from None
    if may_hold_big_ints(raw):
        try:
            return _exact_loads(raw)
        except (ValueError, RecursionError):  # deeper than the standard library reads: orjson's value stands
            return value
    return value


def loads_checked(raw: bytes, limit: int) -> tuple[Any, bool]:
    """`loads(raw)`, and whether the value nests deeper than `limit` (deeper_than), in one walk of the value.

    A body of 64 KB or more: orjson parses it, and one C-level walk of the value both measures its depth
    and looks for the one trace an integer beyond 64 bits leaves in orjson's value, a float of magnitude 2**63
    or more; only then are the raw bytes scanned for one (may_hold_big_ints) and, if one is there, the body
    parsed exactly. `loads` scans the bytes of every body first: at 1 MB that scan (a translate of every byte)
    cost as much again as the walk. Values and verdicts are loads' and deeper_than's (tests/test_depth_walk.py);
    a smaller body takes loads and deeper_than as they are."""
    if len(raw) < _WALKED_FROM:
        value = loads(raw)
        return value, deeper_than(value, limit)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = loads(raw)  # refused, or an integer beyond a double: loads' own verdict and exact reading
        return value, deeper_than(value, limit)
    too_deep, big = _deep_or_big(value, limit)
    if big and may_hold_big_ints(raw):
        try:
            value = _exact_loads(raw)
        except (ValueError, RecursionError):  # deeper than the standard library reads: orjson's value stands
            pass
    return value, too_deep


def _deep_or_big(value: Any, limit: int) -> tuple[bool, bool]:
    """(nested deeper than `limit`, holds a float of magnitude >= 2**63), walking each level with C-level
    iterators; it stops at the first level past `limit` (the second answer is then incomplete: the body is
    refused anyway)."""
    if type(value) is float:
        return False, abs(value) >= _BIG_FLOAT
    level = [value] if type(value) in _CONTAINERS else []
    depth, big = 0, False
    while level:
        depth += 1
        if depth > limit:
            return True, big
        values = _children(level)
        kinds = list(map(type, values))
        if not big and float in kinds:
            big = any(abs(f) >= _BIG_FLOAT for f in compress(values, map(operator.is_, kinds, repeat(float))))
        level = list(compress(values, map(_CONTAINER_SET.__contains__, kinds)))
    return False, big


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError("number is infinity when parsed as double")
    return value


def _exact_loads(raw: bytes) -> Any:
    """The standard library's reading, as strict as orjson's but for the size of integers."""
    value = json.loads(raw.decode("utf-8"), parse_float=_finite_float, parse_constant=_refuse_constant)
    if _SURROGATE_ESCAPE.search(raw) and _has_lone_surrogate(value):
        raise ValueError("lone surrogate")
    return value


def _has_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        o = stack.pop()
        if type(o) is str:
            if not o.isascii():
                try:
                    o.encode("utf-8")
                except UnicodeEncodeError:
                    return True
        elif type(o) is dict:
            stack.extend(o)
            stack.extend(o.values())
        elif type(o) is list:
            stack.extend(o)
    return False


def deeper_than(value: Any, limit: int = SAFE_DEPTH) -> bool:
    """Whether `value` nests containers more than `limit` levels deep (a walk over its containers, level by
    level, that stops at the first level past `limit`).

    A wide level (a conversation's messages) is walked by C-level iterators, with no Python step per container:
    at 1,000 messages 0.81 -> 0.54 ms; a narrow one by a plain loop, which costs less for a few containers."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        if len(level) < _WIDE_LEVEL:
            below: list[Any] = []
            for o in level:
                below.extend(v for v in (o.values() if type(o) is dict else o) if type(v) in _CONTAINERS)
            level = below
            continue
        values = _children(level)
        level = list(compress(values, map(_CONTAINER_SET.__contains__, map(type, values))))
    return False


def _children(level: list[Any]) -> list[Any]:
    """Every value held by the dicts and lists of `level` (dicts' first), by C-level iterators: no Python step
    per container."""
    types = list(map(type, level))
    dicts = compress(level, map(operator.is_, types, repeat(dict)))
    lists = compress(level, map(operator.is_, types, repeat(list)))
    return list(chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists)))


def _exact_ints(value: Any, depth: int = 0) -> Any:
    """`value` with every integer beyond 64 bits as an orjson.Fragment of its digits (a copy; rare path)."""
    if depth > _MAX_DEPTH:
        raise orjson.JSONEncodeError(f"nested deeper than {_MAX_DEPTH} levels")
    t = type(value)
    if t is dict:
        return {k: _exact_ints(v, depth + 1) for k, v in value.items()}
    if t is list:
        return [_exact_ints(v, depth + 1) for v in value]
    if t is int and not _INT_MIN <= value <= _UINT_MAX:
        return orjson.Fragment(str(value).encode())
    return value


def dumps(obj: Any) -> bytes:
    """Compact JSON as orjson writes it; integers beyond 64 bits with their exact digits.

    Raises orjson.JSONEncodeError for what orjson cannot write (deeper than 254 levels).
    """
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return orjson.dumps(_exact_ints(obj))


class TooDeep(ValueError):
    """A value nested deeper than any JSON writer here takes (past the interpreter's recursion limit)."""


def dumps_any(obj: Any, read_from: int | None = None) -> bytes:
    """`dumps` for a value of any depth a provider may send (orjson reads up to 1024 levels): orjson writes
    what nests at most SAFE_DEPTH levels; the standard library (slower, the same JSON, compact) what nests
    deeper, which orjson cannot write safely. For what the proxy rewrites of a provider's answer; a value
    nested past what the standard library writes (about 900 levels) raises TooDeep.

    `read_from`: the length of the text `obj` was read from (changed since in scalars only), when known. A text
    shorter than 2 * (SAFE_DEPTH + 1) bytes cannot nest past SAFE_DEPTH (each level opens and closes), so the
    value is not walked (most stream events the proxy renumbers are that short)."""
    if (read_from is not None and read_from < 2 * (SAFE_DEPTH + 1)) or not deeper_than(obj):
        return dumps(obj)
    try:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except RecursionError:
        raise TooDeep("nested too deep to write") from None


# A body holding a list longer than this is written element by element (the same bytes): one C call over
# 18 MB holds the GIL for a quarter of a second, every other request's too, even on the pool.
PIECES_FROM = 512


@dataclass(frozen=True)
class JsonStyle:
    compact: bool = True  # "," and ":" versus ", " and ": "
    ascii_only: bool = False  # non-ASCII written as \uXXXX escapes

    @classmethod
    def sniff(cls, raw: bytes) -> JsonStyle:
        """Guess the style from the body: the first key separator and the escapes used."""
        head = raw[:4096]
        i = head.find(b'":')
        compact = not (i >= 0 and head[i + 2:i + 3] == b" ")
        ascii_only = raw.isascii() and b"\\u" in raw
        return cls(compact=compact, ascii_only=ascii_only)

    def dumps(self, obj: Any) -> bytes:
        if type(obj) is dict and any(type(v) is list and len(v) >= PIECES_FROM for v in obj.values()) \
                and all(type(k) is str for k in obj):
            return self._pieces(obj)
        return self._dump(obj)

    def _dump(self, obj: Any) -> bytes:
        if self.compact and not self.ascii_only:
            return dumps(obj)
        seps = (",", ":") if self.compact else (", ", ": ")
        return json.dumps(obj, ensure_ascii=self.ascii_only, separators=seps).encode("utf-8")

    def _pieces(self, obj: dict[str, Any]) -> bytes:
        """`_dump(obj)` byte for byte, written a top-level value, and a long list's element, at a time.

        Both writers put exactly `{`, the item separator, the key separator and `}` (`[`, `]`) between
        the values they write, with no indentation: the joined pieces are the bytes of the whole.
        """
        item, key = (b",", b":") if self.compact else (b", ", b": ")
        out = []
        for k, v in obj.items():
            if type(v) is list and len(v) >= PIECES_FROM:
                value = b"[" + item.join(map(self._dump, v)) + b"]"
            else:
                value = self._dump(v)
            out.append(self._dump(k) + key + value)
        return b"{" + item.join(out) + b"}"
