"""Many small items stall nobody: the whole-body work of a big request runs off the event loop (issue 23).

Whether work is big is decided by the total (all the new items together), not
item by item: 2,000 messages of 80 characters are as much work as one of
160 KB. Each test records which thread did the work, never how long it took:
counting, hashing, parsing, the per-item checks and the dump of such a body
must run on the pool (threads named `ctxproxy-cpu`), for every API. And the
store's deadline measures the store, not the loop: a call pending while
another task blocks the loop for twice the deadline still succeeds, and the
breaker stays closed.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from asgi_proxy import asgi_proxy
from slow_relay import SlowRelay

from proxy import offloop
from proxy.request import Conversation
from proxy.store import StoreError, open_store
from proxy.store.guarded import GuardedStore
from proxy.tokens import message_facts
from proxy.tokens.counter import default_counter
from proxy.wire.chat.codec import ChatCompletions
from proxy.wire.jsonio import PIECES_FROM, JsonStyle
from proxy.wire.messages.codec import Messages
from proxy.wire.responses.codec import Responses

AUTH = {"authorization": "Bearer sk-loop-free", "content-type": "application/json"}
ITEMS = 2_000  # each well under offloop.INLINE_CHARS, all together far over it


def turns(n: int) -> list[dict[str, Any]]:
    out = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "w " * 30} for i in range(n)]
    return out + [{"role": "user", "content": "go on"}] if out[-1]["role"] != "user" else out


def request(api: str) -> tuple[str, bytes]:
    """A big request of an agent (it has tools: the status bar is added, so the body is rendered and dumped)."""
    if api == "chat":
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
        return "/v1/chat/completions", json.dumps({"model": "gpt-4o", "messages": turns(ITEMS),
                                                   "tools": tools}).encode()
    if api == "responses":
        tools = [{"type": "function", "name": "bash", "parameters": {"type": "object"}}]
        return "/v1/responses", json.dumps({"model": "gpt-4o", "input": turns(ITEMS), "tools": tools}).encode()
    tools = [{"name": "bash", "input_schema": {"type": "object"}}]
    return "/v1/messages", json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": turns(ITEMS),
                                       "tools": tools}).encode()


CODECS = {"chat": ChatCompletions, "responses": Responses, "messages": Messages}


class Threads:
    """Wraps functions so that each call records the thread it ran in and the number of items it got."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch
        self.calls: dict[str, list[tuple[str, int]]] = {}

    def wrap(self, owner: Any, name: str, size: Callable[..., int] = lambda *a, **k: 1) -> None:
        original = getattr(owner, name)
        calls = self.calls.setdefault(name, [])

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            calls.append((threading.current_thread().name, size(*args, **kwargs)))
            return original(*args, **kwargs)

        self.mp.setattr(owner, name, wrapped)

    def on_loop(self, name: str) -> int:
        """Items `name` handled on the event loop's thread (this test's)."""
        return sum(n for thread, n in self.calls.get(name, []) if thread == threading.current_thread().name)

    def on_pool(self, name: str) -> int:
        return sum(n for thread, n in self.calls.get(name, []) if thread.startswith("ctxproxy-cpu"))


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_many_small_items_are_counted_hashed_parsed_and_dumped_off_the_loop(api, upstream, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setattr(offloop, "INLINE_BODY_BYTES", offloop.INLINE_CHARS)  # the parse of a 300 KB body too
    threads = Threads(monkeypatch)
    threads.wrap(default_counter, "message_counts", lambda messages, *a, **k: len(messages))
    threads.wrap(message_facts, "message_digest")
    codec = CODECS[api]
    threads.wrap(codec, "parse")
    threads.wrap(codec, "check_items", lambda self, body, start: len(self.items(body)) - start)
    threads.wrap(Conversation, "to_bytes")
    path, body = request(api)
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db") as client:
        r = await client.post(path, content=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers.get("x-ctxproxy-degraded") is None
    assert threads.on_pool("message_counts") >= ITEMS and threads.on_loop("message_counts") < 10
    assert threads.on_pool("message_digest") >= ITEMS and threads.on_loop("message_digest") < 10
    assert threads.on_pool("parse") == 1 and threads.on_loop("parse") == 0
    assert threads.on_pool("check_items") >= ITEMS and threads.on_loop("check_items") == 0
    assert threads.on_pool("to_bytes") == 1 and threads.on_loop("to_bytes") == 0  # the status bar changed it


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_a_small_request_does_its_work_inline(api, upstream, tmp_path, monkeypatch):
    """No thread hop for little work: it would cost more than the work (offloop.INLINE_CHARS)."""
    monkeypatch.setattr(offloop, "INLINE_BODY_BYTES", offloop.INLINE_CHARS)  # the parse of a 300 KB body too
    threads = Threads(monkeypatch)
    threads.wrap(default_counter, "message_counts", lambda messages, *a, **k: len(messages))
    threads.wrap(CODECS[api], "parse")
    path, _ = request(api)
    body = {"chat": {"model": "gpt-4o", "messages": turns(3)}, "responses": {"model": "gpt-4o", "input": turns(3)},
            "messages": {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": turns(3)}}[api]
    async with asgi_proxy(upstream.base_url, f"sqlite:///{tmp_path}/ctx.db") as client:
        r = await client.post(path, content=json.dumps(body).encode(), headers=AUTH)
    assert r.status_code == 200, r.text
    assert threads.on_pool("message_counts") == 0 and threads.on_loop("message_counts") >= 3
    assert threads.on_pool("parse") == 0 and threads.on_loop("parse") == 1


def test_lightness_is_decided_by_the_total_and_within_a_bounded_walk():
    small = {"role": "user", "content": "x" * 150}
    assert offloop.is_light([small] * 3)
    assert not offloop.is_light([small] * 200)  # 30,000 characters all together
    assert not offloop.is_light([small] * 100_000)
    assert not offloop.is_light([{"role": "user", "content": [{"type": "text", "text": ""}] * 5_000}])


def _value(rng: random.Random, depth: int = 0) -> Any:
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(["a", "é\u2028", "😀\x00\"\\", 1, -2**70, 2**64 - 1, 1.5e300, 0.1, True, None, ""])
    if rng.random() < 0.5:
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["k", "ü", 'a"b']) + str(i): _value(rng, depth + 1) for i in range(rng.randint(0, 4))}


@pytest.mark.parametrize("style", [JsonStyle(), JsonStyle(compact=False), JsonStyle(ascii_only=True),
                                   JsonStyle(compact=False, ascii_only=True)])
def test_a_long_list_written_piece_by_piece_is_the_same_bytes(style):
    """The dump of a body with a long list is split to bound each C call; the bytes must not change."""
    rng = random.Random(23)
    for _ in range(5):
        body = {"model": "m", "messages": [_value(rng) for _ in range(PIECES_FROM + 7)], "x": _value(rng),
                "input": [_value(rng) for _ in range(PIECES_FROM)], "empty": []}
        whole = style._dump(body)
        assert style.dumps(body) == whole
        assert json.loads(whole) == json.loads(json.dumps(body))


class SlowStore:
    """A store that answers every call after `delay` seconds, as a healthy but remote backend would."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def get(self, key: str) -> bytes | None:
        await asyncio.sleep(self.delay)
        return b"v"

    async def ping(self) -> bool:
        await asyncio.sleep(self.delay)
        return True

    async def close(self) -> None:
        return None


async def block_loop(seconds: float) -> None:
    await asyncio.sleep(0)  # let the store call start first
    time.sleep(seconds)  # another task holding the loop (a big parse, a GC pass)


DEADLINE = 0.2


async def test_a_blocked_loop_does_not_count_against_the_store_deadline():
    g = GuardedStore(SlowStore(0.05), timeout=DEADLINE)  # type: ignore[arg-type]
    got, _ = await asyncio.gather(g.get("t:a:k"), block_loop(2 * DEADLINE))
    assert got == b"v" and not g.degraded and g.failures == 0
    ok, _ = await asyncio.gather(g.ping(), block_loop(2 * DEADLINE))
    assert ok
    await g.close()


async def test_a_store_slower_than_its_deadline_still_fails():
    g = GuardedStore(SlowStore(10 * DEADLINE), timeout=DEADLINE)  # type: ignore[arg-type]
    with pytest.raises(StoreError):
        await asyncio.gather(g.get("t:a:k"), block_loop(DEADLINE / 2))
    assert g.degraded
    await g.close()


async def test_a_blocked_loop_does_not_open_the_breaker_of_a_real_redis(redis_addr):
    """As the app opens it (open_store with store_timeout), in front of a real Redis whose replies come
    2.5 deadlines late while the loop is blocked for 2 of them: the store itself took half a deadline, so
    the call succeeds and the breaker stays closed."""
    with SlowRelay(redis_addr, 0.0) as relay:
        g = GuardedStore(open_store(relay.url, DEADLINE), timeout=DEADLINE)
        key = f"ctxproxy-test:{uuid.uuid4().hex}:k"
        assert await g.get(key) is None  # connected
        relay.delay = 2.5 * DEADLINE
        for _ in range(2):
            got, _ = await asyncio.gather(g.get(key), block_loop(2 * DEADLINE))
            assert got is None and not g.degraded
        await g.close()


@pytest.fixture
def redis_addr() -> tuple[str, int]:
    import socket

    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
    except OSError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    return ("127.0.0.1", 6379)
