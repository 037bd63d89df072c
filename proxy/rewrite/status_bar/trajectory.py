"""What an agent has done so far, computed by code from the message structure.

Models are poor at deriving state from a long history in one pass; code is
exact. Every value here comes from roles, tool-call names and arguments, and
whether a result looks like a failure - never from text copied out of a tool
result, so a tool result cannot forge the status.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import orjson
import re2

from proxy.rewrite.marks import STATUS_OPEN
from proxy.rewrite.status_bar.shapes import DEFAULT_ERROR_PATTERN, TodoShape
from proxy.wire.codec import Codec, Item

# Enough of a result's start and end to see a failure; a 800k-char log is not scanned whole.
_SCAN_CHARS = 4000
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


class ErrorLook:
    """Whether a text matches the configured error pattern, as Python's `re` reads it.

    Python's backtracking engine spends about half a microsecond per character on the
    default pattern (its nine alternatives tried at every position): 4 ms, on the event
    loop, for the 8,000 characters a result is scanned on. For that pattern on an ASCII
    text RE2 answers instead, in linear time: there both engines accept the same texts
    (`\\w`, `\\b`, `^` under `(?m)` and case folding agree on ASCII; which match each
    finds may differ, whether there is one cannot), so every decision is the same.
    Any other pattern, or a text with a non-ASCII character, is searched by `re`.
    """

    def __init__(self, pattern: str) -> None:
        self.pattern = re.compile(pattern)
        self._ascii = re2.compile(pattern, _RE2_OPTIONS) if pattern == DEFAULT_ERROR_PATTERN else None

    def search(self, text: str) -> bool:
        if self._ascii is not None and text.isascii():
            return self._ascii.search(text) is not None
        return self.pattern.search(text) is not None


@dataclass
class Trajectory:
    turns: int = 0
    calls: Counter[str] = field(default_factory=Counter)
    last_tool: str | None = None  # the tool whose result came last
    last_call: str | None = None  # the tool called last
    last_error: bool = False
    repeated: int = 0  # how many times in a row the latest call had the same name and arguments
    consecutive_errors: int = 0
    todo_open: int | None = None
    todo_done: int | None = None
    todo_active: str | None = None  # the item in progress, as the todo list names it


@dataclass(frozen=True)
class StatusAnchor:
    """What the status bar measured before the other transforms ran: the trajectory, and where the new
    status goes in the client's history (`at` messages, the last with digest prefix `prev`)."""

    trajectory: Trajectory
    at: int
    prev: str


def is_status(wire: Codec, message: Item) -> bool:
    """The proxy's status message, whichever role it was sent with (status_bar.role)."""
    return wire.role(message) in ("user", "system") and wire.first_text(message).startswith(STATUS_OPEN)


def looks_like_error(wire: Codec, message: Item, pattern: ErrorLook) -> bool:
    if wire.is_error(message):
        return True
    content = wire.text(message)
    if content is None:
        return False
    sample = content if len(content) <= 2 * _SCAN_CHARS else content[:_SCAN_CHARS] + "\n" + content[-_SCAN_CHARS:]
    return pattern.search(sample)


_TODO_NAME_CHARS = 80  # of the item in progress, in the status


def _todo_counts(arguments: str, shape: TodoShape) -> tuple[int, int, str | None] | None:
    try:
        args = orjson.loads(arguments or "{}")
    except orjson.JSONDecodeError:
        return None
    items = args.get(shape.list_arg) if isinstance(args, dict) else None
    if not isinstance(items, list):
        return None
    states = [str(t.get(shape.status_field, "")).lower() if isinstance(t, dict) else "" for t in items]
    done = sum(1 for s in states if s in shape.done_values)
    active = next((t for t, s in zip(items, states) if s in shape.active_values), None)
    name = next((v for f in shape.name_fields if isinstance(v := active.get(f), str) and v.strip()), None) \
        if isinstance(active, dict) else None
    if name is not None:
        name = " ".join(name.split())
        name = name if len(name) <= _TODO_NAME_CHARS else name[:_TODO_NAME_CHARS - 1] + "…"
    return len(items) - done, done, name


@dataclass
class Progress:
    """A history's trajectory, part way through it: a later request repeating those messages resumes from here.

    A left fold over the messages (each step reads only the state and the next
    message), so the state after message i of an identical prefix is always the same.
    """

    wire: Codec
    trajectory: Trajectory = field(default_factory=Trajectory)
    names: dict[str | None, str] = field(default_factory=dict)  # tool-call id -> tool name
    last_sig: tuple[str, str] | None = None
    statuses: list[int] = field(default_factory=list)  # positions of status messages, skipped

    def copy(self) -> Progress:
        t = self.trajectory
        return Progress(self.wire, replace(t, calls=Counter(t.calls)), dict(self.names), self.last_sig,
                        list(self.statuses))

    def add(self, m: Item, is_error: Callable[[Item], bool], todo: TodoShape) -> None:
        t = self.trajectory
        wire = self.wire
        role = wire.role(m)
        if role == "assistant":
            t.turns += 1
            for call in wire.calls(m):
                name, args = call.name, call.arguments
                self.names[call.id] = name
                t.calls[name] += 1
                t.last_call = name
                sig = (name, args)
                t.repeated = t.repeated + 1 if sig == self.last_sig else 1
                self.last_sig = sig
                if name in todo.tools:
                    counts = _todo_counts(args, todo)
                    if counts is not None:
                        t.todo_open, t.todo_done, t.todo_active = counts
        elif role == "tool":
            t.last_tool = self.names.get(wire.answers(m), wire.result_name(m) or "?")
            t.last_error = is_error(m)
            t.consecutive_errors = t.consecutive_errors + 1 if t.last_error else 0

    def add_unless_status(self, i: int, m: Item, is_error: Callable[[Item], bool], todo: TodoShape) -> None:
        """Message i of a client's history: statuses are noted (to be taken out), the rest analysed."""
        if is_status(self.wire, m):
            self.statuses.append(i)
        else:
            self.add(m, is_error, todo)
