"""CPU-heavy work of one request, run off the event loop, so that no request stalls the others.

The proxy serves every request on one event loop. Tokenizing or hashing megabytes
there (a 10 MB tool result of one repeated letter takes tiktoken seconds) delays
every other request in flight, a `/healthz` included, by as long as it takes.
Such work runs here instead, on a small dedicated thread pool: tiktoken's encoder,
hashlib and RE2 release the GIL while they work, so the loop keeps serving, and
the rest (C calls over a text, such as `str.find`) hold it only for milliseconds.

Work on little data stays on the loop (`run_if`): a thread hop costs about 0.1 ms,
more than counting a few kilobytes. The pool leaves one core to the loop, and it
is FIFO; each request submits one bounded job at a time and awaits it, so the jobs
of concurrent requests interleave: a client's huge requests delay another
client's big messages by about a job each, and never a small request, which
submits nothing.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

__all__ = ["INLINE_CHARS", "JOB_CHARS", "WORKERS", "run", "run_if"]

# Work on fewer characters than this runs inline, on the loop: at most a few milliseconds of
# tokenizing even for the slowest text (one repeated letter).
INLINE_CHARS = 16_384
# Messages are handed to the pool in jobs of about this many characters (a bigger message is a job alone).
JOB_CHARS = 1 << 20
# Threads of the pool: all cores but the event loop's.
WORKERS = max(1, (os.cpu_count() or 2) - 1)

P = ParamSpec("P")
T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ctxproxy-cpu")
    return _pool


async def run(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` on the pool; the caller's coroutine waits, the loop does not."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


async def run_if(size: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(...)` on the pool when it works on `size` >= INLINE_CHARS characters, else inline."""
    if size < INLINE_CHARS:
        return fn(*args, **kwargs)
    return await run(fn, *args, **kwargs)
