"""The shape of a conversation: hash chains, the pinned head, safe cut points, tool-call pairing, identifiers.

Pure functions of the messages, shared by the transforms that rewrite history.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

from proxy.rewrite.marks import STATUS_OPEN, SUMMARY_OPEN, SYNTHETIC_RESULT
from proxy.wire.codec import Codec, Item

Message = Item



def chain(digests: Sequence[bytes], upto: int | None = None) -> list[bytes]:
    """chain[k] identifies messages[0:k] exactly (k = 0..upto): a prefix hash, as a provider cache sees it."""
    out = [b""]
    h = b""
    for d in digests[:upto]:
        h = hashlib.blake2b(h + d, digest_size=16).digest()
        out.append(h)
    return out


def system_end(wire: Codec, messages: Sequence[Message]) -> int:
    """Index after the leading system (and developer) messages."""
    i = 0
    while i < len(messages) and wire.role(messages[i]) == "system":
        i += 1
    return i


def head_end(wire: Codec, messages: Sequence[Message]) -> int:
    """Index after the pinned head: leading system/developer messages and the first user message."""
    i = system_end(wire, messages)
    if i < len(messages) and wire.role(messages[i]) == "user":
        i += 1
    return i


def safe_cut(wire: Codec, messages: Sequence[Message], i: int, lo: int) -> int:
    """Move a cut back so it never separates an assistant's tool calls from their results.

    Where each call is an item of its own, a cut inside a run of calls (and the
    reasoning items among them) would separate the earlier calls from results that
    come after the run: it moves back to the run's start as well.
    """
    while i > lo and i < len(messages) and (wire.role(messages[i]) == "tool" or (
            not wire.calls_grouped and _in_call_run(wire, messages, i))):
        i -= 1
    return i


def _in_call_run(wire: Codec, messages: Sequence[Message], i: int) -> bool:
    """Whether item i continues a run of calls: it is a call or reasoning, and so is the item before it."""
    def part(m: Message) -> bool:
        return bool(wire.calls(m)) or wire.role(m) == "other"
    return part(messages[i]) and part(messages[i - 1]) and any(wire.calls(m) for m in messages[i - 1:i + 1])


def tail_start(wire: Codec, messages: Sequence[Message], counts: Sequence[int], keep_tokens: int, lo: int,
               calls: bool = True) -> int:
    """Start of the recent tail holding about `keep_tokens`, at a safe cut, never before `lo`. `calls` False: the
    messages hold no calls (a gateway's rows), so any cut is safe."""
    total, i = 0, len(messages)
    while i > lo and total + counts[i - 1] <= keep_tokens:
        i -= 1
        total += counts[i]
    if i == len(messages) and i > lo:
        i -= 1  # the newest message always stays verbatim
    return max(lo, safe_cut(wire, messages, i, lo) if calls else i)


def repair_pairing(wire: Codec, messages: list[Message]) -> list[Message]:
    """Every assistant tool call followed by its result (synthetic if missing); orphan results dropped."""
    out: list[Message] = []
    pending: list[str | None] = []

    def close() -> None:
        out.extend(wire.result(cid, SYNTHETIC_RESULT) for cid in pending)
        pending.clear()

    grouped = wire.calls_grouped
    for m in messages:
        role = wire.role(m)
        if role == "tool":
            cid = wire.answers(m)
            if cid in pending:
                pending.remove(cid)
                out.append(m)
            continue  # an orphan result: no call it answers
        if grouped or not (wire.calls(m) or role == "other"):  # a turn's separate calls are not closed early
            close()
        out.append(m)
        if role == "assistant":
            pending.extend(c.id for c in wire.calls(m))
    close()
    return out


def pairing_is_valid(wire: Codec, messages: Sequence[Message]) -> bool:
    return repair_pairing(wire, list(messages)) == list(messages)


def text_of(wire: Codec, message: Message) -> str:
    """All text a message carries: its text and its tool calls, as name(arguments)."""
    text = wire.text(message)
    parts = [] if text is None else [text]
    parts += [f"{c.name}({c.arguments})" for c in wire.calls(message)]
    return "\n".join(parts)


# Identifiers the agent will need verbatim: written by code into the summary, never paraphrased.
_URL = r"https?://[^\s\"'<>`)\]}]+"
_SEGMENT = r"\.?[\w@+-][\w.@+-]*"
# Each alternative starts only where a path can start (not inside a run of path characters): without
# that, every position of a long word run would be tried and scanned to its end - quadratic.
_PATH_START = r"(?<![\w.@+-])"
_PATH = (rf"{_PATH_START}(?:\$\w+/|~/|\.{{1,2}}/|/)?(?:{_SEGMENT}/)+{_SEGMENT}"
         rf"|{_PATH_START}\.{{0,2}}/?\b[\w-]+\.[A-Za-z][\w]{{0,7}}\b")
_HASH = r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,64}\b"
_UUID = r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"
IDENTIFIER = re.compile(f"(?P<url>{_URL})|(?P<uuid>{_UUID})|(?P<hash>{_HASH})|(?P<path>{_PATH})", re.IGNORECASE)
_TRAILING = ".,;:'\")]}"
_EXTENSION = re.compile(r"\.[A-Za-z][\w]{0,7}$")
_ROOTED = ("/", "./", "../", "~/", "$")


