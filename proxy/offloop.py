"""CPU-heavy work of one request, run off the event loop, so that no request stalls the others.

The proxy serves every request on one event loop. Tokenizing or hashing megabytes
there (a 10 MB tool result of one repeated letter takes tiktoken seconds) delays
every other request in flight, a `/healthz` included, by as long as it takes.
Such work runs here instead, on a small dedicated thread pool: tiktoken's encoder,
hashlib and RE2 release the GIL while they work, so the loop keeps serving, and
the rest (C calls over a text, such as `str.find`) hold it only for milliseconds.

Work on little data stays on the loop (`run_if`, `run_unless_light`): a thread hop
costs about 0.1 ms, more than counting a few kilobytes. "Little" is decided by the
total work, never per piece: 100,000 items of 150 characters are 15 MB of work
although each item is small (`is_light` walks them with a budget, so deciding is
bounded too, whatever their number or shape). Pure-Python work in the pool still
takes the GIL, but gives it back to the loop every switch interval (5 ms), so a
step of the loop is bounded whatever the request; a single C call that holds the
GIL (orjson, a dump) is kept bounded by its callers (proxy/wire/jsonio.py). The pool leaves one core to the loop, and it
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
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

__all__ = ["INLINE_BODY_BYTES", "INLINE_CHARS", "INLINE_ITEMS", "INLINE_NODES", "JOB_CHARS", "JOB_ITEMS",
           "STEP_ITEMS", "WORKERS", "body_is_light", "is_light", "run", "run_if", "run_unless_light", "spans"]

# Work on fewer characters than this runs inline, on the loop: at most a few milliseconds of
# tokenizing even for the slowest text (one repeated letter).
INLINE_CHARS = 16_384
# ... and fewer JSON values (objects, arrays, strings, numbers) than this: walking them costs too.
INLINE_NODES = 2_048
# Whole-body steps (parse, render and dump, the accounting measure) stay on the loop for a body under this
# many bytes and of fewer items than INLINE_ITEMS: a few milliseconds at most, and cheaper there than a
# thread hop and the GIL contention of doing it on the pool (a 200-message, 560 KB conversation: ~3 ms).
INLINE_BODY_BYTES = 1 << 20
INLINE_ITEMS = 1_000
# Messages are handed to the pool in jobs of about this many characters (a bigger message is a job alone) ...
JOB_CHARS = 1 << 20
# ... and at most this many messages (what the loop merges of one job's answer stays a short step).
JOB_ITEMS = 4_096
# A walk over a request's items that stays on the loop (it reads or feeds state of the request shared with the
# loop's other steps) gives the loop a turn (`spans`) every this many items: a few milliseconds of Python each.
STEP_ITEMS = 2_048
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


def body_is_light(size: int, items: int = 0) -> bool:
    """Whether a whole-body step on a body of `size` bytes and `items` items is little enough for the loop."""
    return size < INLINE_BODY_BYTES and items < INLINE_ITEMS


def is_light(values: Sequence[Any]) -> bool:
    """Whether the work on these JSON values, all together, is little enough for the loop: fewer than
    INLINE_CHARS characters in their strings and fewer than INLINE_NODES values. The walk stops as soon
    as either bound is passed, so the answer itself costs at most INLINE_NODES steps."""
    if len(values) >= INLINE_NODES:
        return False
    chars, nodes, stack = 0, 0, list(values)
    while stack:
        o = stack.pop()
        nodes += 1
        t = type(o)
        if t is str:
            chars += len(o)
        elif t is dict:
            stack.extend(o.values())
            chars += sum(map(len, o))  # its keys are hashed and counted too
        elif t is list:
            stack.extend(o)
        if chars >= INLINE_CHARS or nodes + len(stack) >= INLINE_NODES:
            return False
    return True


async def run_unless_light(values: Sequence[Any], fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(...)` inline when its work is on `values` that are light (`is_light`), else on the pool."""
    if is_light(values):
        return fn(*args, **kwargs)
    return await run(fn, *args, **kwargs)



async def spans(start: int, stop: int) -> AsyncIterator[range]:
    """range(start, stop) in spans of STEP_ITEMS, for a walk on the loop: between two spans the loop serves the
    others once (`asyncio.sleep(0)`); the walk resumes where it was, so its result is unchanged. A walk of
    fewer items is one span and never yields."""
    for lo in range(start, stop, STEP_ITEMS):
        if lo > start:
            await asyncio.sleep(0)
        yield range(lo, min(stop, lo + STEP_ITEMS))
