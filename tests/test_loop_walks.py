"""The walks over every item of a big request leave the event loop free; the huge parse is one slice at a time.

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
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from asgi_proxy import asgi_proxy
from test_loop_free import AUTH, ITEMS, Threads, request, turns

from proxy import offloop
from proxy.accounting import accountant, inspector
from proxy.rewrite.status_bar import transform as status_bar
from proxy.tokens import session_memo
from proxy.wire import json_slices, jsonio

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


def _value(rng: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(["}]", "},{", 'x"}, ', "}, ", 1, -2.5, None, True, "é😀", "\\u0000", 2**63, ""])
    if rng.random() < 0.5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "}", "role", 'k"']) + str(i): _value(rng, depth + 1) for i in range(rng.randint(0, 3))}


@pytest.mark.parametrize("slice_bytes", [64, 4096, 1 << 20])
def test_a_body_parsed_in_slices_is_the_value_of_one_parse(slice_bytes, monkeypatch):
    """Cut anywhere a string, an item or the rest of the body could fool a byte scan: each accepted value is
    orjson's own, key order included; the slices are many orjson calls, not one."""
    monkeypatch.setattr(json_slices, "SLICE_BYTES", slice_bytes)
    rng, sliced = random.Random(23), 0
    for _ in range(150):
        items = [{"role": rng.choice(["user", "assistant"]), "content": _value(rng)}
                 for _ in range(rng.randint(1, 200))]
        doc = {"model": "m", rng.choice(["messages", "input"]): items, "tools": [_value(rng)], "z": _value(rng)}
        if rng.random() < 0.3:
            doc = {"first": _value(rng), **doc}
        raw = json.dumps(doc, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode()
        got = json_slices.loads_sliced(raw)
        if got is not None:
            sliced += 1
            assert got == orjson.loads(raw) and list(got) == list(orjson.loads(raw))
            assert orjson.dumps(got) == orjson.dumps(orjson.loads(raw))
    assert sliced >= 50


@pytest.mark.parametrize("raw", [
    b'{"messages": [{"a":1},{"b":2}', b'{"messages": [{"a":1},{"b":2}]', b'{"messages": [{"a":1},{"b":NaN}]}',
    b'{"messages": [{"a":1} {"b":2}]}', b'{"messages": [{"a":1},{"b":2}]} x', b'\xef\xbb\xbf{"messages": [{"a":1}]}',
    b'{"messages": [{"a":1},{"b":2}], "messages": [1]}', b'{"x": {"messages": [{"a":1}]}, "messages": [{"b": 2}]}',
    b'{"messages": []}', b'{"messages": [1, 2]}'])
def test_what_slicing_cannot_vouch_for_is_parsed_whole(raw):
    """Malformed, a duplicate key, the key inside another value, nothing to slice: no value from slices, so
    jsonio.loads gives orjson's own value or refusal."""
    assert json_slices.loads_sliced(raw) is None


def test_jsonio_parses_a_huge_body_in_slices_and_keeps_big_integers_exact(monkeypatch):
    calls = []
    real = json_slices.orjson.loads

    def counted(data: bytes) -> Any:
        calls.append(len(data))
        return real(data)

    monkeypatch.setattr(json_slices, "SLICED_FROM", 1 << 16)
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 1 << 12)
    monkeypatch.setattr(jsonio, "SLICED_FROM", 1 << 16)
    monkeypatch.setattr(json_slices.orjson, "loads", counted)
    raw = json.dumps({"model": "m", "messages": turns(1_000)}).encode()
    assert jsonio.loads(raw) == json.loads(raw) and len(calls) > 10 and max(calls) < len(raw) // 4
    calls.clear()
    big = json.dumps({"model": "m", "messages": [*turns(1_000), {"role": "user", "n": 2**100}]}).encode()
    assert jsonio.loads(big)["messages"][-1]["n"] == 2**100  # the exact path, as before
    assert not calls or max(calls) == len(big)
