"""The status bar's session clock (proxy/rewrite/status_bar/clock.py): in memory when no other process serves the
session, from the store when one may; the store kept current for a restart either way."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from proxy.request import RequestContext
from proxy.rewrite.status_bar.clock import SessionClock
from proxy.store.keys import session_key
from proxy.store.sqlite import SqliteStore


class Counted(SqliteStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.gets = 0

    async def get_json(self, key: str) -> Any | None:
        self.gets += 1
        return await super().get_json(key)


def ctx(store: SqliteStore, shared: bool) -> RequestContext:
    return cast(RequestContext, SimpleNamespace(tenant="t1", session="s1", shared=shared, store=store))


KEY = session_key("t1", "s1", "clock")


@pytest.fixture
async def store(tmp_path):
    s = Counted(str(tmp_path / "c.db"))
    yield s
    await s.close()


async def settle(clock: SessionClock) -> None:
    await asyncio.gather(*clock._writes)


async def test_one_process_reads_the_store_once_and_keeps_it_current(store):
    await store.put_json(KEY, {"first": 100.0, "last": 150.0})  # from before a restart
    clock = SessionClock()
    assert await clock.tick(ctx(store, False), 200.0) == {"first": 100.0, "last": 150.0}
    assert await clock.tick(ctx(store, False), 260.0) == {"first": 100.0, "last": 200.0}
    assert await clock.tick(ctx(store, False), 300.0) == {"first": 100.0, "last": 260.0}
    assert store.gets == 1
    await settle(clock)
    assert await store.get_json(KEY) == {"first": 100.0, "last": 300.0}  # what the next restart reads
    again = SessionClock()  # a restart
    assert await again.tick(ctx(store, False), 400.0) == {"first": 100.0, "last": 300.0}


async def test_a_new_session_starts_its_clock_now(store):
    clock = SessionClock()
    assert await clock.tick(ctx(store, False), 50.0) == {"first": 50.0, "last": 50.0}
    assert await clock.tick(ctx(store, False), 70.0) == {"first": 50.0, "last": 50.0}


async def test_shared_sessions_read_what_another_process_wrote(store):
    clock = SessionClock()
    assert await clock.tick(ctx(store, True), 10.0) == {"first": 10.0, "last": 10.0}
    await store.put_json(KEY, {"first": 10.0, "last": 42.0})  # another replica served the session meanwhile
    assert await clock.tick(ctx(store, True), 50.0) == {"first": 10.0, "last": 42.0}
    assert store.gets == 2 and await store.get_json(KEY) == {"first": 10.0, "last": 50.0}
