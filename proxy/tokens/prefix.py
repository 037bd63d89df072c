"""How much two sequences share from the start: the one question behind every cache figure of the proxy.

Digests of messages (prefix checks, figures, the session memo) and token ids (the
simulator) are compared the same way: element by element in C (`map(operator.ne)`),
stopping at the first difference, never by a Python loop over a long equal run.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import compress, count, islice
from typing import Any


def common_prefix(a: Sequence[Any], b: Sequence[Any], i: int = 0, j: int = 0) -> int:
    """Length of the common run of a[i:] and b[j:] under ``==``."""
    n = min(len(a) - i, len(b) - j)
    if i == 0 and j == 0:
        return next(compress(count(), map(operator.ne, a, b)), n)
    return next(compress(count(), map(operator.ne, islice(a, i, None), islice(b, j, None))), n)
