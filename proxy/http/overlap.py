"""Work done while the provider is answering: the proxy's CPU time overlaps the provider's, not adds to it.

Once a request is on the wire the handler only waits for the answer's headers. What it does next with the
request as sent (measuring it for the ledger, remembering it for the session's next turn) depends on the
request alone, so it can be done in that wait: for a 150k-token conversation the measure takes milliseconds
that the provider spends anyway reading the body.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

R = TypeVar("R")
W = TypeVar("W")

# Loop turns given to the send before the work starts: in the first the send's task takes a kept-alive connection
# and starts writing the request to it.
SEND_TURNS = 1


async def while_answered(answer: Coroutine[Any, Any, R], work: Callable[[], Awaitable[W]]) -> tuple[R, W]:
    """`answer` (a request to the provider) and `work` done meanwhile; both results, the answer's errors first.

    When `work` fails the request is cancelled (nothing waits for it any more)."""
    task = asyncio.ensure_future(answer)
    try:
        for _ in range(SEND_TURNS):
            await asyncio.sleep(0)
        done = await work()
    except BaseException:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise
    return await task, done
