"""The FastAPI application: routes, lifespan, the error handlers registered, the browser guard outermost."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from proxy.config import ServerSettings, Settings, load_settings
from proxy.errors import ProxyError
from proxy.http import ctx_api
from proxy.http.answers import CountEveryAnswer
from proxy.http.error_handlers import http_error, proxy_error, unexpected_error
from proxy.http.local_guard import origin_refusal, refuse
from proxy.http.responses_ws import responses_websocket
from proxy.http.turns import compress, count_tokens, passthrough, retrieve, turns
from proxy.logs import flush_logs
from proxy.redact import redact, register_settings
from proxy.state import ProxyState, state_of
from proxy.store import open_store
from proxy.store.guarded import GuardedStore
from proxy.telemetry import setup as setup_tracing
from proxy.tokens.encodings import SHIPPED_ENCODINGS, ensure_encodings, get_encoding
from proxy.upstream.client import Upstream
from proxy.wire.apis import APIS, ROOTS

GC_YOUNG_THRESHOLD = 10_000  # allocations between two young-generation passes (CPython's default: 700)
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_NO_FRAMEWORK_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False,
                                             "operation_spans": False}


class _App(FastAPI):
    """FastAPI with the browser guard outermost (proxy/http/local_guard.py): a request from a web page whose origin
    is not allowed is refused before anything of it is read; every other request, and the lifespan, go on."""

    server: ServerSettings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = _header(scope, b"origin") if scope["type"] != "lifespan" else None
        if origin is not None:  # sent by browsers alone
            refusal = origin_refusal(origin, _header(scope, b"host"), self.server)
            if refusal is not None:
                scope["app"] = self
                await refuse(refusal, scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k == name:
            return str(v.decode("latin-1"))
    return None


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; settings default to config file / environment / built-ins."""
    settings = settings or load_settings()
    register_settings(settings)  # its passwords and keys masked wherever printed, in every worker

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ensure_encodings()
        for name in SHIPPED_ENCODINGS:
            get_encoding(name)  # load now, not in the first request (~200 ms)
        store = GuardedStore(open_store(settings.store, settings.store_timeout), timeout=settings.store_timeout,
                             name=settings.store)
        # a store down at start is a warning in the first lines of the log (it still serves), and one plain line on
        # stderr for whoever started it (a worker of `serve --workers N` each says it); its URL's password masked
        reason = await store.problem()
        if reason is not None:
            print(redact(f"ctxproxy: warning: store {store.name} is unreachable ({reason}); requests are forwarded "
                         f"unmodified until it answers"), file=sys.stderr, flush=True)
        upstream = Upstream(trust_env=settings.trust_env)
        tracing = store.tracing = setup_tracing(settings.otel_env)  # OFF unless OTEL_* say (README: Tracing)
        app.state.proxy = ProxyState.create(settings, upstream, store, tracing)
        # Start-up objects (tokenizers, modules) never die: keep them out of the
        # collector's full passes, which otherwise stall every in-flight request.
        gc.collect()
        gc.freeze()
        # A request's objects die by reference count; the collector only finds cycles, but each young-generation
        # pass walks every container still alive - the in-flight requests' - and at the default 700 allocations
        # a request paid several. Fewer, larger passes walk them less often (cycles wait a little longer).
        gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        try:
            yield
        finally:
            # the upstream first: a summary answered until it closes is accounted as it arrives, then written here
            await upstream.aclose()
            await app.state.proxy.accounting.drain()
            await store.close()
            if tracing.on:  # the spans still queued are exported before the process goes
                await asyncio.to_thread(tracing.shutdown)
            flush_logs()  # the last requests' lines, before the process may be ended by the signal it got

    # FastAPI's own OpenTelemetry spans and metrics off: the proxy traces its requests itself (proxy/telemetry/,
    # off unless OTEL_* say), and a process with a global provider set would get a second SERVER span for every
    # request. Off, FastAPI also stops asking the global providers whether they are set on every request.
    app = _App(title="ctxproxy", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
               telemetry=_NO_FRAMEWORK_TELEMETRY)
    app.server = settings.server

    # The proxied paths are plain Starlette routes: they take the raw request, so FastAPI's per-request
    # dependency and validation machinery would be pure overhead on the hot path. The registry's APIs (APIS)
    # come first: the router tries routes in order, and no other path starts with an API's root (/v1/, /v1beta/)
    # or /r/, so the proxy's own endpoints after them answer exactly as before.
    for prefix in ("", "/r/{route}"):
        for api in APIS:
            app.add_route(prefix + api.path, count_tokens(api.codec) if api.counts else turns(api.codec),
                          methods=["POST"])
    for prefix in ("", "/r/{route}"):
        app.add_route(prefix + "/v1/compress", compress, methods=["POST"])  # a gateway's engine (Headroom's contract)
        app.add_route(prefix + "/v1/retrieve/{hash}", retrieve, methods=["GET"])
        for api in APIS:
            if api.websocket:
                app.add_api_websocket_route(prefix + api.path, responses_websocket)
        for root in ROOTS:
            app.add_route(prefix + root + "/{path:path}", passthrough, methods=ALL_METHODS)
    app.add_api_route("/healthz", healthz, methods=["GET"])
    app.add_api_route("/readyz", readyz, methods=["GET"])
    app.add_api_route("/metrics", ctx_api.metrics, methods=["GET"])
    app.add_api_route("/ctx/ui", ctx_api.dashboard, methods=["GET"])
    app.add_api_route("/ctx/v1/stats", ctx_api.get_stats, methods=["GET"])
    app.add_api_route("/ctx/v1/sessions", ctx_api.list_sessions, methods=["GET"])
    app.add_api_route("/ctx/v1/sessions/{session:path}/requests/{n}", ctx_api.get_request, methods=["GET"])
    app.add_api_route("/ctx/v1/sessions/{session:path}", ctx_api.get_session, methods=["GET"])
    app.add_api_route("/ctx/v1/blobs/{handle}", ctx_api.get_blob, methods=["GET"])

    app.add_middleware(CountEveryAnswer)  # inside the outermost 500 handler: it sees every answer but that one
    app.add_exception_handler(ProxyError, proxy_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, unexpected_error)
    return app


async def healthz(request: Request) -> Response:
    """The process is up and serving; `worker`: which process answered (`serve --workers N`: one of N)."""
    return JSONResponse({"status": "ok", "worker": os.getpid()})


async def readyz(request: Request) -> Response:
    """Ready when the store answers; a load balancer keeps traffic away otherwise."""
    ok = await state_of(request).store.ping()
    return JSONResponse({"status": "ready" if ok else "store unreachable", "store": ok}, status_code=200 if ok else 503)
