"""The lines of a text, numbered as `str.splitlines()` numbers them, without splitting it whole.

Splitting 10 MB of newlines builds ten million strings: about 0.3 s holding the
GIL, and hundreds of MB. A preview needs the line count and a few first and last
lines; a read-back needs a window of lines, or the lines a pattern matches.
`Lines` finds them with C-speed scans (`find`, `count`, RE2 searches), each a
bounded pass over the text, and never a Python step per line of the text.

Line breaks are those of `str.splitlines`: \\n, \\r, \\r\\n, \\v, \\f, \\x1c, \\x1d,
\\x1e, \\x85, \\u2028, \\u2029. The view rewrites them all to \\n first, only when the
text has any other, so that one scan for \\n finds every break. It works on str
(previews count characters) and on UTF-8 bytes (RE2 searches bytes in place,
where a str would be re-encoded on every call).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T", str, bytes)

_STR_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_BYTES_BREAKS = tuple(b.encode() for b in _STR_BREAKS)  # \x85, \u2028, \u2029 as their UTF-8 sequences
_COARSE = 1 << 20  # characters counted per step when looking for line k
_FINE = 4096  # below this window, breaks are stepped over one by one


class Lines(Generic[T]):
    """A text seen as its lines. `count` is len(text.splitlines()); positions are in `text`, as normalized."""

    def __init__(self, text: T) -> None:
        breaks: tuple[Any, ...] = _STR_BREAKS if isinstance(text, str) else _BYTES_BREAKS
        nl: Any = "\n" if isinstance(text, str) else b"\n"
        present = [b for b in breaks if b in text]
        if present and present[0] == breaks[0]:
            text = text.replace(breaks[0] + nl, nl)  # \r\n is one break
        for b in present:
            text = text.replace(b, nl)
        self.text: T = text
        self.nl: T = nl
        end = len(text)
        if end and text.endswith(nl):
            end -= 1  # the last line's own break starts no further line
        self.end = end
        self.count = text.count(nl, 0, end) + 1 if text else 0

    def line(self, start: int) -> tuple[int, int]:
        """(start, end) of the line that starts at `start`."""
        e = self.text.find(self.nl, start, self.end)
        return start, self.end if e < 0 else e

    def head(self, k: int) -> list[tuple[int, int]]:
        """(start, end) of the first k lines (fewer if the text has fewer)."""
        out: list[tuple[int, int]] = []
        pos = 0
        for _ in range(min(k, self.count)):
            out.append(self.line(pos))
            pos = out[-1][1] + 1
        return out

    def tail(self, k: int) -> list[tuple[int, int]]:
        """(start, end) of the last k lines, in order."""
        out: list[tuple[int, int]] = []
        e = self.end
        for _ in range(min(k, self.count)):
            s = self.text.rfind(self.nl, 0, e) + 1
            out.append((s, e))
            e = s - 1
        out.reverse()
        return out

    def start_of(self, k: int) -> int:
        """Where line k starts (0 <= k < count): breaks counted a megabyte at a time, then narrowed down."""
        pos, seen, step = 0, 0, _COARSE
        text, nl = self.text, self.nl
        while seen < k:
            stop = min(self.end, pos + step)
            n = text.count(nl, pos, stop)
            if seen + n < k:
                seen, pos = seen + n, stop
            elif step > _FINE:
                step //= 16
            else:
                pos = text.index(nl, pos, self.end) + 1
                seen += 1
        return pos

    def matching(self, rx: Any) -> Iterator[tuple[int, int, int]]:
        """(line number, start, end) of each line `rx` finds a match in, in order: one search per such line.

        `rx` must never match a newline (RE2's never_nl) and anchor ^ and $ at
        lines (multi-line mode): then a match lies within one line, and a
        search from a line's start sees that line as a per-line search would.
        """
        text, nl, end = self.text, self.nl, self.end
        if not self.count:
            return
        pos, number, start = 0, 0, 0
        while pos <= end:
            m = rx.search(text, pos, end)
            if m is None:
                return
            s = text.rfind(nl, pos, m.start())
            s = pos if s < 0 else s + 1
            number += text.count(nl, start, s)
            start, e = self.line(s)
            yield number, start, e
            pos = e + 1
