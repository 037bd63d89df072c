"""A summary held to its length limit, whatever the summarizer wrote.

The limit goes to the summarizer as its `max_tokens`, but not every server
honours it, and a summary stays in the prompt of every later turn until the
next compaction: an answer twice the limit is paid for on each of them, and
leaves less room before the next compaction. So an over-long answer is cut
here, by lines, from the ends of its longest sections, so that every heading
(and each section's first, most important, lines) stays; the whole span stays
readable by handle beside it.
"""

from __future__ import annotations

from typing import Any

from proxy.tokens.counter import default_counter

_HEADING = "#"


def _sections(lines: list[str]) -> list[list[int]]:
    """Indices of the lines of each section (its heading first); a preamble is a section of its own."""
    out: list[list[int]] = [[]]
    for i, line in enumerate(lines):
        if line.startswith(_HEADING) and out[-1]:
            out.append([])
        out[-1].append(i)
    return [s for s in out if s]


def within_limit(text: str, limit: int, model: Any) -> str:
    """`text` if it fits `limit` tokens; else without the last lines of its longest sections until it fits."""
    if default_counter.count_text(text, model) <= limit:
        return text
    lines = text.split("\n")
    cost = [default_counter.count_text(line + "\n", model) for line in lines]
    keep = [True] * len(lines)
    sections = _sections(lines)
    total = sum(cost)
    while total > limit:
        # the section with the most tokens in lines that may go (not its heading, not its first line)
        body = [[i for i in s[2:] if keep[i]] if lines[s[0]].startswith(_HEADING) else [i for i in s[1:] if keep[i]]
                for s in sections]
        heaviest = max(range(len(body)), key=lambda k: (sum(cost[i] for i in body[k]), k))
        if not body[heaviest]:
            break  # only headings and first lines left: the structure is worth more than the limit
        last = body[heaviest][-1]
        keep[last] = False
        total -= cost[last]
    return "\n".join(line for line, k in zip(lines, keep) if k)
