"""The proxy app in-process, driven through httpx.ASGITransport (no server, no port), its lifespan run.

For tests that look at what the proxy does with one request (its status, its
error shape, which thread did its work), not at the wire: cheaper than a
uvicorn server per test. The upstream is still the real-HTTP mock.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from proxy_server import make_settings

from proxy.app import create_app


@asynccontextmanager
async def asgi_proxy(upstream_url: str, store: str, **raw: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose requests the app answers in this event loop; settings as make_settings takes them."""
    app = create_app(make_settings(upstream_url, store, **raw))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ctxproxy", timeout=120) as client:
            yield client
