"""Read what the mock upstream waits from its sleeps, not from a clock.

`SleepSpy` stands in for the `asyncio` module in the mock's modules (monkeypatch
`mock_upstream.asyncio` and `_mock_stream.asyncio`): everything is the real
asyncio, except that `sleep` records the seconds it was asked for, then sleeps.
With `before_each`, each sleep first runs that hook in a worker thread (e.g. to
wait until the client has what was sent so far).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class SleepSpy:
    def __init__(self, before_each: Callable[[], Any] | None = None) -> None:
        self.slept: list[float] = []
        self.hooked: list[Any] = []  # what before_each returned, one per sleep
        self._before_each = before_each

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float, result: Any = None) -> Any:
        self.slept.append(seconds)
        if self._before_each is not None:
            self.hooked.append(await asyncio.to_thread(self._before_each))
        return await asyncio.sleep(seconds, result)
