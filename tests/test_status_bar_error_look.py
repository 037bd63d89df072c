"""A tool result looks like a failure exactly when Python's `re` finds the error pattern in it, whichever engine
answers (RE2 for the default pattern on ASCII text, proxy/rewrite/status_bar/trajectory.py's ErrorLook)."""

from __future__ import annotations

import random
import re

from proxy.rewrite.status_bar.shapes import DEFAULT_ERROR_PATTERN
from proxy.rewrite.status_bar.trajectory import ErrorLook

WORDS = ["error", "fatal", "exception", "traceback (most recent call last)", "command not found",
         "no such file or directory", "permission denied", "exit code ", "exit status:", "error:", "failed",
         "segmentation fault", "valueerror:", "xexception:", "_error:", "1failed", "failed_", "exit code:  7"]


def _texts(seed: int, n: int, alphabet: range) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.5:
                parts.append("".join(c.upper() if rng.random() < 0.3 else c for c in rng.choice(WORDS)))
            else:
                parts.append("".join(chr(rng.choice(alphabet)) for _ in range(rng.randint(0, 3))))
        out.append("".join(parts))
    return out


def test_the_default_pattern_decides_as_pythons_re_on_any_ascii_text():
    look, python = ErrorLook(DEFAULT_ERROR_PATTERN), re.compile(DEFAULT_ERROR_PATTERN)
    texts = _texts(1, 30_000, range(128))
    assert any(map(look.search, texts)) and not all(map(look.search, texts))
    assert [look.search(t) for t in texts] == [python.search(t) is not None for t in texts]


def test_a_non_ascii_text_is_decided_by_pythons_re():
    look, python = ErrorLook(DEFAULT_ERROR_PATTERN), re.compile(DEFAULT_ERROR_PATTERN)
    # where RE2's ASCII \b and \w would differ (a letter outside ASCII before a word), and re's case folding (ſ: s)
    assert not look.search("éfailed") and look.search("éxerror: x") and look.search("ſegmentation fault x")
    texts = _texts(2, 10_000, range(0x80, 0x250))
    assert [look.search(t) for t in texts] == [python.search(t) is not None for t in texts]


def test_a_configured_pattern_is_pythons():
    look = ErrorLook(r"(?i)\bboom$")
    assert look.search("it went BOOM\n") and not look.search("boomerang")  # `$` before a final newline: re's
