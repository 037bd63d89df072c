"""POST /v1/chat/completions: the request path, top to bottom.

parse → route → tenant/session → pipeline → upstream → stream back → log.
Each step is a call into its own module; this function only sequences them.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Callable

from starlette.requests import Request
from starlette.responses import Response

import httpx

from proxy import toolloop
from proxy.archive import Archive
from proxy.conversation import Conversation, RequestContext
from proxy.errors import ProxyError
from proxy.learned_windows import overflow_limit
from proxy.logs import event
from proxy.pipeline import run_pipeline
from proxy.responses import error_response, read_body, relay_response, relay_stream
from proxy.routing import api_key_of, resolve_route, session_id, tenant_id
from proxy.state import ProxyState, state_of
from proxy.toolloop import Rounds
from proxy.windows import context_window
from proxy.upstream import iter_raw, read_body as read_upstream_body, request_headers, response_headers, upstream_url

SSE = "text/event-stream"


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


async def chat_completions(request: Request) -> Response:
    st = state_of(request)
    t0 = time.perf_counter()
    log = {"request_id": new_request_id(), "path": request.url.path}
    headers = {"x-ctxproxy-request-id": log["request_id"]}
    try:
        raw = await read_body(request, st.settings.server.max_body_bytes)
        conv = Conversation.parse(raw)
        model = conv.body.get("model")
        route = resolve_route(st.settings, request.path_params.get("route"), request.headers, model)
        tenant = tenant_id(api_key_of(request.headers), st.settings.tenant_salt)
        session = session_id(request.headers, tenant, route, conv.body)
        stream = conv.body.get("stream") is True
        log.update(route=route.name, model=model, session=session, tenant=tenant, stream=stream,
                   messages=len(conv.messages), bytes_in=len(raw))
        headers.update({"x-ctxproxy-route": route.name, "x-ctxproxy-session": session})
        out_headers = request_headers(request.headers.items(), route.upstream, identity_encoding=True)
        window = context_window(st.settings, model, route.context_window)
        learned = await st.windows.get(route.name, model)
        ctx = RequestContext(request_id=log["request_id"], route=route, tenant=tenant, session=session,
                             model=model, stream=stream, store=st.store, window=min(window, learned or window),
                             upstream=st.upstream, upstream_headers=out_headers)

        conv = await run_pipeline(st.pipelines[route.name], conv, ctx)

        url = upstream_url(route.upstream, "chat/completions", request.url.query)

        async def send(payload: bytes) -> httpx.Response:
            return await st.upstream.send("POST", url, out_headers, payload, route.upstream)

        t_sent = time.perf_counter()
        resp = await send(conv.to_bytes())
        if resp.status_code == 400 and model:
            resp, conv = await _retry_if_overflow(st, resp, url, send, conv, ctx, headers)
        log.update(rewritten=conv.changed, **_event_fields(conv))
        headers.update(_event_headers(conv))
    except ProxyError as err:
        _finish(log, t0, status=err.status, error=err.code)
        return error_response(err, headers)
    t_head = time.perf_counter()
    log.update(overhead_ms=round((t_sent - t0) * 1000, 3), upstream_headers_ms=round((t_head - t_sent) * 1000, 3))
    headers_out = response_headers(resp.headers, decoded=True) + list(headers.items())
    rounds = None
    if conv.read_tool is not None and conv.body.get("n") in (None, 1):
        rounds = Rounds(conv, conv.read_tool, Archive(st.store, tenant))

    if resp.headers.get("content-type", "").startswith(SSE):
        chunks = iter_raw(resp, url) if rounds is None else toolloop.stream(send, resp, url, rounds)
        return relay_stream(_relay_sse(chunks, resp.status_code, log, t0, rounds), resp.status_code, headers_out)
    try:
        if rounds is None:
            content = await read_upstream_body(resp, url)
        else:
            resp, content = await toolloop.complete(send, resp, url, rounds)
            headers_out = response_headers(resp.headers, decoded=True) + list(headers.items())
            log["read_rounds"] = rounds.done
    except ProxyError as err:
        _finish(log, t0, status=err.status, error=err.code)
        return error_response(err, headers)
    _finish(log, t0, status=resp.status_code, bytes_out=len(content))
    return relay_response(content, resp.status_code, headers_out)


async def _retry_if_overflow(st: ProxyState, resp: httpx.Response, url: str, send: Callable, conv: Conversation,
                             ctx: RequestContext, headers: dict[str, str]) -> tuple[httpx.Response, Conversation]:
    """On `context_length_exceeded`, learn the window it names, compact to fit, and try once more."""
    content = await read_upstream_body(resp, url)
    limit = overflow_limit(content)
    if limit is None or limit >= ctx.window:
        return _replayed(resp, content), conv
    await st.windows.learn(ctx.route.name, ctx.model or "", limit)
    headers["x-ctxproxy-window-learned"] = str(limit)
    event("learned context window from provider", request_id=ctx.request_id, route=ctx.route.name,
          model=ctx.model, window=limit)
    ctx = dataclasses.replace(ctx, window=limit)
    conv = await run_pipeline(st.pipelines[ctx.route.name], Conversation.parse(conv.raw), ctx)
    return await send(conv.to_bytes()), conv


def _replayed(resp: httpx.Response, content: bytes) -> httpx.Response:
    """A response whose body was already read, readable again by the code after it."""
    return httpx.Response(resp.status_code, headers=resp.headers, content=content, request=resp.request)


def _event_fields(conv: Conversation) -> dict[str, object]:
    kinds = [e.kind for e in conv.events]
    return {"events": kinds} if kinds else {}


def _event_headers(conv: Conversation) -> dict[str, str]:
    """What the proxy did to this request, for the client to see."""
    out = {}
    offloads = [e for e in conv.events if e.kind == "offload"]
    if offloads:
        out["x-ctxproxy-offloaded"] = str(len(offloads))
        out["x-ctxproxy-tokens-saved"] = str(sum(e.detail["saved"] for e in offloads))
    for e in conv.events:
        if e.kind == "compaction":
            out["x-ctxproxy-compaction"] = str(e.detail["version"])
        elif e.kind == "compact":
            out["x-ctxproxy-compacted"] = e.detail["layer"]
            out["x-ctxproxy-tokens-before"] = str(e.detail["before"])
            out["x-ctxproxy-tokens-after"] = str(e.detail["after"])
    if any(e.kind == "degraded" for e in conv.events):
        out["x-ctxproxy-degraded"] = "store-unavailable"
    return out


async def _relay_sse(chunks: AsyncIterator[bytes], status: int, log: dict, t0: float,
                     rounds: Rounds | None) -> AsyncIterator[bytes]:
    """Chunk by chunk as they arrive; a broken upstream ends the stream with an SSE error event, not a hang."""
    sent = 0
    error = None
    first: float | None = None
    try:
        async for chunk in chunks:
            if first is None:
                first = time.perf_counter()
            sent += len(chunk)
            yield chunk
    except ProxyError as err:
        status, error = err.status, err.code
        yield b"data: " + err.body() + b"\n\n"
    finally:
        if first is not None:
            log["ttfb_ms"] = round((first - t0) * 1000, 3)
        if rounds is not None:
            log["read_rounds"] = rounds.done
        _finish(log, t0, status=status, bytes_out=sent, error=error)


def _finish(log: dict, t0: float, **fields: object) -> None:
    log.update({k: v for k, v in fields.items() if v is not None})
    log["total_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    event("request", **log)