def _is_path(value: str) -> bool:
    """A path-looking match that names something: rooted, with an extension, or three segments deep.

    Keeps `./bar.py`, `~/.config/pylintrc`, `django/db/models`; drops `and/or`, `5.32/10`.
    """
    if not any(c.isalpha() for c in value):
        return False
    if value.startswith(_ROOTED):
        return len(value) > 2
    last = value.rsplit("/", 1)[-1]
    return bool(_EXTENSION.search(last)) and not last.replace(".", "").isdigit() or value.count("/") >= 2


# What a tool result reports as failing: exception names, errno-style codes, compiler/linter codes.
ERROR_NAME = re.compile(r"\b(?:[A-Z][A-Za-z0-9]*(?:Error|Exception|Warning|Fault|Panic)|E[A-Z]{3,9}|"
                        r"[A-Z]{1,4}\d{3,5})\b")
# A string argument of a tool call that names something: dotted, snake_case, camelCase, or scoped.
_NAME_ARGUMENT = re.compile(r"^(?=[^\s]*(?:[_.:]|[a-z][A-Z]))[A-Za-z_$@][\w.:$@-]{2,119}$")
_ACTED, _FAILED, _ASKED, _PRINTED = _PRINTED_RANKS = range(4)  # ranks, most useful first


def _string_values(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [v for x in obj.values() for v in _string_values(x)]
    if isinstance(obj, list):
        return [v for x in obj for v in _string_values(x)]
    return []


# The identifier pattern backtracks over a long run of word characters (quadratic in its length), and
# compaction runs it on the event loop: each message is read at most this far from either end, with
# runs this long (never an identifier) blanked first - bounded work for any text.
_SCAN_CHARS = 64 * 1024
_RUN_CHAR = r"[^\s\"'<>`()\[\]{},;]"
_LONG_RUN = re.compile(rf"(?<!{_RUN_CHAR}){_RUN_CHAR}{{1024,}}")  # from a run's start only: linear


def _scannable(text: str) -> str:
    if len(text) > 2 * _SCAN_CHARS:
        text = text[:_SCAN_CHARS] + "\n" + text[-_SCAN_CHARS:]
    return _LONG_RUN.sub(" ", text)


def _named(text: str) -> list[str]:
    out = []
    for match in IDENTIFIER.finditer(_scannable(text)):
        value = match.group(0).rstrip(_TRAILING)
        if len(value) > 2 and (match.lastgroup != "path" or _is_path(value)):
            out.append(value)
    return out


def _call_names(wire: Codec, message: Message) -> list[str]:
    """Paths and names in a message's tool-call arguments: what the agent acted on."""
    out: list[str] = []
    for call in wire.calls(message):
        args = call.arguments
        out += _named(args)
        try:
            values = _string_values(json.loads(args))
        except ValueError:
            continue
        out += [v for v in values if _NAME_ARGUMENT.match(v)]
    return out


def identifiers(wire: Codec, messages: Sequence[Message], cap: int) -> list[str]:
    """Paths, URLs, hashes, ids and error names in the messages, verbatim, each once, most useful first.

    Ranked by what the agent will need again: first what it acted on (names in
    its tool-call arguments and its own text, and what an earlier summary
    already kept), then what failed (exception names and error codes in tool
    results), then what the user named, then what tools merely printed (hashes
    inside logs). Within a rank the newest win when `cap` cuts; the list keeps
    rank order, then order of first appearance. The proxy's status messages are not read.
    """
    rank_of: dict[str, int] = {}
    seen: dict[str, int] = {}  # value -> position of its newest sighting
    first: dict[str, int] = {}  # value -> position of its first sighting

    def see(value: str, rank: int) -> None:
        if rank < rank_of.get(value, len(_PRINTED_RANKS)):
            rank_of[value] = rank
        first.setdefault(value, len(first))
        seen.pop(value, None)
        seen[value] = len(seen)

    for m in messages:
        role = wire.role(m)
        head = wire.first_text(m)
        if head.startswith(STATUS_OPEN):
            continue
        text = text_of(wire, m)
        if role == "assistant" or (role == "user" and head.startswith(SUMMARY_OPEN)):
            for value in _call_names(wire, m) + _named(text):
                see(value, _ACTED)
        elif role == "tool":
            for value in ERROR_NAME.findall(_scannable(text)):
                see(value, _FAILED)
            for value in _named(text):
                see(value, _PRINTED)
        else:
            for value in _named(text):
                see(value, _ASKED)
    chosen: list[str] = []
    for rank in _PRINTED_RANKS:
        newest = sorted((v for v in seen if rank_of[v] == rank), key=seen.__getitem__)
        room = cap - len(chosen)
        chosen += newest[-room:] if room > 0 else []
    return sorted(chosen, key=lambda v: (rank_of[v], first[v]))
