"""The proxy's app (or the pass-through reference) in this process, driven through ASGI with no server.

Nothing here imports ``proxy`` at module level: ``--proxy-src`` must bind the
package first.
"""

from __future__ import annotations

import asyncio
from typing import Any


class AsgiApp:
    """The proxy's app in this process: lifespan started/stopped by hand, requests sent as ASGI calls."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lifespan: asyncio.Task[Any] | None = None
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def start(self) -> None:
        """Run the app's lifespan startup."""
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._lifespan = asyncio.create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._to_app.put({"type": "lifespan.startup"})
        msg = await asyncio.wait_for(self._from_app.get(), 60)
        if msg["type"] != "lifespan.startup.complete":
            raise SystemExit(f"proxy lifespan failed to start: {msg}")

    async def stop(self) -> None:
        """Run the app's lifespan shutdown."""
        await self._to_app.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(self._from_app.get(), 60)
        if self._lifespan is not None:
            await asyncio.wait_for(self._lifespan, 60)

    async def post(self, path: str, payload: bytes, api_key: str) -> tuple[int, bytes]:
        """One POST through the app; (status, body)."""
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8080), "state": {},
            "headers": [(b"host", b"127.0.0.1:8080"), (b"content-type", b"application/json"),
                        (b"authorization", f"Bearer {api_key}".encode()),
                        (b"content-length", str(len(payload)).encode())],
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": payload, "more_body": False}
            await asyncio.sleep(3600)  # never: the client does not disconnect
            return {"type": "http.disconnect"}

        status = 0
        chunks: list[bytes] = []

        async def send(msg: dict[str, Any]) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            elif msg["type"] == "http.response.body":
                chunks.append(msg.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


def passthrough_app(mock_url: str) -> Any:
    """The reference: what any proxy that reads the body and re-sends it pays, and nothing more.

    A FastAPI app with one route: ``orjson.loads`` of the body, ``orjson.dumps``
    of it, sent upstream with the proxy's own upstream client (same transport,
    same header handling), the answer read whole and returned. No route, tenant,
    session, pipeline, store, accounting or log. Measured like the proxy, the
    difference is the CPU ctxproxy adds on top of parsing, re-serialising and
    sending the bytes.
    """
    from contextlib import asynccontextmanager

    import orjson
    from fastapi import FastAPI
    from starlette.requests import Request
    from starlette.responses import Response

    from proxy.config import UpstreamSettings
    from proxy.upstream.client import Upstream, read_answer, request_headers

    settings = UpstreamSettings(base_url=mock_url)
    url = mock_url.rstrip("/") + "/chat/completions"
    held: dict[str, Upstream] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        held["upstream"] = Upstream()
        try:
            yield
        finally:
            await held["upstream"].aclose()

    async def chat(request: Request) -> Response:
        payload = orjson.dumps(orjson.loads(await request.body()))
        headers = request_headers(request.headers.items(), None, identity_encoding=True)
        resp = await held["upstream"].send("POST", url, headers, payload, settings)
        content = await read_answer(resp, url)
        return Response(content, status_code=resp.status_code, media_type="application/json")

    chat.__annotations__ = {"request": Request, "return": Response}  # real types, for FastAPI (future annotations)
    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])  # as the proxy's own route
    return app
