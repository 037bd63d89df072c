"""The floor: a bare FastAPI + aiohttp pass-through, the least any Python proxy on ctxproxy's stack can add.

    python -m bench.overhead.floor --port P --upstream http://127.0.0.1:M/v1

``POST /v1/chat/completions``, ``/v1/responses`` and ``/v1/messages`` forward
the request body, as bytes (never parsed), with the client's ``Authorization``,
``X-Api-Key``, ``Anthropic-Version`` and ``Content-Type``, to the same path
under the upstream's base URL through one ``aiohttp.ClientSession`` shared
by every request, and returns the upstream's status, content type and body; a
``text/event-stream`` answer is streamed back chunk by chunk as it arrives.
``GET /healthz`` answers 200. It is served as ``ctxproxy serve`` is: uvicorn,
uvloop + httptools, one worker, no access log, no server or date header, the
same keep-alive timeout. The overhead benchmark runs it beside ctxproxy; the
difference between the two is what ctxproxy's own work costs on the wire.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

KEEP_ALIVE_TIMEOUT = 5.0  # seconds, ctxproxy's default (server.keep_alive_timeout)
FORWARDED = ("authorization", "x-api-key", "anthropic-version", "content-type")


def create_floor_app(upstream: str) -> FastAPI:
    """The pass-through app in front of `upstream` (an OpenAI-style base URL ending in /v1)."""
    base = upstream.rstrip("/")
    held: dict[str, aiohttp.ClientSession] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=100, keepalive_timeout=600)
        held["session"] = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                timeout=aiohttp.ClientTimeout(total=300),
                                                skip_auto_headers=("User-Agent",))
        try:
            yield
        finally:
            await held["session"].close()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k in FORWARDED}
        resp = await held["session"].post(base + request.url.path.removeprefix("/v1"), data=body, headers=headers)
        media_type = resp.headers.get("content-type", "application/json")
        if media_type.startswith("text/event-stream"):
            return StreamingResponse(_relay(resp), status_code=resp.status, media_type=media_type)
        try:
            content = await resp.read()
        finally:
            resp.release()
        return Response(content, status_code=resp.status, media_type=media_type)

    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', media_type="application/json")

    app.add_api_route("/v1/chat/completions", forward, methods=["POST"], response_model=None)
    app.add_api_route("/v1/responses", forward, methods=["POST"], response_model=None)
    app.add_api_route("/v1/messages", forward, methods=["POST"], response_model=None)
    app.add_api_route("/healthz", healthz, methods=["GET"], response_model=None)
    return app


async def _relay(resp: Any) -> AsyncIterator[bytes]:
    """The upstream's stream, chunk by chunk as it arrives; the connection goes back to the pool at the end."""
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    finally:
        resp.release()


def main(argv: list[str] | None = None) -> int:
    """Serve the floor until interrupted."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="the provider's base URL, e.g. http://127.0.0.1:M/v1")
    args = ap.parse_args(argv)
    uvicorn.run(create_floor_app(args.upstream), host=args.host, port=args.port, loop="uvloop", http="httptools",
                access_log=False, log_config=None, server_header=False, date_header=False,
                timeout_keep_alive=KEEP_ALIVE_TIMEOUT, timeout_graceful_shutdown=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
