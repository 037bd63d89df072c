"""`ctxproxy check`'s questions to the outside: does the store answer, does each upstream answer.

Each answer is one line, or None when all is well. Short deadlines: `check` is
run by people and by deploy scripts, and must say "unreachable" in seconds.
Asking never changes anything: an SQLite file that does not exist yet is not
created (serve creates it), and an upstream is sent one unauthenticated GET,
whose status, whatever it is, proves it reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from pathlib import Path

from proxy.store import SQLITE_URL_HEAD, StoreError, open_store
from proxy.store.guarded import ask_backend

PROBE_TIMEOUT_S = 3.0  # seconds for the store, and for each upstream, to answer `check`


def sqlite_problem(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why an SQLite store cannot be used, without creating its file; None when it can."""
    path = url[len(SQLITE_URL_HEAD):]
    if path == ":memory:":
        return None
    file = Path(path)
    if not file.exists():
        parent = file.parent.resolve()
        if not parent.is_dir():
            return f"the directory {parent} does not exist"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"the directory {parent} is not writable (the file does not exist yet)"
        return None
    try:
        conn = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True, timeout=timeout)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as e:
        return f"{file}: {e}"
    return None


def store_problem(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the store a URL names does not answer, in one line; None when it does."""
    if url[:len(SQLITE_URL_HEAD)].lower() == SQLITE_URL_HEAD:
        return sqlite_problem(url, timeout)

    async def ask() -> str | None:
        store = open_store(url, timeout)
        try:
            return await ask_backend(store, timeout)
        finally:
            with contextlib.suppress(StoreError, TimeoutError):
                async with asyncio.timeout(timeout):
                    await store.close()
    return asyncio.run(ask())


def upstream_problems(base_urls: list[str], timeout: float = PROBE_TIMEOUT_S) -> dict[str, str | None]:
    """For each base URL: why `GET {base}/models` got no HTTP answer at all (None: it got one), asked at once."""
    import httpx

    async def one(client: httpx.AsyncClient, base: str) -> str | None:
        try:
            await client.get(base + "/models")
        except httpx.TimeoutException:
            return f"no answer within {timeout:g}s"
        except httpx.HTTPError as e:
            return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        return None

    async def ask() -> dict[str, str | None]:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
            answers = await asyncio.gather(*(one(client, b) for b in base_urls))
        return dict(zip(base_urls, answers))
    return asyncio.run(ask())
