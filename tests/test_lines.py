"""Lines of a big text without splitting it: the same lines, numbers and matches as str.splitlines() gives."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.rewrite.context_read.tool import compile_pattern
from proxy.rewrite.lines import Lines

# Every line break str.splitlines knows, \r\n, and a few ordinary characters (one multi-byte).
PIECES = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029",
          "a", "b", "ab", "é", " ", "x1"]
texts = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


def spans_text(lines: Lines, spans: list[tuple[int, int]]) -> list:
    return [lines.text[s:e] for s, e in spans]


@settings(max_examples=400, deadline=None)
@given(texts, st.integers(0, 12))
def test_lines_are_those_of_splitlines(text, k):
    expected = text.splitlines()
    for view, want in ((Lines(text), expected), (Lines(text.encode()), [x.encode() for x in expected])):
        assert view.count == len(want)
        assert spans_text(view, view.head(k)) == want[:k]
        assert spans_text(view, view.tail(k)) == (want[-k:] if k else [])
        for i, line in enumerate(want):
            assert spans_text(view, [view.line(view.start_of(i))]) == [line]


def test_start_of_crosses_coarse_and_fine_steps():
    text = "\n".join(f"l{i}" for i in range(300_000))  # 2 MB: several coarse steps, then narrowed
    view = Lines(text)
    for k in (0, 1, 4095, 4096, 150_001, 299_999):
        assert spans_text(view, [view.line(view.start_of(k))]) == [f"l{k}"]


PATTERNS = [r"a", r"^a", r"a$", r"^$", r"b+", r"x1|é", r"(?i)A", r"[^a]+", r"\s", r"^", r"(a|b)\1?"]


@settings(max_examples=300, deadline=None)
@given(texts, st.sampled_from(PATTERNS))
def test_a_whole_text_search_finds_the_lines_a_per_line_search_finds(text, pattern):
    rx = compile_pattern(pattern)
    if isinstance(rx, str):  # RE2 refuses it (the backreference): nothing to compare
        assert "not supported" in rx
        return
    view = Lines(text.encode())
    got = [(n, view.text[s:e].decode()) for n, s, e in view.matching(rx)]
    py = re.compile(pattern)
    assert got == [(n, line) for n, line in enumerate(text.splitlines()) if py.search(line)]


def splitlines_placeholder(text: str, head: int, tail: int, chars: int) -> str:
    """The placeholder as it was built from text.splitlines() (before proxy/rewrite/lines.py): the reference."""
    lines = text.splitlines() or [""]
    cap = lambda x: x if len(x) <= chars else f"{x[:chars]}… [+{len(x) - chars:,} chars]"  # noqa: E731
    n, first = len(lines), lines[:head]
    last = lines[max(head, n - tail):] if tail else []
    omitted = n - len(first) - len(last)
    out = [f"[ctxproxy: t stored whole (1,000 tokens, {n:,} lines, {len(text):,} chars); "
           f"showing the first {len(first)} and last {len(last)} lines]"] + [cap(x) for x in first]
    out += ([f"[… {omitted:,} lines not shown …]"] if omitted else []) + [cap(x) for x in last]
    return "\n".join(out + [f'[read more: r(handle="h", offset={len(first)}, limit=200); offset and limit count lines; '
                            f'add pattern="regex" to search]'])


@settings(max_examples=300, deadline=None)
@given(texts, st.integers(0, 4), st.integers(0, 4), st.integers(1, 3))
def test_placeholders_are_byte_for_byte_what_splitting_gave(text, head, tail, chars):
    from proxy.rewrite.preview import PreviewShape, build_placeholder

    shape = PreviewShape(head, tail, chars, 0.99)
    got = build_placeholder(text, what="t", handle="h", tool="r", tokens=1000, shape=shape, count=lambda _: 0)
    assert got == splitlines_placeholder(text, head, tail, chars)


def test_a_pattern_that_is_no_regex_is_searched_as_a_literal_and_nothing_raises():
    from proxy.rewrite.context_read.tool import respond

    text = "a foo( b\n[x\nfoo"
    assert respond(text, {"pattern": "foo("}, 1000, "h") == ("[h: 1 lines match 'foo('; showing 1 from match 0]\n"
                                                           "0: a foo( b")
    assert respond(text, {"pattern": "[x"}, 1000, "h").endswith("\n1: [x")
    for pattern in ("\ud800(", "(?P<n>a)(?P=n)", "a{2,1}", "x" * 600, "(?<=a)b", "\\Z"):
        assert isinstance(respond(text, {"pattern": pattern}, 1000, "h"), str)
