"""POST /v1/chat/completions: the request path, top to bottom.

parse → route/tenant/session → pipeline → upstream (learning the window on
overflow) → hidden read-back rounds → stream back → account and log.
Each step is a call into its own module; this file only sequences them.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy import toolloop
from proxy.accounting import Outcome, usage_from_events
from proxy.archive import Archive
from proxy.compaction import reserve_tokens
from proxy.conversation import Conversation, RequestContext
from proxy.errors import ProxyError, UpstreamUnreachable, error_body
from proxy.figures import carry_events, measure
from proxy.learned_windows import overflow_limit
from proxy.logs import event, log as logger
from proxy.pipeline import run_pipeline
from proxy.report import event_fields, event_headers
from proxy.responses import error_response, read_body, relay_response, relay_stream
from proxy.round_usage import hidden_usage, summed_body, summed_stream
from proxy.routing import api_key_of, resolve_route, session_id, tenant_id
from proxy.sse import StreamCutShort, account_stream
from proxy.state import ProxyState, state_of
from proxy.toolloop import Rounds
from proxy.upstream import iter_raw, read_body as read_upstream_body, request_headers, response_headers, upstream_url
from proxy.usage import Usage, usage_of_body
from proxy.windows import context_window

SSE = "text/event-stream"
Send = Callable[[bytes], Awaitable[httpx.Response]]


def new_request_id() -> str:
    return "req_" + secrets.token_hex(8)


async def chat_completions(request: Request) -> Response:
    st = state_of(request)
    t0 = time.perf_counter()
    log: dict[str, object] = {"request_id": new_request_id(), "path": request.url.path}
    headers = {"x-ctxproxy-request-id": str(log["request_id"])}
    ctx: RequestContext | None = None
    t_sent = t0
    try:
        raw = await read_body(request, st.settings.server)
        conv = Conversation.parse(raw)
        try:
            ctx = await _context(st, request, conv, str(log["request_id"]))
        except Exception:
            conv.check_messages()  # a bad body is reported first, as it always has been
            raise
        conv.check_messages(st.memo.recall(ctx.tenant, ctx.session, conv))
        log.update(route=ctx.route.name, model=ctx.model, session=ctx.session, tenant=ctx.tenant, stream=ctx.stream,
                   messages=len(conv.messages), bytes_in=len(raw))
        headers.update({"x-ctxproxy-route": ctx.route.name, "x-ctxproxy-session": ctx.session})
        conv = await run_pipeline(st.pipelines[ctx.route.name], conv, ctx)
        hide_usage = _ask_for_usage(conv, ctx)
        url = upstream_url(ctx.route.upstream, "chat/completions", request.url.query)

        async def send(payload: bytes) -> httpx.Response:
            return await st.upstream.send("POST", url, ctx.upstream_headers, payload, ctx.route.upstream)

        t_sent = time.perf_counter()
        resp = await send(conv.to_bytes())
        if resp.status_code == 400 and ctx.model:
            resp, conv, ctx = await _retry_if_overflow(st, resp, url, send, conv, ctx, headers)
    except ProxyError as err:
        if ctx is not None and t_sent > t0:  # it reached the upstream step: a failed request, counted as one
            failed = Outcome(status=err.status, error=err.code, overhead_s=t_sent - t0, own=usage_from_events(conv))
            trace = st.accounting.trace(conv, ctx)
            figures = measure(conv, trace)
            log.update(st.accounting.record(ctx, conv, trace, await st.accounting.check(ctx, trace), failed, figures))
        _finish(log, t0, status=err.status, error=err.code)
        return error_response(err, headers)

    outcome = Outcome(overhead_s=t_sent - t0, upstream_s=time.perf_counter() - t_sent,
                      own=usage_from_events(conv), accepted=resp.status_code < 300)
    trace = st.accounting.trace(conv, ctx)
    figures = measure(conv, trace)
    st.memo.keep(ctx.tenant, ctx.session, conv)
    check = await st.accounting.check(ctx, trace)
    headers.update(event_headers(conv, figures, check))
    log.update(rewritten=conv.changed, overhead_ms=round(outcome.overhead_s * 1000, 3),
               upstream_headers_ms=round(outcome.upstream_s * 1000, 3), **event_fields(conv))

    def done(status: int, error: str | None = None, **fields: object) -> None:
        outcome.status, outcome.error = status, error
        if rounds is not None:
            log["read_rounds"] = rounds.done
            if outcome.usage is None:  # the turn failed after hidden rounds the provider billed
                outcome.usage = hidden_usage(rounds)
        log.update(st.accounting.record(ctx, conv, trace, check, outcome, figures, rounds))
        _finish(log, t0, status=status, error=error, **fields)

    rounds = None
    if conv.read_tool is not None and conv.body.get("n") in (None, 1):
        rounds = Rounds(conv, conv.read_tool, Archive(st.store, ctx.tenant))
    headers_out = response_headers(resp.headers, decoded=True) + list(headers.items())

    if resp.headers.get("content-type", "").startswith(SSE):
        chunks = iter_raw(resp, url) if rounds is None else summed_stream(toolloop.stream(send, resp, url, rounds),
                                                                          rounds)

        def on_usage(u: Usage) -> None:
            outcome.usage = u

        relay = _relay_sse(account_stream(chunks, on_usage, hide_usage), resp.status_code, log, t0, done)
        return relay_stream(relay, resp.status_code, headers_out)
    try:
        if rounds is None:
            content = await read_upstream_body(resp, url)
        else:
            resp, content = await toolloop.complete(send, resp, url, rounds)
            if resp.status_code == 200:
                content = summed_body(content, rounds)
            headers["x-ctxproxy-read-rounds"] = str(rounds.done)
            headers_out = response_headers(resp.headers, decoded=True) + list(headers.items())
    except ProxyError as err:
        done(err.status, err.code)
        return error_response(err, headers)
    if resp.status_code == 200:
        try:
            outcome.usage = usage_of_body(orjson.loads(content))
        except orjson.JSONDecodeError:
            pass
    done(resp.status_code, bytes_out=len(content))
    return relay_response(content, resp.status_code, headers_out)


async def _context(st: ProxyState, request: Request, conv: Conversation, request_id: str) -> RequestContext:
    model = conv.body.get("model")
    route = resolve_route(st.settings, request.path_params.get("route"), request.headers, model)
    tenant = tenant_id(api_key_of(request.headers), st.settings.tenant_salt)
    window = context_window(st.settings, model, route.context_window)
    learned = await st.windows.get(tenant, route.name, model)
    return RequestContext(request_id=request_id, route=route, tenant=tenant,
                          session=session_id(request.headers, tenant, route, conv.body), model=model,
                          stream=conv.body.get("stream") is True, store=st.store,
                          archive_quota=st.settings.store_quota_bytes,
                          window=min(window, learned or window), upstream=st.upstream,
                          upstream_headers=request_headers(request.headers.items(), route.upstream,
                                                           identity_encoding=True))


def _ask_for_usage(conv: Conversation, ctx: RequestContext) -> bool:
    """Streams are asked for their usage chunk; True if the client did not ask (so it is hidden again)."""
    if not ctx.stream:
        return False
    options = conv.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    conv.body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
    conv.changed = True
    return True


async def _retry_if_overflow(st: ProxyState, resp: httpx.Response, url: str, send: Send, conv: Conversation,
                             ctx: RequestContext, headers: dict[str, str]
                             ) -> tuple[httpx.Response, Conversation, RequestContext]:
    """On `context_length_exceeded`, learn the window it names, compact to fit, and try once more."""
    content = await read_upstream_body(resp, url)
    messages = conv.body.get("messages") or []
    sent = sum(conv.facts.counts(messages)) + reserve_tokens(conv.body)
    limit = overflow_limit(content, sent)
    if limit is None or limit >= ctx.window:
        return httpx.Response(resp.status_code, headers=resp.headers, content=content, request=resp.request), conv, ctx
    await st.windows.learn(ctx.tenant, ctx.route.name, ctx.model or "", limit)
    headers["x-ctxproxy-window-learned"] = str(limit)
    event("learned context window from provider", request_id=ctx.request_id, route=ctx.route.name,
          model=ctx.model, window=limit)
    ctx = dataclasses.replace(ctx, window=limit)
    first, conv = conv, Conversation.parse(conv.raw)
    carry_events(first, conv)  # what the first run stored (offloads, compactions) still counts
    st.memo.recall(ctx.tenant, ctx.session, conv)
    conv = await run_pipeline(st.pipelines[ctx.route.name], conv, ctx)
    _ask_for_usage(conv, ctx)
    return await send(conv.to_bytes()), conv, ctx


async def _relay_sse(chunks: AsyncIterator[bytes], status: int, log: dict, t0: float,
                     done: Callable[..., None]) -> AsyncIterator[bytes]:
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
    except StreamCutShort as cut:
        err = UpstreamUnreachable(f"upstream stream ended early: {cut}", code="upstream_stream_cut")
        status, error = err.status, err.code
        yield b"data: " + err.body() + b"\n\n"
    except Exception as exc:  # a proxy bug: the headers are out, so say it in the stream rather than cut it
        logger.error("unexpected error in a stream", exc_info=exc,
                     extra={"fields": {"request_id": log.get("request_id")}})
        status, error = 500, "internal_error"
        yield b"data: " + error_body("internal proxy error; see the proxy log", "proxy_error", error) + b"\n\n"
    finally:
        if first is not None:
            log["ttfb_ms"] = round((first - t0) * 1000, 3)
        done(status, error, bytes_out=sent)


def _finish(log: dict, t0: float, **fields: object) -> None:
    log.update({k: v for k, v in fields.items() if v is not None})
    log["total_ms"] = round((time.perf_counter() - t0) * 1000, 3)
    event("request", **log)
