"""Placeholder text for content taken out of the prompt: what it was, a bounded preview, how to read it back.

Deterministic: the same text, handle and settings always give the same
placeholder (callers record it the first time and replay it anyway). Bounded:
line count and line length are capped, and the preview shrinks until it costs
at most `max_share` of the original, so a file of a few huge lines still gives
a small placeholder and a placeholder is never larger than what it replaces.
Cheap on any text: lines are found with C-speed scans (proxy/rewrite/lines.py), never by
splitting the whole text, so ten million short lines cost what one long one does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import re2

from proxy.rewrite.lines import Lines
from proxy.store.archive import HANDLE_PREFIX

READ_LIMIT_LINES = 200  # the `limit` the read-back call in a placeholder suggests
_MIN_LINE_CHARS = 40  # below this a preview line says nothing useful
_MAX_ERROR_SCAN = 10_000  # matching lines looked at, at most (the count says "+" beyond)
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False
_RE2_OPTIONS.never_nl = True  # a match stays within a line: searching the text is searching each line


@dataclass(frozen=True)
class PreviewShape:
    head_lines: int
    tail_lines: int
    line_chars: int
    max_share: float  # of the original's tokens, at most
    error_lines: int = 0  # lines matching the error pattern shown from the part not shown otherwise


def _cap(text: str, span: tuple[int, int], chars: int) -> str:
    start, end = span
    n = end - start
    return text[start:end] if n <= chars else f"{text[start:start + chars]}… [+{n - chars:,} chars]"


# The retrieval tool a gateway offers its model for the context engine's markers (LiteLLM's, for Headroom's
# contract): the marker then says `hash=<hex>`, the handle's hex, which the gateway reads back by
# (proxy/engine/gateway.py).
GATEWAY_TOOL = "headroom_retrieve"


def read_call(tool: str, handle: str, offset: int = 0) -> str:
    """The exact call a model (or a test) finds in a placeholder."""
    if tool == GATEWAY_TOOL:
        return f"hash={handle.removeprefix(HANDLE_PREFIX)}"
    return f'{tool}(handle="{handle}", offset={offset}, limit={READ_LIMIT_LINES})'


def error_matcher(pattern: str) -> Any | None:
    """`pattern` compiled for `build_placeholder(errors=...)`: linear-time (RE2), or None if RE2 cannot run it.

    The scan runs in the offload thread pool over texts of many megabytes; Python's
    backtracking engine would hold the interpreter (and so every request) meanwhile.
    """
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error:
        return None


def build_placeholder(text: str, *, what: str, handle: str, tool: str, tokens: int, shape: PreviewShape,
                      count: Callable[[str], int], approx: bool = False, errors: Any | None = None) -> str | None:
    """The placeholder, or None when no preview can be made small enough to be worth it.

    `approx`: `tokens` is an estimate (proxy/tokens/counter.py, huge strings), shown as "~N tokens".
    `errors` (from `error_matcher`): lines it matches anywhere in the text are shown too, with their
    line numbers, within the same budget - so an error in the middle of a long log needs no read-back.
    """
    lines = Lines(text)
    found = list(islice(lines.matching(errors), _MAX_ERROR_SCAN)) if errors is not None and lines.count else []
    head, tail, chars, errs = shape.head_lines, shape.tail_lines, shape.line_chars, shape.error_lines
    while True:
        out = _render(lines, len(text), what, handle, tool, ("~" if approx else "") + f"{tokens:,}", head, tail, chars,
                      found, errs)
        if count(out) <= tokens * shape.max_share:
            return out
        if head + tail > 0 or errs > 1:
            head, tail, errs = head // 2, tail // 2, max(1, errs // 2) if errs else 0
        elif chars > _MIN_LINE_CHARS:
            chars //= 2
        elif errs:
            errs = 0
        else:
            return None


def _render(lines: Lines[str], size: int, what: str, handle: str, tool: str, tokens: str,
            head: int, tail: int, chars: int, found: Sequence[tuple[int, int, int]] = (), errs: int = 0) -> str:
    n = max(lines.count, 1)  # an empty text is one empty line
    first = lines.head(head) if lines.count else [(0, 0)][:head]
    shown_last = max(0, min(tail, n - head))
    last = (lines.tail(shown_last) if lines.count else [(0, 0)][:shown_last]) if tail else []
    omitted = n - len(first) - len(last)
    middle = [(k, a, b) for k, a, b in found if len(first) <= k < n - len(last)]  # not already shown
    out = [f"[ctxproxy: {what} stored whole ({tokens} tokens, {n:,} lines, {size:,} chars); "
           f"showing the first {len(first)} and last {len(last)} lines]"]
    out += [_cap(lines.text, x, chars) for x in first]
    if omitted:
        out.append(f"[… {omitted:,} lines not shown …]")
    if middle and errs:
        more = "+" if len(found) >= _MAX_ERROR_SCAN else ""
        out.append(f"[lines among them matching the error pattern: {min(errs, len(middle))} of {len(middle):,}{more} "
                   f"shown, with their line numbers (0-based, as offset counts)]")
        out += [f"{k}: " + _cap(lines.text, (a, b), chars) for k, a, b in middle[:errs]]
    out += [_cap(lines.text, x, chars) for x in last]
    out.append(f"[Retrieve more: {read_call(tool, handle)}]" if tool == GATEWAY_TOOL else
               f"[read more: {read_call(tool, handle, len(first))}; offset and limit count lines; "
               f'add pattern="regex" to search]')
    return "\n".join(out)
