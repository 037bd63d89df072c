"""The walks over every item of a big request leave the event loop free.

Issue 23's second pass: what still ran over all 100,000 items on the loop's
thread. Walks that feed the request's own state (the memo's folds: offload's
scan, the status bar's trajectory; compress's clearing) give the loop a turn
every offloop.STEP_ITEMS items; pure walks (the status bar's agent test,
compress's call names, the accounting measure with the inspector's roles, the
memo's leaves) run on the pool unless light. Small requests do all of it inline
and never yield. Behaviour only: which thread, how many turns, the same values.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgi_proxy import asgi_proxy
from test_loop_free import AUTH, ITEMS, Threads, request, turns

from proxy import offloop
from proxy.accounting import accountant, inspector
from proxy.rewrite.status_bar import transform as status_bar
from proxy.tokens import session_memo

STEP = 256  # offloop.STEP_ITEMS for these tests: ITEMS messages are several spans


class Spans:
    """Counts, per caller, the spans `offloop.spans` gave and the loop turns between them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.turns: dict[str, int] = {}
        self.threads: set[str] = set()
        original = offloop.spans

        async def spans(start: int, stop: int) -> AsyncIterator[range]:
            import sys

            caller = sys._getframe(1).f_code.co_name
            self.threads.add(threading.current_thread().name)
            n = 0
            async for span in original(start, stop):
                n += 1
                yield span
            self.turns[caller] = self.turns.get(caller, 0) + max(0, n - 1)

        monkeypatch.setattr(offloop, "STEP_ITEMS", STEP)
        monkeypatch.setattr(offloop, "spans", spans)


def without_tools(api: str, n: int) -> tuple[str, bytes]:
    """A request of `n` messages and no tools: the status bar must look at every message to see it is no agent's."""
    path, _ = request(api)
    key = "input" if api == "responses" else "messages"
    body: dict[str, Any] = {"model": "claude-sonnet-4-5" if api == "messages" else "gpt-4o", key: turns(n)}
    if api == "messages":
        body["max_tokens"] = 64
    return path, json.dumps(body).encode()


def wrap_walks(threads: Threads) -> None:
    threads.wrap(status_bar, "_has_tool_result", lambda wire, messages: len(messages))
    threads.wrap(accountant.Accountant, "_measure", lambda self, conv, ctx: len(conv.messages))
    threads.wrap(inspector, "roles", lambda conv: len(conv.client_messages))
    threads.wrap(session_memo, "_leaves_of", lambda messages, start: len(messages))


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_the_walks_of_a_big_request_yield_to_the_loop_or_run_on_the_pool(api, upstream, tmp_path, monkeypatch):
    spans = Spans(monkeypatch)
    threads = Threads(monkeypatch)
    wrap_walks(threads)
    path, body = without_tools(api, ITEMS)
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db") as client:
        r = await client.post(path, content=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert spans.threads == {threading.current_thread().name}  # folds stay on the loop ...
    assert spans.turns.get("fold", 0) >= ITEMS // STEP - 1  # ... giving it turns (offload's; no agent: no trajectory)
    for name in ("_has_tool_result", "_measure", "roles", "_leaves_of"):
        assert threads.on_pool(name) >= ITEMS and threads.on_loop(name) == 0, name


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_the_walks_of_a_small_request_stay_inline_and_never_yield(api, upstream, tmp_path, monkeypatch):
    spans = Spans(monkeypatch)
    threads = Threads(monkeypatch)
    wrap_walks(threads)
    path, body = without_tools(api, 3)
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db") as client:
        r = await client.post(path, content=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert sum(spans.turns.values()) == 0
    for name in ("_has_tool_result", "_measure", "roles"):
        assert threads.on_loop(name) >= 1 and threads.on_pool(name) == 0, name
    assert threads.on_pool("_leaves_of") == 0


async def test_a_span_walk_gives_the_same_spans_and_yields_between_them(monkeypatch):
    monkeypatch.setattr(offloop, "STEP_ITEMS", 4)
    got = [list(span) async for span in offloop.spans(3, 13)]
    assert got == [[3, 4, 5, 6], [7, 8, 9, 10], [11, 12]]
    assert [list(span) async for span in offloop.spans(0, 3)] == [[0, 1, 2]]
    assert [span async for span in offloop.spans(5, 5)] == []
