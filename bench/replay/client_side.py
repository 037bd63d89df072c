"""Client-side context management: what an agent can do about its window without any proxy.

Both run on the client's own messages, straight to the mock, as baselines for
the proxies: a sliding window of the last N messages, and OpenRouter-style
middle-out. Each is a ``(messages, tools, window) -> messages`` transform.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tests import mock_upstream as mu


def _message_tokens_list(messages: list[dict[str, Any]]) -> list[int]:
    return [len(mu.tokens(mu.render_message(m))) for m in messages]


def _tools_tokens(tools: list[dict[str, Any]] | None) -> int:
    return len(mu.tokens("<|tools|>" + json.dumps(tools))) if tools else 0


def sliding_window(keep: int) -> Callable[[list[dict[str, Any]], list[dict[str, Any]] | None, int],
                                          list[dict[str, Any]]]:
    """System message(s) + the last `keep` messages; leading orphan tool messages dropped (pairing stays valid)."""
    def transform(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                  window: int) -> list[dict[str, Any]]:
        h = 0
        while h < len(messages) and messages[h].get("role") in ("system", "developer"):
            h += 1
        tail = messages[h:][-keep:]
        while tail and tail[0].get("role") == "tool":
            tail = tail[1:]
        return messages[:h] + tail
    return transform


def _units(messages: list[dict[str, Any]], start: int) -> list[tuple[int, int]]:
    """[lo, hi) spans from `start`: an assistant message with the tool messages after it, or one other message."""
    out, i = [], start
    while i < len(messages):
        j = i + 1
        if messages[i].get("role") == "assistant":
            while j < len(messages) and messages[j].get("role") == "tool":
                j += 1
        out.append((i, j))
        i = j
    return out


def middle_out(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               window: int) -> list[dict[str, Any]]:
    """OpenRouter-style middle-out: over the window, remove messages from the middle until the prompt fits.

    Stateless, per request. The leading system message(s) always stay; the rest
    is cut into units (an assistant message with its tool results, or one other
    message) and the k units around the middle are removed, k the smallest that
    fits (binary search; the removed block grows around the same centre, so the
    size is monotonic in k). The first and the last unit always stay, so the
    request may still be over when the newest message alone is too big. The
    window is the mock's exact count (the client is assumed to know it).
    """
    counts = _message_tokens_list(messages)
    fixed = _tools_tokens(tools)
    if fixed + sum(counts) <= window:
        return messages
    h = 0
    while h < len(messages) and messages[h].get("role") in ("system", "developer"):
        h += 1
    units = _units(messages, h)
    if len(units) < 3:
        return messages
    sizes = [sum(counts[a:b]) for a, b in units]
    total = fixed + sum(counts)
    mid = len(units) // 2

    def block(k: int) -> tuple[int, int]:
        lo = max(1, mid - k // 2)
        hi = min(len(units) - 1, lo + k)
        lo = max(1, hi - k)
        return lo, hi

    def fits(k: int) -> bool:
        lo, hi = block(k)
        return total - sum(sizes[lo:hi]) <= window

    lo_k, hi_k = 1, len(units) - 2
    if not fits(hi_k):
        k = hi_k
    else:
        while lo_k < hi_k:
            m = (lo_k + hi_k) // 2
            if fits(m):
                hi_k = m
            else:
                lo_k = m + 1
        k = lo_k
    a, b = block(k)
    return messages[:units[a][0]] + messages[units[b - 1][1]:]
