"""The request path of every API with a codec (chat, responses, messages), top to bottom.

parse → route/session → shape → send (overflow retry) → read-back loop → relay → account.
Each step is a call into its own module; `handle` only sequences them. The
accountant is asked once per request (`open`), and its ledger closed once.
Traced (proxy/telemetry/), the request is one SERVER span current while the
steps run, ended with the request's log line (a stream's: when it has ended).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response

from proxy.accounting.ledger import Ledger, Outcome
from proxy.accounting.report import event_fields
from proxy.errors import ProxyError
from proxy.http.relay import error_response, relay_response, relay_stream
from proxy.http.request_run import RequestRun, StreamEnd, context, parse, stream_events
from proxy.http.send import Sent, send_upstream
from proxy.request import Conversation, RequestContext
from proxy.rewrite.context_read.loop import ReadLoop
from proxy.rewrite.pipeline import response_loop, shape
from proxy.state import ProxyState, state_of
from proxy.upstream.client import iter_raw, read_answer, response_headers
from proxy.wire.codec import Codec
from proxy.wire.usage import Usage

SSE = "text/event-stream"


async def handle(request: Request, wire: Codec) -> Response:
    st, run = state_of(request), RequestRun.start(request, wire)
    if not st.tracing.on:
        return await _handle(st, request, wire, run)
    run.trace = st.tracing.request(request.method, request.scope["path"], request.headers.items(), wire.family,
                                   transport=request.scope.get("ctxproxy.transport", "http"))
    with run.trace.activate():  # the request's span is its stages' parent; it ends with the request (finish)
        return await _handle(st, request, wire, run)


async def _handle(st: ProxyState, request: Request, wire: Codec, run: RequestRun) -> Response:
    try:
        conv = await parse(st, request, wire, run)
        ctx = await context(st, request, conv, run)
        conv = await shape(st.pipelines[ctx.route.name], conv, ctx)
        sent = await send_upstream(st, request, conv, ctx, run, functools.partial(_opened, st, run))
    except ProxyError as err:
        return await run.failed(st, err)
    ledger = sent.early or await _opened(st, run, sent.conv, sent.ctx)
    outcome = ledger.outcome
    outcome.upstream_s, outcome.accepted = sent.answered - run.t_sent, sent.resp.status_code < 300
    run.known.accounted = True  # closed once, however the request ends
    if run.trace.on:
        run.trace.opened(ledger)
    run.headers.update(ledger.headers())
    run.log.update(rewritten=sent.conv.changed, overhead_ms=round(outcome.overhead_s * 1000, 3),
                   upstream_headers_ms=round(outcome.upstream_s * 1000, 3), **event_fields(sent.conv))
    loop = response_loop(st.pipelines[sent.ctx.route.name], sent.conv, sent.ctx, sent.send, sent.url)
    ledger.rounds = loop
    if sent.resp.headers.get("content-type", "").startswith(SSE):
        return _streamed(sent, ledger, run, wire, loop)
    return await _whole(sent, ledger, run, wire, loop)


async def _opened(st: ProxyState, run: RequestRun, conv: Conversation, ctx: RequestContext) -> Ledger:
    """The request as sent remembered for the session's next turn and its ledger opened: done while the provider
    answers (proxy/http/send.py), it adds nothing to the client's wait."""
    await st.memo.remember(ctx.tenant, ctx.session, conv)
    return await st.accounting.open(ctx, conv, Outcome(overhead_s=run.t_sent - run.t0, own=list(ctx.own_calls.made)))


def _streamed(sent: Sent, ledger: Ledger, run: RequestRun, wire: Codec, loop: ReadLoop | None) -> Response:
    """Relayed chunk by chunk as it arrives; however the stream ends, the ledger is closed once with how."""
    resp = sent.resp
    chunks = iter_raw(resp, sent.url) if loop is None else loop.stream(resp)
    if run.trace.on:
        chunks = run.trace.within(chunks)

    def on_usage(usage: Usage) -> None:
        ledger.outcome.usage = usage

    async def relay() -> AsyncIterator[bytes]:
        end = StreamEnd(resp.status_code)
        size = 0
        try:
            watched = wire.watch_stream(chunks, on_usage, sent.conv.usage_hidden)
            async for chunk in stream_events(watched, end, run, wire):
                size += len(chunk)
                yield chunk
        finally:
            run.finish(ledger.close(end.status, end.error), status=end.status, error=end.error, bytes_out=size)

    return relay_stream(relay(), resp.status_code, response_headers(resp.headers, decoded=True), run.headers)


async def _whole(sent: Sent, ledger: Ledger, run: RequestRun, wire: Codec, loop: ReadLoop | None) -> Response:
    """Read whole (the hidden rounds answered first), then relayed with its usage accounted."""
    resp = sent.resp
    try:
        if loop is None:
            content = await read_answer(resp, sent.url)
        else:
            resp, content = await loop.complete(resp)
            run.headers["x-ctxproxy-read-rounds"] = str(loop.done)
            cacheable = ledger.cacheable(resp.status_code)
            if loop.done and cacheable is not None:  # the hidden calls' too, as the usage the client gets
                run.headers["x-ctxproxy-cacheable-tokens"] = str(cacheable)
    except ProxyError as err:
        run.finish(ledger.close(err.status, err.code), status=err.status, error=err.code)
        return error_response(err, wire, run.headers)
    status = resp.status_code

    def account() -> None:  # after the body is sent: the client does not wait for the record and the log line
        try:
            if status == 200:
                ledger.outcome.usage = wire.usage_of_reply(content)
        finally:
            run.finish(ledger.close(status), status=status, bytes_out=len(content))

    return relay_response(content, status, response_headers(resp.headers, decoded=True), run.headers, then=account)
