"""Placeholder text for content taken out of the prompt: what it was, a bounded preview, how to read it back.

Deterministic: the same text, handle and settings always give the same
placeholder (callers record it the first time and replay it anyway). Bounded:
line count and line length are capped, and the preview shrinks until it costs
at most `max_share` of the original, so a file of a few huge lines still gives
a small placeholder and a placeholder is never larger than what it replaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

READ_LIMIT_LINES = 200  # the `limit` the read-back call in a placeholder suggests
_MIN_LINE_CHARS = 40  # below this a preview line says nothing useful


@dataclass(frozen=True)
class PreviewShape:
    head_lines: int
    tail_lines: int
    line_chars: int
    max_share: float  # of the original's tokens, at most


def _cap(line: str, chars: int) -> str:
    return line if len(line) <= chars else f"{line[:chars]}… [+{len(line) - chars:,} chars]"


def read_call(tool: str, handle: str, offset: int = 0) -> str:
    """The exact call a model (or a test) finds in a placeholder."""
    return f'{tool}(handle="{handle}", offset={offset}, limit={READ_LIMIT_LINES})'


def build_placeholder(text: str, *, what: str, handle: str, tool: str, tokens: int, shape: PreviewShape,
                      count: Callable[[str], int]) -> str | None:
    """The placeholder, or None when no preview can be made small enough to be worth it."""
    lines = text.splitlines() or [""]
    head, tail, chars = shape.head_lines, shape.tail_lines, shape.line_chars
    while True:
        out = _render(lines, text, what, handle, tool, tokens, head, tail, chars)
        if count(out) <= tokens * shape.max_share:
            return out
        if head + tail > 0:
            head, tail = head // 2, tail // 2
        elif chars > _MIN_LINE_CHARS:
            chars //= 2
        else:
            return None


def _render(lines: list[str], text: str, what: str, handle: str, tool: str, tokens: int,
            head: int, tail: int, chars: int) -> str:
    n = len(lines)
    first = lines[:head]
    last = lines[max(head, n - tail):] if tail else []
    omitted = n - len(first) - len(last)
    out = [f"[ctxproxy: {what} stored whole ({tokens:,} tokens, {n:,} lines, {len(text):,} chars); "
           f"showing the first {len(first)} and last {len(last)} lines]"]
    out += [_cap(x, chars) for x in first]
    if omitted:
        out.append(f"[… {omitted:,} lines not shown …]")
    out += [_cap(x, chars) for x in last]
    out.append(f"[read more: {read_call(tool, handle, len(first))}; offset and limit count lines; "
               f'add pattern="regex" to search]')
    return "\n".join(out)
